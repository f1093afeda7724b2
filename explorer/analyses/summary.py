"""The headline numbers of a trace, as one flat dict."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from neuron_explorer.analyses.levels import recorded_level, records_device
from neuron_explorer.analyses.steady_state import analysed_steps
from neuron_explorer.analyses.step_breakdown import step_windows
from neuron_explorer.common import trace_format as tf
from neuron_explorer.tables import kind_codes, kind_mask, nested_ops

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace


def _median(values: Any) -> float | None:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return float(np.median(values)) if values else None


def _op_count(trace: Trace) -> int:
    """Rows of the ops table (the outermost op slices), without building it."""
    if "ops" in trace.__dict__:
        return len(trace.ops)
    op_ids = np.flatnonzero(kind_mask(trace, ("op",)))
    return int(len(op_ids) - nested_ops(trace, op_ids).sum())


def _kind_counts(trace: Trace) -> dict[str, int]:
    """Slices per kind, most first (as `value_counts`), from the kind codes made once."""
    codes, uniques = kind_codes(trace)
    counts = pd.Series(np.bincount(codes[codes >= 0], minlength=len(uniques)),
                       index=np.asarray(uniques, dtype=object))
    counts = counts.sort_values(ascending=False, kind="stable")
    return {str(k): int(v) for k, v in counts.items()}


# Pairs of consecutive steps needed to time the device per step.
DEVICE_PACED_MIN_INTERVALS = 2
# The device's time per step is shown beside the host's from this ratio on.
DEVICE_PACED_SHOWN = 1.05


def device_paced_step_ns(trace: Trace, windows: pd.DataFrame) -> float | None:
    """The analysed steps' median time between the ends of consecutive steps' device work
    (each step's last kernel, against the step before's). Where a step waits for nothing
    on the device (no sync, no read), the host's window is not the step's cost: a device
    that needs longer than its host falls further behind every step, and a run longer
    than the recording is paced by the device, as a full launch queue would make the
    host wait. None without `DEVICE_PACED_MIN_INTERVALS` such pairs of steps."""
    kernels = trace.kernels
    if not len(windows) or not len(kernels) or int(windows["step"].iloc[0]) < 0:
        return None
    ends = (kernels["ts"] + kernels["dur"]).groupby(kernels["step"]).max()
    intervals = [float(ends[n] - ends[n - 1]) for n in windows["step"].astype(int)
                 if n in ends.index and n - 1 in ends.index]
    if len(intervals) < DEVICE_PACED_MIN_INTERVALS:
        return None
    return float(np.median(intervals))


def device_paces(s: dict[str, Any]) -> bool:
    """Whether a summary's device needs clearly longer per step than its host's windows."""
    paced, host = s.get("device_paced_step_ns"), s.get("step_time_ns")
    return bool(paced and host and paced >= DEVICE_PACED_SHOWN * host)


def summary(trace: Trace) -> dict[str, Any]:
    """hardware, source_format, n_steps, steps_analysed (the steady state, and in words),
    step_time_ns (median over them: the host's step windows), device_paced_step_ns (the
    device's time per step, `device_paced_step_ns`), compile_ns (on its own), total_ns,
    mfu, hfu, mbu, device_busy_share (None at --level framework), n_ops, n_kernels, and
    counts of slices by kind."""
    s = trace.table("slices")
    win = step_windows(trace)
    selection = analysed_steps(trace)
    eff = trace.efficiency()
    bd = trace.breakdown()
    dev = bd[bd["side"] == "device"]
    busy = dev.loc[dev["category"] != "idle", "ns"].sum()
    total = int(win["dur"].sum()) if len(win) else 0
    span = int((s["ts"] + s["dur"]).max() - s["ts"].min()) if len(s) else 0
    return {
        "path": trace.path,
        "hardware": trace.hardware,
        "source_format": trace.source_format,
        "n_steps": len(trace.steps),
        "steps_analysed": list(selection.steps),
        "steps_analysed_text": selection.describe(),
        "step_time_ns": _median(win["dur"].tolist()) if len(trace.steps) else None,
        "device_paced_step_ns": device_paced_step_ns(trace, win),
        "compile_ns": int(trace.compile_summary()["totals"]["compile_ns"].iloc[0]),
        "level": recorded_level(trace),
        "total_ns": total,
        "span_ns": span,
        "mfu": _median(eff["mfu"].tolist()),
        "hfu": _median(eff["hfu"].tolist()),
        "mbu": _median(eff["mbu"].tolist()),
        "device_busy_share": (float(busy / total) if total and len(trace.kernels) else 0.0)
        if records_device(trace) else None,
        "n_ops": _op_count(trace),
        "n_kernels": int((trace.kernels["kind"] == "kernel").sum()) if len(trace.kernels) else 0,
        # counted without building the instructions table (the overview shows only the count)
        "n_instructions": int(kind_mask(trace, (tf.CAT_INSTRUCTION, tf.CAT_DMA)).sum()),
        "n_slices": len(s),
        "devices": sorted(int(d) for d in trace.tracks["device"].unique() if d >= 0),
        "counts": _kind_counts(trace),
        "skipped": dict(trace.skipped),
    }
