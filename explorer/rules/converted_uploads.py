"""Uploads converted on arrival: a host tensor copied to the device in one dtype and at
once converted there to a narrower one (`torch.from_numpy(a).to("neuron").float()`: NumPy
makes float64). The copy moves twice the bytes the model uses and the device runs a
conversion kernel, each an op the host issues; converted on the host first
(`.float().to("neuron")`) the copy moves the narrow dtype and nothing is converted.

A conversion is an eager `_to_copy` on the device right after an upload, on the same line,
of the upload's shape and dtype to a dtype of fewer bytes. What converting on the host
saves is the run replayed without the conversions and with each upload's transfer
shortened to the bytes it would move. A CNN fed float64 images lost 4% of each request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.analyses.phases import in_analysed_work
from neuron_explorer.common import trace_format as tf
from neuron_explorer.common.dtypes import dtype_bytes
from neuron_explorer.common.op_key_codec import OpKeyError, decode
from neuron_explorer.device_terms import device_terms
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make, step_time, top, us
from neuron_explorer.what_if.counterfactual import op_kernel_rows, removal_saving_ns

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "converted_uploads"


def _key(name: str, shapes: str, dtypes: str, text: str) -> tuple[list, str, str]:
    """(output shape, output dtype, direction) of a copy's op key; empty where unknown."""
    try:
        _, _, outputs, attrs = decode(name, shapes, dtypes, text)
    except OpKeyError:
        return [], "", ""
    if not outputs:
        return [], "", ""
    (shape, dtype), direction = outputs[0], dict(attrs).get("direction", "")
    return list(shape), dtype, str(direction)


def conversions(trace: Trace) -> pd.DataFrame:
    """The analysed steps' conversions of fresh uploads: one row per conversion, with the
    upload's op `upload_id`, `wide` and `narrow` dtypes and their byte ratio `ratio`."""
    ops = in_analysed_work(trace, trace.ops)
    copies = ops[ops["name"].astype(str) == "aten::_to_copy"].sort_values("op_id")
    if len(copies) < 2:
        return copies.iloc[:0]
    texts = trace.slice_args.texts(tf.ARG_OP_KEY, copies["id"].to_numpy(np.int64)).tolist()
    sigs = list(zip(copies["shapes"].astype(str), copies["dtypes"].astype(str), texts,
                    strict=True))
    parsed = {sig: _key("aten::_to_copy", *sig) for sig in dict.fromkeys(sigs)}  # a few
    keys = [parsed[sig] for sig in sigs]
    rows = []
    previous = None
    for r, (shape, dtype, direction) in zip(copies.itertuples(), keys, strict=True):
        if (previous is not None and direction == "device_to_device"
                and previous[1][2] == "host_to_device" and r.op_id == previous[0].op_id + 1
                and r.source == previous[0].source and shape == previous[1][0]):
            wide, narrow = previous[1][1], dtype
            if 0 < dtype_bytes(narrow) < dtype_bytes(wide):
                rows.append({"id": r.id, "ts": r.ts, "dur": r.dur, "step": r.step,
                             "device_dur": r.device_dur, "source": r.source,
                             "upload_id": previous[0].id, "wide": wide, "narrow": narrow,
                             "ratio": dtype_bytes(narrow) / dtype_bytes(wide)})
        previous = (r, (shape, dtype, direction))
    return pd.DataFrame(rows)


def _tensors(n: int) -> str:
    return "1 host tensor is" if n == 1 else f"{n} host tensors are"


def check(trace: Trace) -> list[Finding]:
    found = conversions(trace)
    if not len(found):
        return []
    rows = op_kernel_rows(trace)
    kernel_dur = trace.kernels["dur"].to_numpy(np.int64)
    lengths = {row: int(kernel_dur[row] * ratio)
               for upload, ratio in zip(found["upload_id"], found["ratio"], strict=True)
               for row in rows.get(int(upload), [])}
    saving = removal_saving_ns(trace, found["id"].to_numpy(np.int64), RULE_ID, lengths)
    if saving is None or saving < th.CONVERTED_UPLOADS_MIN_SHARE * step_time(trace):
        return []
    wide, narrow = found[["wide", "narrow"]].astype(str).mode().iloc[0]
    where = str(found["source"].astype(str).mode().iloc[0])
    device = device_terms(trace.metadata).name
    n_steps = max(int(found["step"].nunique()), 1)
    items = [evidence(r.ts, r.dur, [r.id], f"{r.wide} -> {r.narrow} at {r.source}: "
                      f"{us(r.dur)} on the host, {us(r.device_dur)} on the device")
             for r in top(found, "dur").itertuples()]
    return [make(
        trace, RULE_ID, f"Uploads converted on the device ({wide} -> {narrow})", saving, items,
        f"{_tensors(len(found) // n_steps)} a step copied to the device in {wide} and "
        f"converted there to {narrow}{f' at {where}' if where else ''}: the copy moves "
        f"{1 / float(found['ratio'].iloc[0]):g}x the bytes the model uses, and each conversion "
        f"is an op the host issues and a kernel the device runs ({us(found['dur'].sum())} of "
        f"host op time and {us(found['device_dur'].sum())} of device time in all).",
        f"Convert on the host before the copy{f' at {where}' if where else ''}: "
        f"x.to(torch.{narrow}).to('{device}') rather than x.to('{device}').to(torch.{narrow})"
        + (" (NumPy arrays are float64: torch.from_numpy(a.astype(np.float32)))"
           if wide == "float64" else "") + ".",
        symptom_ns=float(found["dur"].sum() + found["device_dur"].sum()),
        saving_basis="replay: the run replayed without the conversions, each upload's "
                     "transfer shortened to the bytes of the narrow dtype")]
