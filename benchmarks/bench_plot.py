"""`trace.plot.timeline()` on a 1-million-event trace: how long a figure takes and how many
marks it draws, against drawing every visible slice as its own bar (no level of detail).

Writes a synthetic eager-training trace with the project's Perfetto writer, loads it, then
times (median and spread over --repeat runs, each after a fresh index unless said):
  * index: building the level-of-detail index (once per trace);
  * first figure: `trace.plot.timeline()` of the recorded steps, index included;
  * window: a figure of one step, then of a tenth of a step (index built);
  * baseline: the same one-step window drawn with one bar per visible slice.
Target: a window in under a second with at most a few thousand marks.

    .venv/bin/python benchmarks/bench_plot.py [--events 1000000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import base64
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "webapp"))

TARGET_S = 1.0


def marks(figure) -> int:
    """Bars and line points drawn (typed arrays decoded)."""
    import numpy as np

    def length(values) -> int:
        if isinstance(values, dict) and "bdata" in values:
            return np.frombuffer(base64.b64decode(values["bdata"]), dtype=values["dtype"]).size
        return len(values)

    return sum(length(t.base if t.type == "bar" else t.x) for t in figure.data)


def naive(trace, t0: int, t1: int):
    """Baseline: one bar per visible slice, in one trace per category, no merging."""
    import plotly.graph_objects as go

    s = trace.table("slices")
    visible = s[(s["ts"] < t1) & (s["ts"] + s["dur"] >= t0)]
    data = [go.Bar(orientation="h", base=g["ts"].to_numpy() - t0, x=g["dur"].to_numpy(),
                   y=g["track_id"].to_numpy(), name=str(cat), hovertext=g["name"].tolist())
            for cat, g in visible.groupby("category")]
    return go.Figure(data)


def timed(function, repeat: int) -> tuple[list[float], object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = function()
        times.append(time.perf_counter() - start)
    return times, result


def spread(times: list[float]) -> str:
    return (f"median {statistics.median(times) * 1e3:,.0f} ms "
            f"(min {min(times) * 1e3:,.0f}, max {max(times) * 1e3:,.0f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    import neuron_explorer
    from neuron_explorer.plot import TracePlot
    from synthetic_trace import events_in, write_trace

    n_steps, k = 20, 3
    ops = max(args.events // (n_steps * (k + 5)), 1)
    with tempfile.TemporaryDirectory() as folder:
        path = write_trace(Path(folder) / "big.pftrace", n_steps, ops, instructions_per_kernel=k)
        trace = neuron_explorer.load(path)
    print(f"{events_in(n_steps, ops, k):,} events, {len(trace.table('slices')):,} slices")
    build, _ = timed(lambda: TracePlot(trace).timeline_index(), args.repeat)
    first, figure = timed(lambda: TracePlot(trace).timeline(interactive=False), args.repeat)
    print(f"index:        {spread(build)}")
    print(f"first figure: {spread(first)}, {marks(figure):,} marks (index included)")
    step = trace.steps.iloc[n_steps // 2]
    t0, t1 = int(step["ts"]), int(step["ts"] + step["dur"])
    plot = trace.plot
    plot.timeline_index()
    window, figure = timed(lambda: plot.timeline(t0, t1, interactive=False), args.repeat)
    print(f"one step:     {spread(window)}, {marks(figure):,} marks")
    tenth, small = timed(lambda: plot.timeline(t0, t0 + (t1 - t0) // 10, interactive=False),
                         args.repeat)
    print(f"tenth step:   {spread(tenth)}, {marks(small):,} marks")
    base, every = timed(lambda: naive(trace, t0, t1), max(args.repeat // 2, 1))
    print(f"baseline:     {spread(base)}, {marks(every):,} marks (one bar per slice, one step)")
    print(f"one step with level of detail / baseline: "
          f"{statistics.median(window) / statistics.median(base):.2f}x time, "
          f"{marks(figure) / max(marks(every), 1):.3f}x marks; target {TARGET_S:.1f} s: "
          f"{statistics.median(window) / TARGET_S:.2f}x of it")


if __name__ == "__main__":
    main()
