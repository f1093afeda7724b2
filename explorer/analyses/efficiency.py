"""MFU, HFU and MBU per step, as Neuron's profiler defines them.

MFU = model FLOPs / (peak FLOP/s x step time); HFU counts the FLOPs the hardware
executed (padding included); MBU = HBM bytes moved / (peak bandwidth x step time).
The peak is the Tensor Engine's BF16 dense rate of the trace's hardware. Without
hardware figures (a PyTorch-profiler trace), or at `--level framework` (no kernels),
the ratios are NaN. Steps are the analysed ones (`steady_state`), as long as the run's
pace makes them (`device_pace`: a device behind its host sets it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.analyses.device_pace import paced_durations
from neuron_explorer.analyses.levels import records_device
from neuron_explorer.analyses.phases import without_eval
from neuron_explorer.analyses.step_breakdown import step_windows
from neuron_explorer.peaks import hbm_bandwidth, peak_flops

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

COLUMNS = ["step", "dur", "flops", "hw_flops", "bytes", "mfu", "hfu", "mbu"]


def efficiency(trace: Trace) -> pd.DataFrame:
    """One row per step (or one for the whole trace when it has no steps)."""
    win = step_windows(trace)
    if not len(win):
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in COLUMNS})
    k = trace.kernels
    steps = win["step"].to_numpy()
    measured = records_device(trace)  # at --level framework no kernel says what ran
    if len(k) and len(trace.steps):
        k = _inside_steps(trace, without_eval(trace, k))
        g = k.groupby("step")[["flops", "hw_flops", "bytes"]].sum()
        sums = g.reindex(steps, fill_value=0)
    elif len(k):
        sums = pd.DataFrame([k[["flops", "hw_flops", "bytes"]].sum()], index=steps)
    else:
        sums = pd.DataFrame(0, index=steps, columns=["flops", "hw_flops", "bytes"])
    dur_ns = paced_durations(trace)  # a device behind its host paces the run
    dur_s = dur_ns / 1e9
    peak = peak_flops(trace.hardware_figures)
    bw = hbm_bandwidth(trace.hardware_figures)
    frame = pd.DataFrame({"step": steps, "dur": dur_ns.round().astype(np.int64),
                          "flops": sums["flops"].to_numpy(np.int64),
                          "hw_flops": sums["hw_flops"].to_numpy(np.int64),
                          "bytes": sums["bytes"].to_numpy(np.int64)})
    with np.errstate(divide="ignore", invalid="ignore"):
        frame["mfu"] = frame["flops"] / (peak * dur_s) if peak and measured else np.nan
        frame["hfu"] = frame["hw_flops"] / (peak * dur_s) if peak and measured else np.nan
        frame["mbu"] = frame["bytes"] / (bw * dur_s) if bw and measured else np.nan
    return frame[COLUMNS]


def _inside_steps(trace: Trace, k: pd.DataFrame) -> pd.DataFrame:
    """The kernels whose op the host issued inside a step: the set-up before the first step
    (moving the model and data to the device) carries step 0's number too. A run that
    crashed in its first step counted 12.5 MB of set-up copies against its 12 us: MBU
    387%."""
    if "op_slice_id" not in k or not len(k):
        return k
    ops = k["op_slice_id"].to_numpy(np.int64)
    issued = trace.table("slices")["ts"].to_numpy(np.int64)[np.maximum(ops, 0)]
    start = trace.steps.groupby("step")["ts"].min()
    begins = start.reindex(k["step"].to_numpy()).to_numpy()
    return k[(ops < 0) | np.isnan(begins) | (issued >= np.nan_to_num(begins))]
