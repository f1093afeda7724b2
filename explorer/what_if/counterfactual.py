"""What a finding's fix saves, by replaying the run with its cause removed.

An eager recording with op keys is replayed twice by the what-if replay
(`backend/replay.py`): as recorded, and with the cause's op slices removed (their host
time and their device work gone; sync waits are derived again, so a step that waited
for them waits less). The analysed steps' difference between the two replays is the
fix's saving; the cost model's own error is in both and largely cancels. Traces the
replay cannot re-time (compiled graphs, PyTorch-profiler traces, predictions) get None,
and rules fall back on the critical path (`analyses.path_share`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from neuron_explorer.analyses.steady_state import in_analysed_steps
from neuron_explorer.memo import memoised

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace


def removal_saving_ns(trace: Trace, op_ids: np.ndarray, cause: str) -> float | None:
    """ns the analysed steps would save if the program never issued the op slices
    `op_ids` (`cause` names them, for the cache), by replay; None where the trace
    cannot be replayed."""
    base = _replayed_span(trace, "as recorded", np.zeros(0, np.int64))
    if base is None or not len(op_ids):
        return None
    without = _replayed_span(trace, cause, np.asarray(op_ids, np.int64))
    if without is None:
        return None
    return float(max(base - without, 0.0))


def _replayed_span(trace: Trace, cause: str, removed: np.ndarray) -> float | None:
    """The analysed steps' replayed length, with the op slices `removed` left out: from
    the first step's start to the last step's end or, where the device lags behind its
    host, to the end of the last kernel the steps launched."""
    def compute() -> float | None:
        from neuron_explorer.backend.replay import ReplayOptions, replay
        from neuron_explorer.what_if.replay import replay_inputs

        inputs = replay_inputs(trace)
        if inputs is None:
            return None
        rows, events = inputs
        for event, gone in zip(events, np.isin(rows["id"].to_numpy(), removed), strict=True):
            event.removed = bool(gone)
        replayed, shift = replay(events, ReplayOptions(trace.hardware or "trn2"))
        steps = in_analysed_steps(trace, trace.steps)
        start = int(steps["ts"].min())
        end = int((steps["ts"] + steps["dur"]).max())
        recorded_ts = rows["ts"].to_numpy(np.int64)
        inside = np.flatnonzero((recorded_ts >= start) & (recorded_ts < end))
        device_end = max((k.end_ns for i in inside.tolist() for k in replayed[i].kernels),
                         default=0)
        new_start, new_end = shift(np.array([start, end]))
        return float(max(int(new_end), device_end) - int(new_start))

    return memoised(trace, f"counterfactual:{cause}", compute)
