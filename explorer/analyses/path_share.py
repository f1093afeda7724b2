"""How long a step's critical path runs inside given slices: what removing them saves,
to first order.

A slice off the critical path can shrink without shortening the step; one on it saves
the time the path spends in it (removing it may expose a path that was nearly as long,
so this is an upper bound; `what_if.counterfactual` replays the run without the slices
where the trace allows)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.common.intervals import Union

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace


def time_on_path(trace: Trace, ts: np.ndarray, end: np.ndarray, kind: str,
                 tracks: Iterable[int] | None = None,
                 steps: Iterable[int] | None = None) -> float:
    """ns the critical path of the analysed steps (or of `steps`, warm-up included)
    spends inside the intervals [ts, end) on `kind` ("host" or "device") tracks, on
    `tracks` only if given (a device queue is one track; the host's path is on its main
    thread whichever thread the slice ran on)."""
    steps = None if steps is None else list(steps)
    if not len(ts) or steps == []:  # no steps: no path (compile spans of no length on the
        return 0.0  # modelled clock overlap none)
    path = (trace.critical_path() if steps is None else
            pd.concat([trace.critical_path(int(s)) for s in steps], ignore_index=True))
    if not len(path):
        return 0.0
    seg = path[path["kind"] == kind]
    if tracks is not None:
        seg = seg[seg["track"].isin(list(tracks))]
    inside = Union(np.asarray(ts, np.int64), np.asarray(end, np.int64))
    start = seg["ts"].to_numpy(np.int64)
    return float(inside.covered(start, start + seg["dur"].to_numpy(np.int64)).sum())
