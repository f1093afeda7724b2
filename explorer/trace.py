"""`load(path)` and `Trace`: a loaded trace, its tables, and the questions it answers.

A `Trace` holds the loader's tables (slices, tracks, counters, flows) and derives
steps, ops, kernels, instructions and modules on first use. Its methods are a
facade over `neuron_explorer.analyses` and `neuron_explorer.rules`: one analyzer
module per question, each a function of a Trace.
"""

from __future__ import annotations

import html
import os
from functools import cached_property
from typing import TYPE_CHECKING, Any

import pandas as pd
from neuron_explorer import tables
from neuron_explorer import trace_format as tf
from neuron_explorer.loaders import read_trace
from neuron_explorer.loaders.args import SliceArgs
from neuron_explorer.loaders.pages import small_pages
from neuron_explorer.loaders.raw import RawTrace

if TYPE_CHECKING:
    from neuron_explorer.plot import TracePlot
    from neuron_explorer.rules.finding import Findings
    from neuron_explorer.run import Run

SQL_TABLES = ("slices", "tracks", "counters", "flows", "steps", "ops", "kernels",
              "instructions", "modules")


def load(path: str | os.PathLike | list[str | os.PathLike] | tuple[str | os.PathLike, ...],
         *, max_bytes: int | None = None) -> Trace | Run:
    """Load a trace: our .pftrace or JSON, or a PyTorch-profiler JSON(.gz) from any device.
    A folder of per-rank traces (a run folder) or a list of paths gives a `Run`.

    Any file that cannot be read raises `TraceFormatError` naming where. `max_bytes`
    caps the trace data read after decompression (default: 100x a gzipped file's size,
    at least 256 MiB, at most 4 GiB; or `NEURON_EXPLORER_MAX_TRACE_BYTES`); a run's
    ranks are read with the default cap.
    """
    if isinstance(path, (list, tuple)) or os.path.isdir(path):
        from neuron_explorer.run import load_run

        return load_run(path)
    return Trace(read_trace(path, max_bytes=max_bytes))


