"""Op, module and kernel statistics: where the time, FLOPs and bytes go, by name.

Rows and shares are of the analysed steps (`steady_state`: no warm-up or compile
steps; the trace's span when it has no steps), so a row's share says how much of a
steady training step it accounts for (without the eval passes recorded in one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.analyses.device_pace import paced_durations
from neuron_explorer.analyses.phases import without_eval
from neuron_explorer.analyses.steady_state import in_analysed_steps
from neuron_explorer.common import trace_format as tf
from neuron_explorer.tables import ancestor_of_kind

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

OP_STAT_COLUMNS = ["name", "count", "host_ns", "device_ns", "mean_device_ns", "flops", "bytes",
                   "fallback_count", "share_of_step"]
MODULE_STAT_COLUMNS = ["module", "phase", "count", "total_ns", "mean_ns", "device_ns", "flops",
                       "bytes", "share_of_step"]
KERNEL_STAT_COLUMNS = ["name", "kind", "count", "total_ns", "mean_ns", "min_ns", "max_ns",
                       "flops", "hw_flops", "bytes", "share_of_step"]


def total_step_ns(trace: Trace) -> float:
    """Total analysed time: the sum of step durations (as long as the run's pace makes
    them: `device_pace`), or the trace's span."""
    return float(paced_durations(trace).sum())


def _share(values: pd.Series, total: float) -> np.ndarray:
    v = values.to_numpy(np.float64)
    return v / total if total > 0 else np.zeros(len(v))


def _empty(columns: list[str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})


def op_stats(trace: Trace) -> pd.DataFrame:
    """Per op name, sorted by device time then host time."""
    ops = without_eval(trace, in_analysed_steps(trace, trace.ops))
    if not len(ops):
        return _empty(OP_STAT_COLUMNS)
    g = ops.groupby("name", sort=False).agg(
        count=("id", "size"), host_ns=("dur", "sum"), device_ns=("device_dur", "sum"),
        flops=("flops", "sum"), bytes=("bytes", "sum"), fallback_count=("fallback", "sum"))
    g["mean_device_ns"] = g["device_ns"] / g["count"]
    g["share_of_step"] = _share(g["device_ns"], total_step_ns(trace))
    g = g.reset_index().sort_values(["device_ns", "host_ns"], ascending=False, ignore_index=True)
    return g[OP_STAT_COLUMNS]


def module_stats(trace: Trace) -> pd.DataFrame:
    """Per module path and phase: time in the module and device time of the ops it ran."""
    mods = without_eval(trace, in_analysed_steps(trace, trace.modules))
    if not len(mods):
        return _empty(MODULE_STAT_COLUMNS)
    g = mods.groupby(["module", "phase"], sort=False).agg(count=("id", "size"),
                                                         total_ns=("dur", "sum"))
    g["mean_ns"] = g["total_ns"] / g["count"]
    sums = _module_op_sums(trace, mods)
    for col in ("device_ns", "flops", "bytes"):
        g[col] = sums[col].reindex(g.index, fill_value=0).astype("int64")
    g["share_of_step"] = _share(g["total_ns"], total_step_ns(trace))
    g = g.reset_index().sort_values("total_ns", ascending=False, ignore_index=True)
    return g[MODULE_STAT_COLUMNS]


def _module_op_sums(trace: Trace, mods: pd.DataFrame) -> pd.DataFrame:
    """Device time, FLOPs and bytes of the ops inside each (module, phase), nested included."""
    ops = trace.ops
    cols = ["device_ns", "flops", "bytes"]
    if not len(ops):
        return pd.DataFrame(columns=cols)
    kinds = (tf.CAT_MODULE, tf.CAT_BACKWARD)
    values = ops[["device_dur", "flops", "bytes"]].to_numpy(np.int64)
    holder = ancestor_of_kind(trace, ops["id"].to_numpy(), kinds)
    parts = []
    while (holder >= 0).any():
        live = holder >= 0
        parts.append(pd.DataFrame(values[live], columns=cols).assign(id=holder[live]))
        nxt = np.full(len(holder), -1, np.int64)
        nxt[live] = ancestor_of_kind(trace, holder[live], kinds)
        holder = nxt
    if not parts:
        return pd.DataFrame(columns=cols)
    per_slice = pd.concat(parts).groupby("id")[cols].sum()
    keyed = mods.set_index("id")[["module", "phase"]].join(per_slice, how="inner")
    return keyed.groupby(["module", "phase"])[cols].sum()


def kernel_stats(trace: Trace) -> pd.DataFrame:
    """Per kernel name (copies and memsets included for PyTorch-profiler traces)."""
    k = without_eval(trace, in_analysed_steps(trace, trace.kernels))
    if not len(k):
        return _empty(KERNEL_STAT_COLUMNS)
    g = k.groupby(["name", "kind"], sort=False).agg(
        count=("id", "size"), total_ns=("dur", "sum"), mean_ns=("dur", "mean"),
        min_ns=("dur", "min"), max_ns=("dur", "max"), flops=("flops", "sum"),
        hw_flops=("hw_flops", "sum"), bytes=("bytes", "sum"))
    g["share_of_step"] = _share(g["total_ns"], total_step_ns(trace))
    g = g.reset_index().sort_values("total_ns", ascending=False, ignore_index=True)
    return g[KERNEL_STAT_COLUMNS]
