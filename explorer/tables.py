"""Derived tables: steps, ops, kernels, instructions and modules from the loaded slices.

Every trace carries the details in our slice args (docs/trace-format.md): the loaders map
other formats' args onto ours (`loaders/kineto.py`), so the tables never ask where a trace
came from. Ops are the outermost op slices; a kernel links to its op by `op_id`, or, where
it names none, through the runtime call that launched it (same `kernel_id`, Kineto's
`correlation`) and the outermost op around that call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from neuron_explorer.common import trace_format as tf
from neuron_explorer.loaders.args import categorical
from neuron_explorer.memo import memoised

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

STEP_COLUMNS = ["step", "ts", "dur", "id", "track_id"]
OP_COLUMNS = ["id", "ts", "dur", "name", "op_id", "kernel_id", "device_dur", "flops", "bytes",
              "shapes", "dtypes", "module", "source", "fallback", "step", "device", "graph_id",
              "kernel_count", "track_id"]
KERNEL_COLUMNS = ["id", "ts", "dur", "name", "kernel_id", "op_id", "device", "flops", "hw_flops",
                  "bytes", "step", "kind", "fallback", "sbuf_bytes", "psum_bytes", "busy_tensor",
                  "busy_vector", "busy_scalar", "busy_gpsimd", "busy_dma", "op_slice_id"]
INSTRUCTION_COLUMNS = ["id", "ts", "dur", "engine", "opcode", "bytes", "flops", "kernel_id",
                       "device", "kind"]
MODULE_COLUMNS = ["id", "ts", "dur", "module", "phase", "depth", "step"]
DEVICE_KINDS = ("kernel", "memcpy", "memset")
_STEP_IN_NAME = re.compile(r"(\d+)\s*$")


def empty(columns: list[str]) -> pd.DataFrame:
    """An empty table with the given columns."""
    return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})


def num(values: np.ndarray, default: float = 0, dtype: str = "int64") -> np.ndarray:
    """Object values to numbers (default where missing or not a number)."""
    out = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").fillna(default)
    return out.to_numpy().astype(dtype)


def text(values: np.ndarray) -> np.ndarray:
    """Object values to strings ('' where missing)."""
    return np.asarray(["" if v is None else str(v) for v in values.tolist()], dtype=object)


def flag(values: np.ndarray) -> np.ndarray:
    """Object values to bools (true, 1, 'true')."""
    return map_unique(values, lambda v: v is True or v == 1 or str(v).lower() == "true", bool)


def number(trace: Trace, key: str, ids: np.ndarray, default: float = 0,
           dtype: str = "int64") -> np.ndarray:
    """Arg `key` of the given slices as numbers (default where missing or not a number)."""
    return trace.slice_args.numbers(key, ids, default, dtype)


def map_unique(values: pd.Series | np.ndarray, function: Callable[[Any], Any],
               dtype: type = object) -> np.ndarray:
    """`function` of each value, called once per distinct value (columns repeat a few names);
    None and the other missing markers (NaN) are passed on as they are."""
    if isinstance(getattr(values, "dtype", None), pd.CategoricalDtype):
        return _map_categories(pd.Categorical(values), function, dtype)
    array = np.asarray(values, dtype=object)
    codes, uniques = pd.factorize(array)
    # one slot per distinct value, then one for missing values (code -1), set below
    results: np.ndarray = np.empty(len(uniques) + 1, dtype=dtype)
    results[: len(uniques)] = [function(u) for u in uniques.tolist()]
    out = results[codes]
    missing = np.flatnonzero(codes < 0)
    if len(missing):
        none = np.equal(array[missing], None).astype(bool)  # type: ignore[call-overload]
        for part in (missing[none], missing[~none]):
            if len(part):
                out[part] = function(array[part[0]])
    return out


def _map_categories(values: pd.Categorical, function: Callable[[Any], Any],
                    dtype: type) -> np.ndarray:
    """`map_unique` of a categorical: from its codes, no object per row. `function` sees
    the categories in use, and NaN for the missing values, as the object path does."""
    codes = np.asarray(values.codes, np.int64)
    categories = values.categories
    used = np.flatnonzero(np.bincount(codes[codes >= 0], minlength=len(categories)))
    results: np.ndarray = np.empty(len(categories) + 1, dtype=dtype)
    results[used] = [function(c) for c in categories[used].tolist()]
    if (codes < 0).any():
        results[-1] = function(np.nan)
    return results[codes]


class SliceNames:
    """Slices' names by slice id (an id or an array of ids), None where a slice has none:
    the names asked for only. A name per slice made at once took 152 MiB of a 20 M-slice
    trace for the few a report's rules look up; the categorical's codes index its
    distinct names instead."""

    def __init__(self, codes: np.ndarray, distinct: np.ndarray) -> None:
        self._codes = codes
        self._distinct = np.empty(len(distinct) + 1, object)
        self._distinct[:-1] = distinct  # then None: what code -1 (no name) reads

    def __getitem__(self, ids: Any) -> Any:
        return self._distinct[self._codes[ids]]

    def __len__(self) -> int:
        return len(self._codes)


def slice_names(trace: Trace) -> SliceNames:
    """Every slice's name, by id (`SliceNames`), made once per trace. The column is a
    categorical over Arrow strings: converted whole it makes a string per row, and a
    replay that converted it per optimizer step spent 13 s of a 2 M-slice report there."""
    def make() -> SliceNames:
        names = trace.table("slices")["name"]
        if not isinstance(names.dtype, pd.CategoricalDtype):
            return SliceNames(np.arange(len(names)), names.to_numpy(dtype=object))
        codes = names.cat.codes.to_numpy()
        return SliceNames(codes, np.asarray(names.cat.categories, dtype=object))
    return memoised(trace, "slice_names", make)


def kind_codes(trace: Trace) -> tuple[np.ndarray, Any]:
    """Each slice's kind as a code into the distinct kinds (-1: none): the categorical's
    own codes (a byte a slice), else factorised once per trace."""
    def make() -> tuple[np.ndarray, Any]:
        kinds = trace.table("slices")["kind"]
        if isinstance(kinds.dtype, pd.CategoricalDtype):
            return kinds.cat.codes.to_numpy(), kinds.cat.categories
        return pd.factorize(kinds.array)

    return memoised(trace, "slice_kind_codes", make)


def kind_mask(trace: Trace, kinds: tuple[str, ...]) -> np.ndarray:
    """Which slices have one of `kinds` (kinds are factorised once per trace)."""
    codes, uniques = kind_codes(trace)
    wanted = np.flatnonzero(np.isin(np.asarray(uniques, dtype=object), list(kinds)))
    if len(wanted) == 1:
        return codes == wanted[0]
    return np.isin(codes, wanted)


def of_kind(trace: Trace, *kinds: str) -> pd.DataFrame:
    """Slices (without args) of the given kinds."""
    return trace.table("slices")[kind_mask(trace, kinds)]


def _recorded_steps(trace: Trace, step: np.ndarray) -> np.ndarray:
    """Step numbers from args, with -1 for numbers that name no recorded step (device work
    launched after the last step mark carries the number of a step that never began)."""
    if len(trace.steps):
        step = np.where(np.isin(step, trace.steps["step"].to_numpy()), step, -1)
    return step


def assign_steps(ts: np.ndarray, steps: pd.DataFrame) -> np.ndarray:
    """Step number whose host range holds each time (-1: outside every step)."""
    if not len(steps) or not len(ts):
        return np.full(len(ts), -1, np.int64)
    st = steps.sort_values("ts")
    starts = st["ts"].to_numpy(np.int64)
    ends = starts + st["dur"].to_numpy(np.int64)
    i = np.searchsorted(starts, ts, side="right") - 1
    ok = (i >= 0) & (ts < ends[np.maximum(i, 0)])
    return np.where(ok, st["step"].to_numpy(np.int64)[np.maximum(i, 0)], -1)


def ancestor_of_kind(trace: Trace, ids: np.ndarray, kinds: tuple[str, ...],
                     outermost: bool = False) -> np.ndarray:
    """Nearest (or outermost) ancestor of each slice whose kind is in `kinds` (-1: none)."""
    return ancestor_in(trace, ids, kind_mask(trace, kinds), outermost)


def op_named(trace: Trace, names: Collection[str]) -> np.ndarray:
    """Which slices are ops named one of `names`."""
    return (kind_mask(trace, ("op",))
            & map_unique(trace.table("slices")["name"], lambda n: n in names, bool))


def ancestor_in(trace: Trace, ids: np.ndarray, match: np.ndarray,
                outermost: bool = False) -> np.ndarray:
    """Nearest (or outermost) ancestor of each slice that `match` (one flag per slice)
    holds (-1: none)."""
    parent = trace.table("slices")["parent_id"].to_numpy()
    found = np.full(len(ids), -1, np.int64)
    cur = parent[ids] if len(ids) else np.zeros(0, np.int64)
    for _ in range(256):
        live = cur >= 0
        if not live.any():
            break
        hit = live & match[np.maximum(cur, 0)]
        found = np.where(hit if outermost else hit & (found < 0), cur, found)
        cur = np.where(live, parent[np.maximum(cur, 0)], -1)
    return found


def innermost_in(parent: np.ndarray, mask: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The nearest of each slice in `ids` and its ancestors (`parent`: each slice's parent
    id) that `mask` holds, the slice itself first (-1: none)."""
    found = np.full(len(ids), -1, np.int64)
    cur = np.asarray(ids, np.int64)
    while (live := (cur >= 0) & (found < 0)).any():
        hit = live & mask[np.maximum(cur, 0)]
        found[hit] = cur[hit]
        cur = np.where(live & ~hit, parent[np.maximum(cur, 0)], -1)
    return found