class Trace:
    """A loaded trace: pandas tables (int64 ns ts/dur) and analyses over them."""

    def __init__(self, raw: RawTrace) -> None:
        self.path = raw.path
        self.source_format = raw.source_format
        self.base_slices: pd.DataFrame = raw.slices  # slices without the args column
        self.args: SliceArgs = raw.args
        self.tracks: pd.DataFrame = raw.tracks
        self.counters: pd.DataFrame = raw.counters
        self._flows_source = raw.flows
        self.metadata: dict[str, Any] = raw.metadata
        self.skipped: dict[str, int] = raw.skipped
        self.warnings: list[str] = raw.warnings
        self._cache: dict[str, Any] = {}

    # --- tables ---------------------------------------------------------------------------
    @cached_property
    def slices(self) -> pd.DataFrame:
        """Every slice with its args dict (built on first use: large traces pay once)."""
        frame = self.base_slices.copy()
        frame["args"] = pd.Series(self.args.dicts(), dtype=object)
        return frame

    @cached_property
    def flows(self) -> pd.DataFrame:
        """Flow edges: flow_id, src_id, dst_id (a .pftrace links them on first use)."""
        source, self._flows_source = self._flows_source, None  # let go of what it held
        return source() if callable(source) else source

    @cached_property
    def steps(self) -> pd.DataFrame:
        """One row per training step: step, ts, dur."""
        return tables.derive_steps(self)

    @cached_property
    def ops(self) -> pd.DataFrame:
        """Ops dispatched by the host, with their device time and cost."""
        return tables.derive_ops(self)

    @cached_property
    def kernels(self) -> pd.DataFrame:
        """Device kernels (and, for PyTorch-profiler traces, copies and memsets)."""
        return tables.derive_kernels(self)

    @cached_property
    def instructions(self) -> pd.DataFrame:
        """Engine instructions and DMA transfers (engine-level recordings only)."""
        return tables.derive_instructions(self)

    @cached_property
    def modules(self) -> pd.DataFrame:
        """nn.Module forward and backward ranges."""
        return tables.derive_modules(self)

    @property
    def hardware(self) -> str | None:
        """Hardware preset (trn1, trn2, trn3) or the profiled device's name."""
        value = self.metadata.get(tf.META_HARDWARE)
        return str(value) if value else None

    @cached_property
    def hardware_figures(self) -> dict[str, Any] | None:
        """Peak figures of the hardware (from the trace's metadata), or None; `ridge` adds the
        roofline's ridge point in FLOP/byte (BF16 peak / HBM bandwidth) when both are known."""
        from neuron_explorer.peaks import ridge_point

        figures = self.metadata.get(tf.META_HARDWARE_FIGURES)
        if not isinstance(figures, dict) or not figures:
            return None
        ridge = ridge_point(figures)
        return {**figures, "ridge": ridge} if ridge else dict(figures)

    def table(self, name: str) -> pd.DataFrame:
        """A table by name (the names `sql` knows)."""
        if name not in SQL_TABLES:
            from neuron_explorer.errors import NeuronExplorerError

            raise NeuronExplorerError(f"no table {name!r}; tables are {', '.join(SQL_TABLES)}")
        return self.base_slices if name == "slices" else getattr(self, name)

    def sql(self, query: str) -> pd.DataFrame:
        """Run DuckDB SQL over the tables (slices without args), reading the frames in place."""
        from neuron_explorer.sql import query_tables

        return query_tables(query, SQL_TABLES, self.table)

    def cached(self, key: str, compute: Any) -> Any:
        """Memoise an analysis result on this trace."""
        if key not in self._cache:
            with small_pages():  # analyses, like loads, make many short-lived arrays
                self._cache[key] = compute()
        return self._cache[key]

    # --- facade over the analyses -----------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Headline numbers: hardware, steps, step time, MFU/HFU/MBU, busy share, counts."""
        from neuron_explorer.analyses.summary import summary

        return self.cached("summary", lambda: summary(self))

    def breakdown(self) -> pd.DataFrame:
        """Long form per step: step, side (device|host), category, ns, share."""
        from neuron_explorer.analyses.step_breakdown import breakdown

        return self.cached("breakdown", lambda: breakdown(self))

    def idle_reasons(self) -> pd.DataFrame:
        """Each device idle gap with its reason (host_launch, sync, data, compile, dependency)."""
        from neuron_explorer.analyses.idle import idle_gaps

        return self.cached("idle", lambda: idle_gaps(self))

    def op_stats(self) -> pd.DataFrame:
        """Per op name: count, host and device time, FLOPs, bytes, share of step time."""
        from neuron_explorer.analyses.statistics import op_stats

        return self.cached("op_stats", lambda: op_stats(self))

    def module_stats(self) -> pd.DataFrame:
        """Per module path and phase: count, time, device time of its ops, FLOPs, share."""
        from neuron_explorer.analyses.statistics import module_stats

        return self.cached("module_stats", lambda: module_stats(self))

    def kernel_stats(self) -> pd.DataFrame:
        """Per kernel name: count, total/mean/max device time, FLOPs, bytes, share."""
        from neuron_explorer.analyses.statistics import kernel_stats

        return self.cached("kernel_stats", lambda: kernel_stats(self))

    def engine_utilisation(self, bin_ns: int | None = None) -> pd.DataFrame:
        """ts, device, engine, utilisation (0..1) in time bins."""
        from neuron_explorer.analyses.engine_utilisation import engine_utilisation

        return self.cached(f"engine_util:{bin_ns}", lambda: engine_utilisation(self, bin_ns))

    def efficiency(self) -> pd.DataFrame:
        """Per step: model and executed FLOPs, bytes, MFU, HFU, MBU."""
        from neuron_explorer.analyses.efficiency import efficiency

        return self.cached("efficiency", lambda: efficiency(self))

    def roofline(self) -> pd.DataFrame:
        """Per op name: FLOPs, bytes, intensity, achieved FLOP/s, bound (compute|memory)."""
        from neuron_explorer.analyses.roofline import roofline

        return self.cached("roofline", lambda: roofline(self))

    def memory_timeline(self) -> pd.DataFrame:
        """ts, device, in_use_bytes: device memory in use over time."""
        from neuron_explorer.analyses.memory import memory_timeline

        return self.cached("memory_timeline", lambda: memory_timeline(self))

    def memory_at_peak(self) -> pd.DataFrame:
        """What holds device memory at its peak: op and module, bytes, share of the peak."""
        from neuron_explorer.analyses.memory import memory_at_peak

        return self.cached("memory_at_peak", lambda: memory_at_peak(self))

    def compile_summary(self) -> dict[str, pd.DataFrame]:
        """Compiled graphs, graph breaks and recompiles."""
        from neuron_explorer.analyses.compilation import compile_summary

        return self.cached("compile", lambda: compile_summary(self))

    def communication(self) -> pd.DataFrame:
        """Per device: compute and communication time, the overlapped part (`overlap_pct`:
        share of communication time that overlaps compute), exposed communication."""
        from neuron_explorer.analyses.communication import communication

        return communication(self)

    def collectives(self) -> pd.DataFrame:
        """One row per collective call: kind, bytes, group, seq, wait and transfer time."""
        from neuron_explorer.analyses.communication import collectives

        return collectives(self)
    def kernel_lines(self, kernel: Any) -> pd.DataFrame:
        """Time per source line per engine of an NKI kernel (its name or the kernel)."""
        from neuron_explorer.analyses.kernel_lines import kernel_lines
        return kernel_lines(self, kernel)

    def kernel_profile(self, kernel: Any) -> pd.DataFrame:
        """Per run of an NKI kernel: engine busy %, DMA/compute overlap, SBUF/PSUM peaks."""
        from neuron_explorer.analyses.kernel_lines import kernel_profile
        return kernel_profile(self, kernel)

    def bottlenecks(self) -> Findings:
        """Findings of every bottleneck rule, ranked by time lost."""
        from neuron_explorer.rules import run_rules

        return self.cached("bottlenecks", lambda: run_rules(self))

    # --- display --------------------------------------------------------------------------
    @cached_property
    def plot(self) -> TracePlot:
        """The trace's figures (plotly): `trace.plot.timeline()`, `.breakdown()`, `.roofline()`..."""
        from neuron_explorer.plot import TracePlot

        return TracePlot(self)

    def __repr__(self) -> str:
        return (f"<Trace {os.path.basename(self.path)}: {self.source_format}, "
                f"{len(self.base_slices)} slices, {len(self.steps)} steps>")

    def _repr_html_(self) -> str:
        s = self.summary()
        rows = "".join(
            f"<tr><th style='text-align:left'>{html.escape(str(k))}</th>"
            f"<td>{html.escape(_fmt(v))}</td></tr>"
            for k, v in s.items() if not isinstance(v, dict)
        )
        return (f"<div><b>Neuron Explorer trace</b> {html.escape(os.path.basename(self.path))}"
                f"<table>{rows}</table></div>")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
