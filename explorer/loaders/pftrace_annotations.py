"""Debug annotations of a .pftrace, decoded column-wise into a long (slice, key, value) table."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
from neuron_explorer.loaders.wire_scan import Fields, scan_fields

E_ANNOTATION = 4
A_NAME_IID, A_BOOL, A_UINT, A_INT, A_DOUBLE, A_STRING = 1, 2, 3, 4, 5, 6
A_POINTER, A_NESTED, A_JSON, A_NAME, A_DICT, A_ARRAY, A_STRING_IID = 7, 8, 9, 10, 11, 12, 17


def _nested_value(raw: bytes) -> Any:
    """A nested, dict or array annotation as Python values (rare: parsed one by one)."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2

    ann = perfetto_trace_pb2.DebugAnnotation.FromString(raw)

    def value(a: Any) -> Any:
        if a.dict_entries:
            return {e.name: value(e) for e in a.dict_entries}
        if a.array_values:
            return [value(e) for e in a.array_values]
        which = a.WhichOneof("value")
        return getattr(a, which) if which else None

    return value(ann)


def decode_annotations(
    data: bytes,
    buf: np.ndarray,
    ef: Fields,
    slice_of_event: np.ndarray,
    ev_seqgen: np.ndarray,
    state: Any,
    pairs: list[tuple[int, int]],
    resolve: Callable[..., np.ndarray],
) -> pd.DataFrame:
    """Long table slice_id, key, value for every annotation on a slice event."""
    ev, _, length, offset = ef.select(E_ANNOTATION)
    sid = slice_of_event[ev] if len(ev) else np.zeros(0, np.int64)
    keep = sid >= 0
    ev, length, offset, sid = ev[keep], length[keep], offset[keep], sid[keep]
    n = len(ev)
    af = scan_fields(buf, offset, offset + length.astype(np.int64))
    key = np.empty(n, object)
    m, _, v, _ = af.select(A_NAME_IID)
    key[m] = resolve(state, "ann", ev_seqgen[ev[m]], v, pairs)
    m, _, v, o = af.select(A_NAME)
    key[m] = [data[a:a + b].decode("utf-8", "replace") for a, b in zip(o.tolist(), v.tolist(),
                                                                          strict=True)]
    value = np.empty(n, object)
    m, _, v, _ = af.select(A_BOOL)
    value[m] = (v != 0).tolist()
    for field in (A_UINT, A_POINTER):
        m, _, v, _ = af.select(field)
        value[m] = v.tolist()
    m, _, v, _ = af.select(A_INT)
    value[m] = v.view(np.int64).tolist()
    m, _, v, _ = af.select(A_DOUBLE)
    value[m] = v.view(np.float64).tolist()
    for field in (A_STRING, A_JSON):
        m, _, v, o = af.select(field)
        value[m] = [data[a:a + b].decode("utf-8", "replace")
                    for a, b in zip(o.tolist(), v.tolist(), strict=True)]
    m, _, v, _ = af.select(A_STRING_IID)
    value[m] = resolve(state, "str", ev_seqgen[ev[m]], v, pairs)
    nested = np.unique(af.msg[np.isin(af.field, [A_NESTED, A_DICT, A_ARRAY])])
    for i in nested.tolist():
        start = int(offset[i])
        value[i] = _nested_value(data[start:start + int(length[i])])
    key[pd.isna(key)] = "?"
    frame = pd.DataFrame({"slice_id": sid, "key": key, "value": value})
    return frame.sort_values("slice_id", kind="stable", ignore_index=True)
