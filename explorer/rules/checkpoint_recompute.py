"""Activation checkpointing where memory has room: `torch.utils.checkpoint` runs the
forwards it wraps again inside the backward, to hold fewer activations; on a device whose
peak leaves room for those activations, the recompute is time spent for nothing.

The recorder nests a forward run inside the backward in that backward's slice, so the
recomputed modules are the forward module slices with a backward slice above them. What
removing the checkpoints saves is the run replayed without the ops they ran again; what
it costs is the memory of those ops' outputs, kept from the forward to the backward (a
step's worth, on top of the recorded peak). A small stack checkpointed on a device far from
full lost 13% of its steps to recompute, and nothing said so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer import tables
from neuron_explorer.analyses.memory import peak_memory
from neuron_explorer.analyses.phases import in_analysed_work
from neuron_explorer.common import trace_format as tf
from neuron_explorer.common.dtypes import dtype_bytes
from neuron_explorer.common.op_key_codec import OpKeyError, decode
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make, step_time, top, us
from neuron_explorer.rules.memory_near_capacity import capacity
from neuron_explorer.what_if.counterfactual import removal_saving_ns

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "checkpoint_recompute"
MODULES_NAMED = 3


def recomputed(trace: Trace) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the outermost forward module slices run inside a backward, in the analysed steps;
    the ops they ran)."""
    m = trace.modules
    empty = (m.iloc[:0], trace.ops.iloc[:0])
    if not len(m):
        return empty
    forward = in_analysed_work(trace, m[(m["phase"] == "forward") & (m["step"] >= 0)])
    ids = forward["id"].to_numpy(np.int64)
    again = forward[tables.ancestor_of_kind(trace, ids, (tf.CAT_BACKWARD,)) >= 0]
    if not len(again):
        return empty
    inside = np.zeros(len(trace.table("slices")), bool)
    inside[again["id"].to_numpy(np.int64)] = True
    roots = again[tables.ancestor_in(trace, again["id"].to_numpy(np.int64), inside) < 0]
    mask = np.zeros_like(inside)
    mask[roots["id"].to_numpy(np.int64)] = True
    ops = trace.ops
    ran = ops[tables.ancestor_in(trace, ops["id"].to_numpy(np.int64), mask) >= 0]
    return roots, ran


def _output_bytes(trace: Trace, ops: pd.DataFrame) -> np.ndarray:
    """Each op's output bytes, from its op key (0 where it has none)."""
    keys = tables.text(trace.slice_args.column(tf.ARG_OP_KEY, ops["id"].to_numpy(np.int64)))
    out = np.zeros(len(ops), np.float64)
    for i, (name, shapes, dtypes, key) in enumerate(zip(
            ops["name"].astype(str), ops["shapes"].astype(str), ops["dtypes"].astype(str),
            keys, strict=True)):
        if not key:
            continue
        try:
            _, _, outputs, _ = decode(name, shapes, dtypes, key)
        except OpKeyError:
            continue
        out[i] = sum(float(np.prod(shape, dtype=np.float64)) * dtype_bytes(dtype)
                     for shape, dtype in outputs)
    return out


def check(trace: Trace) -> list[Finding]:
    roots, ran = recomputed(trace)
    if not len(ran):
        return []
    starts = roots["ts"].to_numpy(np.int64)
    # the forwards' whole calls go: their ops, and the Python and hooks around them
    saving = removal_saving_ns(trace, ran["id"].to_numpy(np.int64), RULE_ID,
                               host_cut=(starts, starts + roots["dur"].to_numpy(np.int64)))
    if saving is None or saving < th.RECOMPUTE_MIN_SHARE * step_time(trace):
        return []
    # the activations the checkpoints spare: one step's recomputed outputs at once
    kept = float(pd.Series(_output_bytes(trace, ran)).groupby(ran["step"].to_numpy())
                 .sum().max())
    cap = capacity(trace)
    peaks = peak_memory(trace)
    peak = float(peaks["peak_bytes"].max()) if len(peaks) else 0.0
    if cap and peak + kept > th.MEMORY_NEAR_CAPACITY * cap:
        return []  # the checkpoints are what keeps the run within memory
    names = roots["module"].astype(str).value_counts()
    where = ", ".join(names.index[:MODULES_NAMED]) + (
        f" and {len(names) - MODULES_NAMED} more" if len(names) > MODULES_NAMED else "")
    room = (f"peak device memory {peak / 2**30:.2f} GiB of {cap / 2**30:.2f} GiB leaves room "
            f"for them (about {kept / 2**20:.0f} MiB a step)" if cap else
            f"their activations take about {kept / 2**20:.0f} MiB a step")
    items = [evidence(r.ts, r.dur, [r.id], f"{r.module} run again in the backward: "
                      f"{us(r.dur)}") for r in top(roots, "dur").itertuples()]
    return [make(
        trace, RULE_ID, f"Activation checkpointing recomputes {len(names)} modules' forwards",
        saving, items,
        f"torch.utils.checkpoint runs the forward of {where} again inside the backward "
        f"({len(roots)} calls, {len(ran)} ops) to hold fewer activations; {room}.",
        f"Call {where} without torch.utils.checkpoint, or checkpoint fewer of them (every "
        "other block, say): the activations they keep fit, and the backward runs no forward "
        "again. Checkpoint only what memory needs.",
        symptom_ns=float(roots["dur"].sum()),
        saving_basis="replay: the run replayed without the recomputed forwards (their ops, "
                     "and the host's time in those calls; their activations kept from the "
                     "forward, within the memory left)")]
