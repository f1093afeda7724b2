"""`trace.plot` and `run.plot`: the dashboard's figures, one call each, in the style of
`DataFrame.plot`. Every method returns a `plotly.graph_objects.Figure` to restyle, save
(`write_html`, `write_image` where kaleido is installed) or show."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from neuron_explorer.plot import engines, figures, generation, ranks, streams
from neuron_explorer.plot import timeline as timeline_module
from neuron_explorer.plot.options import options

if TYPE_CHECKING:
    import plotly.graph_objects as go
    from neuron_explorer.plot.timeline_index import TimelineIndex
    from neuron_explorer.runs.run import Run
    from neuron_explorer.trace import Trace



class TracePlot:
    """Figures of one trace."""

    def __init__(self, trace: Trace) -> None:
        self._trace = trace
        self._indexes: dict[tuple, TimelineIndex] = {}

    def breakdown(self) -> go.Figure:
        """Mean time per step on the host and on the device, stacked by category."""
        return figures.breakdown_figure({"": self._trace.breakdown()})

    def timeline(self, start_ns: int | None = None, end_ns: int | None = None,
                 tracks: list[str | int] | None = None, interactive: bool | None = None,
                 critical_path: bool = False) -> Any:
        """Every track (or the `tracks` named, by name or id) over [start_ns, end_ns] (default:
        the recorded steps), level of detail included: slices narrower than a pixel merge into
        grey bars, so a million events draw as a few thousand. `interactive` (default: in
        Jupyter with ipywidgets and anywidget, see `plot.options`) gives a FigureWidget that
        draws each new window on zoom and pan. `critical_path` draws `Trace.critical_path()`
        over the bars: the chain of host work, waits and kernels that set each analysed step's
        length."""
        index = self.timeline_index(tracks)
        default = timeline_module.steps_window(self._trace, index)
        t0 = default[0] if start_ns is None else start_ns
        t1 = default[1] if end_ns is None else end_ns
        _check_window(index, t0, t1)
        path = self._trace.critical_path() if critical_path else None
        return timeline_module.timeline(index, t0, t1, options.interactive if interactive is None
                                        else interactive, path=path)

    def timeline_index(self, tracks: list[str | int] | None = None) -> TimelineIndex:
        """The level-of-detail index behind `timeline` (built once per set of tracks)."""
        key = tuple(str(t) for t in tracks) if tracks is not None else ()
        if key not in self._indexes:
            self._indexes[key] = timeline_module.build_index(self._trace, tracks=tracks)
        return self._indexes[key]

    def roofline(self) -> go.Figure:
        """Each op's arithmetic intensity against the FLOP rate it reached, under the roofs."""
        return figures.roofline_figure(self._trace.roofline(), self._trace.hardware_figures)

    def memory(self) -> go.Figure:
        """Device memory in use over time."""
        return figures.memory_figure(self._trace.memory_timeline())

    def counters(self) -> go.Figure:
        """Every counter series over time (HBM in use, SBUF occupancy, engine use; copy
        bandwidth per kind; CUPTI counters per profiled kernel)."""
        return figures.counters_figure(self._trace.counter_series())

    def queue_length(self) -> go.Figure:
        """How many launched kernels each device queue held over time."""
        return streams.queue_length_figure(self._trace.queue_length())

    def stream_idle(self) -> go.Figure:
        """Each queue's idle time between kernels, by HTA's category."""
        return streams.stream_idle_figure(self._trace.stream_idle())

    def tokens(self) -> go.Figure:
        """Each generated token's time: the time to first token, then per output token."""
        return generation.token_figure(self._trace.token_times())

    def kv_cache(self) -> go.Figure:
        """The KV cache held through each prefill and decode step."""
        return generation.kv_cache_figure(self._trace.kv_cache())

    def kernel_sequences(self, n: int = 3, top: int = 15) -> go.Figure:
        """The kernel sequences of length `n` with the most time: candidates for fusion."""
        return streams.ranked_bars(self._trace.kernel_sequences(n), "sequence", "total_ns",
                                   f"no repeated sequence of {n} kernels in this trace",
                                   "time of the sequence's kernels (ms)", top)

    def annotations(self, top: int = 15) -> go.Figure:
        """The annotated regions (`record_function`) with the most device time."""
        return streams.ranked_bars(self._trace.annotations(), "path", "device_total_ns",
                                   "no annotated regions in this trace",
                                   "device time of the region's kernels (ms)", top)

    def engines(self, step: int | None = None) -> go.Figure:
        """How busy each engine and DMA queue is over the recorded steps (or one `step`)."""
        return engines.utilisation_figure(engines.engine_use(self._trace, step))

    def engines_per_step(self) -> go.Figure:
        """The share of each step each engine ran."""
        return engines.per_step_figure(engines.engine_use(self._trace))

    def op_stats(self, n: int = 20) -> go.Figure:
        """The `n` ops with the most time, device and host."""
        return figures.op_stats_figure(self._trace.op_stats(), n)

    def kernel(self, kernel: str) -> go.Figure:
        """An NKI kernel's line profile (time per source line, by engine) beside its first
        run's engine timeline; `kernel` as listed by `trace.kernel_lines` / the report."""
        from neuron_explorer.analyses.kernel_lines import line_profile
        from neuron_explorer.plot.kernel import kernel_figure

        return kernel_figure(self._trace, kernel, line_profile(self._trace, kernel))


def _check_window(index: TimelineIndex, t0: float, t1: float) -> None:
    """A window that is reversed or misses the trace would draw an empty figure with no
    word why (times in seconds, or from 0 instead of the trace's clock, do)."""
    from neuron_explorer.common.errors import NeuronExplorerError
    from neuron_explorer.units import duration

    span = (f"this trace's events run from ts {index.start_ns} to {index.end_ns} ns "
            f"({duration(index.end_ns - index.start_ns)}; trace.steps gives each step's ts "
            "and dur)")
    if t1 <= t0:
        raise NeuronExplorerError(f"timeline window ends (end_ns={t1}) before it starts "
                                  f"(start_ns={t0}): give start_ns < end_ns; {span}")
    if t1 < index.start_ns or t0 > index.end_ns:
        raise NeuronExplorerError(f"timeline window [{t0}, {t1}] ns holds no events: {span}")


class RunPlot:
    """Figures of a distributed run."""

    def __init__(self, run: Run) -> None:
        self._run = run

    def step_times(self) -> go.Figure:
        """Step time per rank and step, as a heat map."""
        return ranks.step_times_figure(self._run)

    def communication(self) -> go.Figure:
        """Per rank: communication overlapped, exposed, and waiting for the last rank."""
        return ranks.communication_figure(self._run)

    def collectives(self) -> go.Figure:
        """The ranks' first collectives on one time axis, each call linked across ranks."""
        return ranks.collectives_figure(self._run)


def compare_breakdowns(traces: dict[str, Trace]) -> go.Figure:
    """The time breakdowns of several traces, side by side ({label: trace})."""
    return figures.breakdown_figure({label: t.breakdown() for label, t in traces.items()})
