"""The headline numbers of a trace, as one flat dict."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
from neuron_explorer.analyses import device_pace as pace
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
    """Slices per kind, most first (ties by name), from the kind codes made once."""
    codes, uniques = kind_codes(trace)
    counts = np.bincount(codes[codes >= 0], minlength=len(uniques))
    names = [str(k) for k in np.asarray(uniques, dtype=object).tolist()]
    ranked = sorted((-int(n), name) for n, name in zip(counts.tolist(), names, strict=True) if n)
    return {name: -n for n, name in ranked}


def _device_busy_from(trace: Trace, start: int) -> float:
    """The analysed steps' kernels' busy time from `start` (the first analysed step's) on:
    work the first step launched before its window is not in the paced steps."""
    from neuron_explorer.analyses.phases import in_analysed_work
    from neuron_explorer.common.intervals import Union

    kernels = in_analysed_work(trace, trace.kernels)
    ts = np.maximum(kernels["ts"].to_numpy(np.int64), start)
    end = np.maximum((kernels["ts"] + kernels["dur"]).to_numpy(np.int64), start)
    return float(Union(ts, end).total)


def summary_device_paced(s: dict[str, Any]) -> bool:
    """Whether a summary's device needs clearly longer per step than its host's windows
    (its step time is then the device's: `analyses.device_pace`)."""
    return bool(s.get("device_paces"))


# a mean step this far from the median is said beside it
MEAN_STEP_APART = 0.10


def mean_step_apart(s: dict[str, Any]) -> float | None:
    """A summary's mean analysed step where it is far from their median, else None: steps
    that alternate (DataLoader workers fetching in step: 3 and 38 ms, a median of 17 ms and
    a mean of 21) make the median no measure of the time a finding's fix saves a step."""
    steps, median = s.get("steps_counted", 0), s.get("step_time_ns")
    if not steps or not median or not s.get("total_ns"):
        return None
    mean = s["total_ns"] / steps
    return mean if abs(mean - median) > MEAN_STEP_APART * median else None


def summary(trace: Trace) -> dict[str, Any]:
    """hardware, source_format, n_steps, steps_analysed (the steady state, and in words),
    step_time_ns (median over them, each as long as the run's pace makes it:
    `analyses.device_pace`), host_step_ns (the median of the host's step windows),
    device_paced_step_ns (the device's time per step), device_paces (whether that, not
    the host's windows, sets the step time), compile_ns (on its own), total_ns,
    mfu, hfu, mbu, device_busy_share (None at --level framework), n_ops, n_kernels,
    counts of slices by kind, and how the program ended (exit_code, program_error)."""
    s = trace.table("slices")
    win = step_windows(trace)
    selection = analysed_steps(trace)
    eff = trace.efficiency()
    bd = trace.breakdown()
    dev = bd[bd["side"] == "device"]
    busy = float(dev.loc[dev["category"] != "idle", "ns"].sum())
    paced = pace.paced_durations(trace)
    total = int(paced.sum()) if len(win) else 0
    if len(win) and total > win["dur"].sum():  # the device paces: its work, not windows'
        busy = _device_busy_from(trace, int(win["ts"].min()))
    span = int((s["ts"] + s["dur"]).max() - s["ts"].min()) if len(s) else 0
    return {
        "path": trace.path,
        "hardware": trace.hardware,
        "source_format": trace.source_format,
        "n_steps": len(trace.steps),
        "steps_analysed": list(selection.steps),
        "steps_analysed_text": selection.describe(),
        # what the per-step figures divide by: the analysed training steps, where others ran
        "steps_counted": len(win) if len(trace.steps) else 0,
        "step_time_ns": _median(paced.tolist()) if len(trace.steps) else None,
        "host_step_ns": _median(win["dur"].tolist()) if len(trace.steps) else None,
        "device_paced_step_ns": pace.device_paced_step_ns(trace),
        "device_paces": bool(len(trace.steps)) and pace.device_paces(trace),
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
        # how the recorded program ended where it failed (0 and None: it ended well)
        "exit_code": int(trace.metadata.get(tf.META_EXIT_CODE) or 0),
        "program_error": trace.metadata.get(tf.META_PROGRAM_ERROR),
    }