def derive_steps(trace: Trace) -> pd.DataFrame:
    s = of_kind(trace, "step")
    if not len(s):
        return empty(STEP_COLUMNS).astype("int64")
    ids = s["id"].to_numpy()
    step = number(trace, tf.ARG_STEP, ids, default=-1)
    missing = step < 0
    if missing.any():
        names = slice_names(trace)[ids[missing]]
        parsed = [int(m.group(1)) if (m := _STEP_IN_NAME.search(str(n))) else -1 for n in names]
        step[missing] = parsed
    if (step < 0).any():  # numbers nowhere to be found: count in time order
        step = np.arange(len(s))
    frame = pd.DataFrame({"step": step, "ts": s["ts"].to_numpy(), "dur": s["dur"].to_numpy(),
                          "id": ids, "track_id": s["track_id"].to_numpy()})
    frame = _unique_steps(frame.sort_values("ts", ignore_index=True))
    _hold_window_start(trace, frame)
    return frame


def _hold_window_start(trace: Trace, steps: pd.DataFrame) -> None:
    """The first step of a `--steps START:STOP` window (START > 0) holds every op recorded
    with its number: nothing of the program was recorded before it, so an op dated before
    its slice began is its own, and the window must not cut it off."""
    window = trace.metadata.get("steps")
    if not isinstance(window, list) or not window or not window[0] or not len(steps):
        return
    ops = of_kind(trace, tf.CAT_OP)
    if not len(ops):
        return
    first = steps.iloc[0]
    ts = ops["ts"].to_numpy(np.int64)
    early = ts < int(first["ts"])
    if not early.any():
        return
    own = number(trace, tf.ARG_STEP, ops["id"].to_numpy()[early], default=-1) == first["step"]
    if own.any():
        start = int(ts[early][own].min())
        steps.loc[0, "dur"] = int(first["ts"] + first["dur"] - start)
        steps.loc[0, "ts"] = start


def _unique_steps(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per step number (analyses index by it). The same number on several tracks
    (processes in one file) is one step spanning them; a number repeated on one track (two
    profiling sessions) numbers every step in time order instead."""
    if not frame["step"].duplicated().any():
        return frame
    if frame.duplicated(["track_id", "step"]).any():
        return frame.assign(step=np.arange(len(frame)))
    end = (frame["ts"] + frame["dur"]).groupby(frame["step"]).max()
    first = frame.groupby("step", sort=False).head(1).set_index("step")  # the earliest
    first["dur"] = end.reindex(first.index).to_numpy() - first["ts"]
    return first.reset_index()[frame.columns].sort_values("ts", ignore_index=True)


def _device_of_tracks(trace: Trace, track_ids: np.ndarray) -> np.ndarray:
    """Each slice's device, by its track's (-1 where the track names none)."""
    return _by_track(trace, track_ids, trace.tracks["device"].fillna(-1).to_numpy(np.int64),
                     np.int64(-1))


def _by_track(trace: Trace, track_ids: np.ndarray, values: np.ndarray, missing: Any
              ) -> np.ndarray:
    """`values` (one per row of `trace.tracks`) of each track id, `missing` for ids of no
    track: a lookup in the few tracks, not a frame over millions of slices (an index
    reindexed took four copies of a 16 M-instruction column)."""
    known = trace.tracks["track_id"].to_numpy(np.int64)
    if not len(known):
        return np.full(len(track_ids), missing)
    order = np.argsort(known, kind="stable")
    known, values = known[order], np.append(values[order], missing)
    at = np.searchsorted(known, track_ids)
    at[(at >= len(known)) | (known[np.minimum(at, len(known) - 1)] != track_ids)] = len(known)
    return values[at]


def derive_kernels(trace: Trace) -> pd.DataFrame:
    s = of_kind(trace, *DEVICE_KINDS)
    if not len(s):
        return empty(KERNEL_COLUMNS)
    ids = s["id"].to_numpy()
    args = trace.slice_args.narrowed(_KERNEL_ARGS, ids)
    out = pd.DataFrame({"id": ids, "ts": s["ts"].to_numpy(), "dur": s["dur"].to_numpy(),
                        "name": s["name"].array})  # str columns kept in Arrow
    device = args.numbers(tf.ARG_DEVICE, ids, default=-1)
    track_dev = _device_of_tracks(trace, s["track_id"].to_numpy())
    out["device"] = np.where(track_dev >= 0, track_dev, device)
    out["kind"] = s["kind"].array
    out["fallback"] = flag(args.column(tf.ARG_FALLBACK, ids))
    out["sbuf_bytes"] = args.numbers(tf.ARG_SBUF, ids)
    out["psum_bytes"] = args.numbers(tf.ARG_PSUM, ids)
    busy = {e: np.zeros(len(s), np.int64) for e in (*tf.ENGINES, tf.ENGINE_DMA)}
    busy_args = args.column(tf.ARG_ENGINE_BUSY, ids)
    present = np.flatnonzero(np.not_equal(busy_args, None))  # type: ignore[call-overload]  # often none: skip the loop
    for i, raw in zip(present.tolist(), busy_args[present].tolist(), strict=True):
        if raw:
            try:
                parsed = raw if isinstance(raw, dict) else json.loads(raw)
            except ValueError:
                continue
            for engine, ns in parsed.items():
                key = "dma" if str(engine).startswith("dma") else str(engine)
                if key in busy:
                    busy[key][i] += int(ns)
    for e, v in busy.items():
        out[f"busy_{e}"] = v
    out["kernel_id"] = args.numbers(tf.ARG_KERNEL_ID, ids, default=-1)
    out["op_id"] = args.numbers(tf.ARG_OP_ID, ids, default=-1)
    out["flops"] = args.numbers(tf.ARG_FLOPS, ids)
    hw = args.numbers(tf.ARG_HW_FLOPS, ids, default=-1)
    out["hw_flops"] = np.where(hw >= 0, hw, out["flops"].to_numpy())
    out["bytes"] = args.numbers(tf.ARG_BYTES, ids)
    step = _recorded_steps(trace, args.numbers(tf.ARG_STEP, ids, default=-1))
    del args
    op_s = of_kind(trace, "op")["id"].to_numpy()
    by_op = pd.Series(op_s, index=number(trace, tf.ARG_OP_ID, op_s, default=-1))
    by_op = by_op[(by_op.index >= 0) & ~by_op.index.duplicated()]
    op_slice = by_op.reindex(out["op_id"].to_numpy()).fillna(-1).to_numpy(np.int64)
    # No op named: the op around the runtime call that launched the kernel, if any
    call = launch_calls(trace, out["kernel_id"].to_numpy())
    via_call = (op_slice < 0) & (call >= 0)
    if via_call.any():
        op_slice[via_call] = ancestor_of_kind(trace, call[via_call], ("op",), outermost=True)
        linked = via_call & (op_slice >= 0)
        op_id = number(trace, tf.ARG_OP_ID, op_slice[linked], default=-1)
        out.loc[linked, "op_id"] = np.where(op_id >= 0, op_id, op_slice[linked])
    out["op_slice_id"] = op_slice
    # No step recorded: the step the kernel was launched in, else the one it ran in
    ts = out["ts"].to_numpy()
    s_ts = trace.table("slices")["ts"].to_numpy()
    launched = np.where(call >= 0, s_ts[np.maximum(call, 0)], ts)
    for when in (launched, ts) if (call >= 0).any() else (ts,):
        missing = step < 0
        if missing.any():
            step[missing] = assign_steps(when[missing], trace.steps)
    out["step"] = step
    return out[KERNEL_COLUMNS].sort_values("ts", ignore_index=True)


_KERNEL_ARGS = (tf.ARG_DEVICE, tf.ARG_FALLBACK, tf.ARG_SBUF, tf.ARG_PSUM, tf.ARG_ENGINE_BUSY,
                tf.ARG_KERNEL_ID, tf.ARG_OP_ID, tf.ARG_FLOPS, tf.ARG_HW_FLOPS, tf.ARG_BYTES,
                tf.ARG_STEP)


def kernel_launches(trace: Trace) -> np.ndarray:
    """Per row of `trace.kernels`: the slice that launched it: its op in our recordings,
    the runtime call sharing its correlation id in a PyTorch-profiler trace; -1 where the
    trace does not hold it."""
    from neuron_explorer.device_terms import device_terms

    k = trace.kernels
    if device_terms(trace.metadata).recorded_here:
        return k["op_slice_id"].to_numpy(np.int64)
    return launch_calls(trace, k["kernel_id"].to_numpy(np.int64))


def launch_calls(trace: Trace, kernel_ids: np.ndarray) -> np.ndarray:
    """Slice id of the runtime call (or sync) that launched each kernel id, where the trace
    holds such calls (PyTorch-profiler traces: the call shares the kernel's correlation id,
    our `kernel_id`); -1 elsewhere."""
    calls = of_kind(trace, "runtime", "sync")["id"].to_numpy()
    found = np.full(len(kernel_ids), -1, np.int64)
    if not len(calls) or not len(kernel_ids):
        return found
    by_id = pd.Series(calls, index=number(trace, tf.ARG_KERNEL_ID, calls, default=-1))
    by_id = by_id[(by_id.index >= 0) & ~by_id.index.duplicated()]
    if len(by_id):
        found = by_id.reindex(kernel_ids).fillna(-1).to_numpy(np.int64)
    return found


def nested_ops(trace: Trace, op_ids: np.ndarray) -> np.ndarray:
    """Which of the op slices `op_ids` run inside another op: only outermost op slices are
    ops (a PyTorch-profiler trace records the ops an op calls too; ours record none)."""
    return ancestor_of_kind(trace, op_ids, ("op",)) >= 0


def derive_ops(trace: Trace) -> pd.DataFrame:
    s = of_kind(trace, "op")
    s = s[~nested_ops(trace, s["id"].to_numpy())]
    if not len(s):
        return empty(OP_COLUMNS)
    ids = s["id"].to_numpy()
    args = trace.slice_args.narrowed(_OP_ARGS, ids)
    out = pd.DataFrame({"id": ids, "ts": s["ts"].to_numpy(), "dur": s["dur"].to_numpy(),
                        "name": s["name"].array, "track_id": s["track_id"].to_numpy()})
    out["op_id"] = args.numbers(tf.ARG_OP_ID, ids, default=-1)
    out["kernel_id"] = args.numbers(tf.ARG_KERNEL_ID, ids, default=-1)
    out["flops"] = args.numbers(tf.ARG_FLOPS, ids)
    out["bytes"] = args.numbers(tf.ARG_BYTES, ids)
    for key in (tf.ARG_SHAPES, tf.ARG_DTYPES, tf.ARG_MODULE, tf.ARG_SOURCE):
        out[key] = args.text_column(key, ids)
    out["fallback"] = flag(args.column(tf.ARG_FALLBACK, ids))
    out["step"] = args.numbers(tf.ARG_STEP, ids, default=-1)
    out["device"] = args.numbers(tf.ARG_DEVICE, ids, default=-1)
    out["graph_id"] = args.numbers(tf.ARG_GRAPH_ID, ids, default=-1)
    if len(trace.steps):
        # Host ops belong to the step whose range holds them: setup before the first step
        # and code after the last one carry a step number but are in no step.
        out["step"] = assign_steps(out["ts"].to_numpy(), trace.steps)
    out["device_dur"] = 0
    out["kernel_count"] = 0
    k = trace.kernels
    if len(k):
        linked = k[k["op_slice_id"] >= 0]
        agg = linked.groupby("op_slice_id").agg(device_dur=("dur", "sum"), n=("dur", "size"))
        out["device_dur"] = agg["device_dur"].reindex(ids).fillna(0).to_numpy(np.int64)
        out["kernel_count"] = agg["n"].reindex(ids).fillna(0).to_numpy(np.int64)
        unnamed = out["kernel_id"].to_numpy() < 0
        if unnamed.any():  # no kernel id recorded on the op: its first kernel's
            first = linked.sort_values("ts").groupby("op_slice_id")["kernel_id"].first()
            found = first.reindex(ids[unnamed]).fillna(-1).to_numpy(np.int64)
            out.loc[unnamed, "kernel_id"] = found
    return out[OP_COLUMNS].sort_values("ts", ignore_index=True)


_OP_ARGS = (tf.ARG_OP_ID, tf.ARG_KERNEL_ID, tf.ARG_FLOPS, tf.ARG_BYTES, tf.ARG_SHAPES,
            tf.ARG_DTYPES, tf.ARG_MODULE, tf.ARG_SOURCE, tf.ARG_FALLBACK, tf.ARG_STEP,
            tf.ARG_DEVICE, tf.ARG_GRAPH_ID)


def derive_instructions(trace: Trace) -> pd.DataFrame:
    # the most numerous slices: the columns used are taken row by row, no frame of them
    # all first, and put in time order column by column, no sorted copy of the frame
    rows = np.flatnonzero(kind_mask(trace, (tf.CAT_INSTRUCTION, tf.CAT_DMA)))
    if not len(rows):
        return empty(INSTRUCTION_COLUMNS)
    slices = trace.table("slices")
    ts = slices["ts"].to_numpy()[rows]
    if len(ts) > 1 and (ts[1:] < ts[:-1]).any():  # the slices' own order is by time, as a rule
        rows = rows[np.argsort(ts, kind="stable")]
        ts = slices["ts"].to_numpy()[rows]
    ids = slices["id"].to_numpy()[rows]
    dur = slices["dur"].to_numpy()[rows]
    kind = slices["kind"].array[rows]
    names = slices["name"].array
    name_codes = names.codes[rows]  # a byte or two a row: the rows' index is let go
    track = slices["track_id"].to_numpy()[rows]
    device = _device_of_tracks(trace, track)
    # each row's track as its row in trace.tracks (the last: no such track), small
    by_name = {v: k for k, v in tf.ENGINE_TRACKS.items()}
    named = [by_name.get(name) for name in trace.tracks["name"].tolist()]
    n = len(named)
    track_row = _by_track(trace, track, np.arange(n, dtype=np.int32), np.int32(n))
    del rows, track  # 8 bytes a row each, held through the args' reads otherwise
    engine, engines, opcode, opcodes, numbers = _instruction_args(trace, ids)
    missing = _selected(_blank(engine, engines))
    if missing is not None:  # no engine arg: the engine its track is named after, else a
        # DMA's "dma": a code per track and DMA or not (the tracks are few); then the same
        # for DMA rows; the last of each: no such track
        values = [*(e or "" for e in named), "", *(e or "dma" for e in named), "dma"]
        at = track_row[missing]
        at[np.asarray(kind[missing] == tf.CAT_DMA, bool)] += n + 1
        engine[missing] = at + len(engines)
        engines = [*engines, *values]
    del track_row
    no_opcode = _selected(_blank(opcode, opcodes))
    if no_opcode is not None:  # the slice's name instead (a missing name stays missing)
        fill = name_codes[no_opcode].astype(np.int32)
        opcode[no_opcode] = np.where(fill >= 0, fill + len(opcodes), -1)
        opcodes = [*opcodes, *names.categories.tolist()]
    del name_codes
    frame = {"id": ids, "ts": ts, "dur": dur}
    # a few engines and opcodes over many rows: categorical, as the slices' texts (each
    # made and its codes let go in turn)
    frame["engine"] = categorical(engine, engines)
    del engine
    frame["opcode"] = categorical(opcode, opcodes)
    del opcode
    return pd.DataFrame({
        **frame, "bytes": numbers[tf.ARG_BYTES], "flops": numbers[tf.ARG_FLOPS],
        "kernel_id": numbers[tf.ARG_KERNEL_ID], "device": device, "kind": kind,
    }, copy=False)  # fresh columns: no copy into one consolidated block (450 MB at 8 M rows)


# args rows of the file one part of the instructions' reads holds: at 20 M slices, their
# 32 M args rows read at once peaked 2 GB above the table being built
INSTRUCTION_ARGS_PER_READ = 1 << 21


def _instruction_args(trace: Trace, ids: np.ndarray
                      ) -> tuple[np.ndarray, list[str], np.ndarray, list[str],
                                 dict[str, np.ndarray]]:
    """The instructions' (distinct slice ids) engine and opcode args as codes into their
    distinct texts ('' for none), and their bytes, flops and kernel ids, the args read a
    part at a time (`SliceArgs.in_parts`)."""
    # where each part's slices sit among `ids`: in time order, ids mostly rise already
    ordered = len(ids) < 2 or bool((ids[1:] > ids[:-1]).all())
    order = None if ordered else np.argsort(ids, kind="stable")
    sorted_ids = ids if order is None else ids[order]
    texts: dict[str, tuple[dict[str, int], np.ndarray]] = {
        key: ({"": 0}, np.zeros(len(ids), np.int32)) for key in (tf.ARG_ENGINE, tf.ARG_OPCODE)}
    defaults = {tf.ARG_BYTES: 0, tf.ARG_FLOPS: 0, tf.ARG_KERNEL_ID: -1}
    numbers = {key: np.full(len(ids), default, np.int64) for key, default in defaults.items()}
    found = {key: np.zeros(len(ids), bool) for key in (*texts, *defaults)}
    parts = trace.slice_args.in_parts(found.keys(), ids, INSTRUCTION_ARGS_PER_READ)
    for args, held in parts:
        for key, seen in found.items():
            if held is None:  # args that answer for every slice: no lookups
                has, at = ids, slice(None)
            else:
                has = held[args.holding(key, held)]
                at = np.searchsorted(sorted_ids, has)
                at = at if order is None else order[at]
                first = ~seen[at]  # a key in two parts: the first part's
                has, at = has[first], at[first]
                seen[at] = True
            if key in texts:
                # text columns stay codes into distinct values, fallbacks included, until
                # categorical; a part's codes renumbered into those of every part
                code_of, out = texts[key]
                codes, values = args.text_codes(key, has)
                renumber = np.asarray([code_of.setdefault(v, len(code_of)) for v in values],
                                      np.int32)
                out[at] = renumber[codes]
            else:
                numbers[key][at] = args.numbers(key, has, default=defaults[key])
    (engine, engines), (opcode, opcodes) = ((out, list(code_of))
                                            for code_of, out in texts.values())
    return engine, engines, opcode, opcodes, numbers


def _selected(mask: np.ndarray) -> np.ndarray | slice | None:
    """The rows a mask selects: None for none, every row as a slice (no index of millions
    of rows, nor copies of the columns through it)."""
    if mask.all():
        return slice(None)
    return np.flatnonzero(mask) if mask.any() else None


def _blank(codes: np.ndarray, values: list[str]) -> np.ndarray:
    """Which rows' text is '' (an absent arg), looked up once per distinct value."""
    return np.asarray([v == "" for v in values] or [False], bool)[codes]


def derive_modules(trace: Trace) -> pd.DataFrame:
    s = of_kind(trace, tf.CAT_MODULE, tf.CAT_BACKWARD)
    if not len(s):
        return empty(MODULE_COLUMNS)
    ids = s["id"].to_numpy()
    module = trace.slice_args.texts(tf.ARG_MODULE, ids)
    names = s["name"].to_numpy()
    module = np.where(module == "", [str(n).removeprefix("nn.Module: ") for n in names], module)
    phase = trace.slice_args.texts(tf.ARG_PHASE, ids)
    phase = np.where(phase == "", np.where(s["category"].to_numpy() == tf.CAT_BACKWARD,
                                           "backward", "forward"), phase)
    out = pd.DataFrame({"id": ids, "ts": s["ts"].to_numpy(), "dur": s["dur"].to_numpy(),
                        "module": module, "phase": phase})
    # depth among modules: how many module slices enclose this one
    depth = np.zeros(len(ids), np.int64)
    cur = ancestor_of_kind(trace, ids, (tf.CAT_MODULE, tf.CAT_BACKWARD))
    while (cur >= 0).any():
        depth += cur >= 0
        nxt = np.full(len(cur), -1, np.int64)
        live = cur >= 0
        nxt[live] = ancestor_of_kind(trace, cur[live], (tf.CAT_MODULE, tf.CAT_BACKWARD))
        cur = nxt
    out["depth"] = depth
    step = number(trace, tf.ARG_STEP, ids, default=-1)
    missing = step < 0
    step[missing] = assign_steps(out["ts"].to_numpy()[missing], trace.steps)
    out["step"] = step
    return out[MODULE_COLUMNS].sort_values("ts", ignore_index=True)
