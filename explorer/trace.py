"""`load(path)` and `Trace`: a loaded trace, its tables, and the questions it answers.

A `Trace` holds the loader's tables (slices, tracks, counters, flows) and derives
steps, ops, kernels, instructions and modules on first use. Its methods are a
facade over `neuron_explorer.analyses` and `neuron_explorer.rules`: one analyzer
module per question, each a function of a Trace.

A trace file's tables are kept in the trace cache (`store/cache.py`) after its first
load: a reload reads them from Parquet, and `sql` queries the Parquet files in place.
"""

from __future__ import annotations

import html
import os
from functools import cached_property
from typing import TYPE_CHECKING, Any

import pandas as pd
from neuron_explorer import tables
from neuron_explorer.common import trace_format as tf
from neuron_explorer.loaders import decoded_in_windows, read_trace
from neuron_explorer.loaders.args import SliceArgs, tidy_categoricals
from neuron_explorer.loaders.build_memory import building
from neuron_explorer.loaders.raw import RawTrace
from neuron_explorer.memo import memoised

if TYPE_CHECKING:
    from neuron_explorer.plot import TracePlot
    from neuron_explorer.rules.finding import Findings
    from neuron_explorer.runs.run import Run
    from neuron_explorer.store.parquet import Store

SQL_TABLES = ("slices", "args", "tracks", "counters", "flows", "steps", "ops", "kernels",
              "instructions", "modules")
DERIVED = {"steps": tables.derive_steps, "ops": tables.derive_ops,
           "kernels": tables.derive_kernels, "instructions": tables.derive_instructions,
           "modules": tables.derive_modules}
# names these tables had before; still read, not part of the surface
_RENAMED = {"base_slices": "_slices", "args": "slice_args"}


def load(path: str | os.PathLike | list[str | os.PathLike] | tuple[str | os.PathLike, ...],
         *, max_bytes: int | None = None, cache: bool | None = None,
         scheduler: str | None = None, processes: int | None = None,
         progress: bool | None = None) -> Trace | Run:
    """Load a trace: our .pftrace or JSON, or a PyTorch-profiler JSON(.gz) from any device.
    A folder of per-rank traces (a run folder) or a list of paths gives a `Run`; a folder
    written by `neuron-explorer convert` loads what it holds.

    Any file that cannot be read raises `TraceFormatError` naming where. `max_bytes`
    caps the trace data read after decompression (default: 100x a gzipped file's size,
    at least 256 MiB, at most 4 GiB; or `NEURON_EXPLORER_MAX_TRACE_BYTES`); a run's
    ranks are read with the default cap. `cache`: read and keep the tables in the trace
    cache (default: on unless `NEURON_EXPLORER_CACHE=off`). For a run, `scheduler` runs
    the per-rank work on Dask (`"local"` or a scheduler's address, see `Run`),
    `processes` sets the local worker processes and `progress` the progress bar.
    """
    from neuron_explorer.store.parquet import is_store

    if not isinstance(path, (list, tuple)) and os.path.isdir(path) and is_store(path):
        return _load_store(os.fspath(path))
    if isinstance(path, (list, tuple)) or os.path.isdir(path):
        from neuron_explorer.runs.run import load_run

        return load_run(path, processes=processes, progress=progress, cache=cache,
                        scheduler=scheduler)
    from neuron_explorer.progress import steps
    from neuron_explorer.store import cache as trace_cache

    root = trace_cache.cache_root() if cache is not False else None
    # one build: the memory the parse and the cache's writing free goes back at its end
    with steps(1, f"loading {os.path.basename(path)}", progress, unit="trace") as bar, \
            building():
        if root is None:
            trace = Trace(read_trace(path, max_bytes=max_bytes))
        else:
            raw, store = trace_cache.read_cached(
                os.fspath(path), lambda p: read_trace(p, max_bytes=max_bytes), root,
                streamable=decoded_in_windows(path, max_bytes=max_bytes))
            trace = Trace(raw, store)
        bar.update()
    return trace


def _load_store(folder: str) -> Trace | Run:
    """A trace (or a run) as `convert` wrote it."""
    from neuron_explorer.common.errors import TraceFormatError
    from neuron_explorer.store.parquet import RUN_MANIFEST, StoreError, open_store

    if os.path.isfile(os.path.join(folder, RUN_MANIFEST)):
        from neuron_explorer.runs.run import load_converted_run

        return load_converted_run(folder)
    try:
        store = open_store(folder)
        raw = store.raw()
    except StoreError as exc:
        raise TraceFormatError(folder, f"not a readable converted trace ({exc}); convert "
                               "the trace again with `neuron-explorer convert`") from None
    store.replay_warnings()
    raw.path = folder
    return Trace(raw, store, writable=False)


class Trace:
    """A loaded trace: pandas tables (int64 ns ts/dur) and analyses over them.

    Tables: `slices` (with an `args` column: a dict per slice, made when read), `tracks`,
    `counters`, `flows`, and, derived on first use, `steps`, `ops`, `kernels`,
    `instructions`, `modules`;
    `table(name)` and `sql(query)` give the same tables, `slices` without its args
    (those are the `args` table: one row per slice and key). `slice_args` reads one
    arg of many slices at once. `metadata`, `warnings` (parts of the file that could not
    be read) and `skipped` (what was left out, counted) describe the file. The methods
    below `hardware_figures` answer questions: each is an analysis or the rules.
    """

    def __init__(self, raw: RawTrace, store: Store | None = None, *,
                 writable: bool = True) -> None:
        self.path: str = raw.path
        self.source_format: str = raw.source_format
        self._slices: pd.DataFrame = raw.slices  # slices without the args column
        self.slice_args: SliceArgs = raw.args
        """Args of slices by key: `column(key, ids)`, `numbers(...)`, `texts(...)`, `get(id)`."""
        self.tracks: pd.DataFrame = raw.tracks
        self.counters: pd.DataFrame = raw.counters
        self._flows_source = raw.flows
        self.metadata: dict[str, Any] = raw.metadata
        self.skipped: dict[str, int] = raw.skipped
        self.warnings: list[str] = raw.warnings
        self._store = store
        self._store_writable = writable

    def __getattr__(self, name: str) -> Any:
        if name in _RENAMED:  # old names, kept readable for existing scripts
            return getattr(self, _RENAMED[name])
        if name == "cached":  # the old memo method: neuron_explorer.memo.memoised now
            return lambda key, compute: memoised(self, key, compute)
        raise AttributeError(f"'Trace' object has no attribute {name!r}")

    # --- tables ---------------------------------------------------------------------------
    @cached_property
    def slices(self) -> pd.DataFrame:
        """Every slice with its args: a dict per row, made when that row's args are read
        (`args_column`); for a few args of many slices, `slice_args` reads them as
        columns."""
        from neuron_explorer.args_column import args_column

        frame = self._slices.copy(deep=False)  # copy-on-write: the table stays as it is
        frame["args"] = args_column(self.slice_args, len(frame))
        return frame

    @cached_property
    def flows(self) -> pd.DataFrame:
        """Flow edges: flow_id, src_id, dst_id (a .pftrace links them on first use)."""
        source, self._flows_source = self._flows_source, None  # let go of what it held
        return source() if callable(source) else source

    @cached_property
    def steps(self) -> pd.DataFrame:
        """One row per training step: step, ts, dur."""
        return self._derived("steps")

    @cached_property
    def ops(self) -> pd.DataFrame:
        """Ops dispatched by the host, with their device time and cost."""
        return self._derived("ops")

    @cached_property
    def kernels(self) -> pd.DataFrame:
        """Device kernels (and, for PyTorch-profiler traces, copies and memsets)."""
        return self._derived("kernels")

    @cached_property
    def instructions(self) -> pd.DataFrame:
        """Engine instructions and DMA transfers (engine-level recordings only)."""
        return self._derived("instructions")

    @cached_property
    def modules(self) -> pd.DataFrame:
        """nn.Module forward and backward ranges."""
        return self._derived("modules")

    def _derived(self, name: str) -> pd.DataFrame:
        """A derived table: from the store when it holds it, else computed (and kept)."""
        store = self._store
        if store is not None:
            frame = store.read_table(name)
            if frame is not None:
                return frame
        with building():
            # text columns taken from the slices stay categorical: with the categories a
            # read of the stored table gives (those used, in lexical order)
            frame = tidy_categoricals(DERIVED[name](self))
        if store is not None and self._store_writable:
            store.write_table(name, frame)
        return frame

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
        """A table by name, as `sql` sees it: `slices` without its args column, `args` in
        long form (slice_id, key, kind, int_value, float_value, str_value)."""
        if name not in SQL_TABLES:
            from neuron_explorer.common.errors import NeuronExplorerError

            raise NeuronExplorerError(f"no table {name!r}; tables are {', '.join(SQL_TABLES)}")
        if name == "slices":
            return self._slices
        if name == "args":
            return self._args_table
        return getattr(self, name)

    @cached_property
    def _args_table(self) -> pd.DataFrame:
        from neuron_explorer.loaders.args import ColumnArgs, LazyArgs

        args = self.slice_args
        decoded = args.decoded if isinstance(args, LazyArgs) else args
        if isinstance(decoded, ColumnArgs) and len(decoded.slice_id):
            # decoded already (a first load wrote them into the store): building the
            # table from the columns costs less than reading the store's file back
            from neuron_explorer.store.parquet import args_frame

            return args_frame(decoded, len(self._slices))
        if self._store is not None:
            frame = self._store.read_table("args")
            if frame is not None:
                return frame
        from neuron_explorer.store.parquet import args_frame

        return args_frame(self.slice_args, len(self._slices))

    def sql(self, query: str) -> pd.DataFrame:
        """Run DuckDB SQL over the tables (see `table`). A trace kept in the cache is
        queried over its Parquet files in place; else the frames are read in place."""
        from neuron_explorer.sql import query_tables

        return query_tables(query, SQL_TABLES, self.table, self._parquet_file)

    @property
    def store_folder(self) -> str | None:
        """The folder of Parquet files this trace's tables are kept in (the trace cache's
        entry, or a converted trace), or None."""
        return self._store.folder if self._store is not None else None

    def _parquet_file(self, name: str) -> str | None:
        """The store's Parquet file of a table (written first for a derived one)."""
        store = self._store
        if store is None or not store.still_current():  # rebuilt since: the frames are ours
            return None
        if name in DERIVED and not store.has(name):
            getattr(self, name)  # computes it and writes it
        return store.file(name) if store.has(name) else None

    # --- facade over the analyses -----------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Headline numbers: hardware, steps, step time, MFU/HFU/MBU, busy share, counts."""
        from neuron_explorer.analyses.summary import summary

        return memoised(self, "summary", lambda: summary(self))

    def step_times(self) -> pd.DataFrame:
        """The analysed steps as the report times them: step, ts, host_dur (the host's
        window, as `steps` has it) and dur (as the run's pace sets it: where the device
        falls behind its host, the time between the ends of consecutive steps' device
        work). The step time is their median, `summary()["total_ns"]` their sum."""
        from neuron_explorer.analyses.device_pace import step_times

        return step_times(self)

    def phases(self) -> pd.DataFrame:
        """The run's steps by phase (train, eval, prefill, decode): phase, step, ts, dur,
        tokens; an eval pass inside a training step is its own row, not part of the step."""
        from neuron_explorer.analyses.phases import phases

        return phases(self)

    def serving(self) -> pd.DataFrame:
        """Per generation (a prefill and its decode steps): batch, prompt and new tokens,
        time to first token, time per output token (median, p90), tokens/s, the prefill's
        MFU, the decode steps' MBU, the KV cache held and its bytes per token."""
        from neuron_explorer.analyses.phases import serving

        return memoised(self, "serving", lambda: serving(self))

    def kv_cache(self) -> pd.DataFrame:
        """Per prefill and decode step: generation, phase, step, ts, held_bytes (device
        memory held through the step over its generation's prefill: the KV cache)."""
        from neuron_explorer.analyses.phases import kv_cache

        return memoised(self, "kv_cache", lambda: kv_cache(self))

    def token_times(self) -> pd.DataFrame:
        """Per generated token: generation, token, phase, step, ready (ns) and gap_ns (the
        time to first token, then each token's time after the one before)."""
        from neuron_explorer.analyses.phases import token_times

        return memoised(self, "token_times", lambda: token_times(self))

    def requests(self) -> pd.DataFrame:
        """Per request (marked with `neuron_explorer.request`, else each batch row of a
        generation): arrival, queueing, prompt and output tokens, time to first token,
        time per output token (median, p90), end-to-end latency."""
        from neuron_explorer.analyses.requests import requests

        return memoised(self, "requests", lambda: requests(self))

    def breakdown(self) -> pd.DataFrame:
        """Long form per step: step, side (device|host), category, ns, share."""
        from neuron_explorer.analyses.step_breakdown import breakdown

        return memoised(self, "breakdown", lambda: breakdown(self))

    def idle_reasons(self) -> pd.DataFrame:
        """Each device idle gap with its reason (host_launch, sync, data, compile, dependency)."""
        from neuron_explorer.analyses.idle import idle_gaps

        return memoised(self, "idle", lambda: idle_gaps(self))

    def stream_idle(self, hta_window: bool = False) -> pd.DataFrame:
        """Per device queue (stream): its idle time between kernels in HTA's categories
        (host_wait, kernel_wait, other), share, gaps; `hta_window`: over the kernels HTA
        keeps (launched in the trace, before the last step)."""
        from neuron_explorer.analyses.stream_idle import stream_idle

        return memoised(self, f"stream_idle:{hta_window}", lambda: stream_idle(self, hta_window))

    def kernel_sequences(self, n: int = 3, top: int | None = None, op: str | None = None,
                         hta_window: bool = False, compiled: bool = False) -> pd.DataFrame:
        """Frequent sequences of `n` kernels run back to back on one queue, launched by one
        op or one after another (candidates for fusion): sequence, count, total_ns,
        mean_ns, share, most frequent first (the `top` of them); `op`: HTA's patterns
        per op whose name holds it; `hta_window`: over the kernels HTA keeps; `compiled`:
        with compiled_ns, the device time of an occurrence's ops compiled into one
        program on our device (NaN where the trace cannot say)."""
        from neuron_explorer.analyses.kernel_sequences import kernel_sequences

        key = f"kernel_sequences:{(n, top, op, hta_window, compiled)!r}"
        return memoised(self, key,
                        lambda: kernel_sequences(self, n, top, op, hta_window, compiled))

    def annotations(self, hta_window: bool = False) -> pd.DataFrame:
        """Per user annotation region (`record_function` range) path: name, depth, count,
        host time, the device time of the work launched inside it (its innermost
        region's), nested regions' included, its span, share; `hta_window`: over the
        ranges and kernels HTA keeps (launched in the trace, before the last step)."""
        from neuron_explorer.analyses.annotations import annotation_regions

        return memoised(self, f"annotations:{hta_window}",
                        lambda: annotation_regions(self, hta_window))

    def counter_summary(self) -> pd.DataFrame:
        """Per counter series (`counter_series()`): device, samples, first and last sample,
        min, max, mean, time-weighted mean, last value (`trace.plot.counters()` draws them)."""
        from neuron_explorer.analyses.counter_series import counter_summary

        return memoised(self, "counter_summary", lambda: counter_summary(self))

    def counter_series(self) -> pd.DataFrame:
        """Every counter series' samples (series, track_id, device, ts, value): the trace's
        counter tracks, each copy kind's bandwidth (GB/s) and each CUPTI counter."""
        from neuron_explorer.analyses.counter_series import counter_series

        return memoised(self, "counter_series", lambda: counter_series(self))

    def copy_bandwidth(self, hta_window: bool = False) -> pd.DataFrame:
        """Per device and copy kind (`Memcpy HtoD`, `Memset`...), the bandwidth its copies
        use over time: device, copy, ts, gbps (HTA's memory-bandwidth series);
        `hta_window`: the copies HTA keeps."""
        from neuron_explorer.analyses.counter_series import copy_bandwidth

        return memoised(self, f"copy_bandwidth:{hta_window}",
                        lambda: copy_bandwidth(self, hta_window))

    def write_with_counters(self, path: str, hta_window: bool = False) -> str:
        """A copy of this PyTorch-profiler JSON trace at `path` with each stream's queue
        length and each copy kind's bandwidth as counter events (HTA's counters-augmented
        trace); returns the path."""
        from neuron_explorer.analyses.counter_series import write_with_counters

        return write_with_counters(self, path, hta_window)

    def cupti_counters(self) -> pd.DataFrame:
        """Per kernel profiled by CUPTI's range profiler: id, ts, dur, name, track_id,
        device, launch, top_level_op, bottom_level_op, flops (from the SASS instruction
        counters), then each counter (HTA's counter data with operators)."""
        from neuron_explorer.analyses.counter_series import cupti_counters

        return memoised(self, "cupti_counters", lambda: cupti_counters(self))

    def op_stats(self) -> pd.DataFrame:
        """Per op name: count, host and device time, FLOPs, bytes, share of step time."""
        from neuron_explorer.analyses.statistics import op_stats

        return memoised(self, "op_stats", lambda: op_stats(self))

    def module_stats(self) -> pd.DataFrame:
        """Per module path and phase: count, time, device time of its ops, FLOPs, share."""
        from neuron_explorer.analyses.statistics import module_stats

        return memoised(self, "module_stats", lambda: module_stats(self))

    def kernel_stats(self) -> pd.DataFrame:
        """Per kernel name: count, total/mean/max device time, FLOPs, bytes, share."""
        from neuron_explorer.analyses.statistics import kernel_stats

        return memoised(self, "kernel_stats", lambda: kernel_stats(self))

    def engine_utilisation(self, bin_ns: int | None = None) -> pd.DataFrame:
        """ts, device, engine, utilisation (0..1) in time bins."""
        from neuron_explorer.analyses.engine_utilisation import engine_utilisation

        return memoised(self, f"engine_util:{bin_ns}", lambda: engine_utilisation(self, bin_ns))

    def efficiency(self) -> pd.DataFrame:
        """Per step: model and executed FLOPs, bytes, MFU, HFU, MBU."""
        from neuron_explorer.analyses.efficiency import efficiency

        return memoised(self, "efficiency", lambda: efficiency(self))

    def roofline(self) -> pd.DataFrame:
        """Per op name: FLOPs, bytes, intensity, achieved FLOP/s, bound (compute|memory)."""
        from neuron_explorer.analyses.roofline import roofline

        return memoised(self, "roofline", lambda: roofline(self))

    def memory_timeline(self) -> pd.DataFrame:
        """ts, device, in_use_bytes: device memory in use over time."""
        from neuron_explorer.analyses.memory import memory_timeline

        return memoised(self, "memory_timeline", lambda: memory_timeline(self))

    def memory_at_peak(self) -> pd.DataFrame:
        """What holds device memory at its peak: op and module, bytes, share of the peak."""
        from neuron_explorer.analyses.memory import memory_at_peak

        return memoised(self, "memory_at_peak", lambda: memory_at_peak(self))

    def compile_summary(self) -> dict[str, pd.DataFrame]:
        """Compiled graphs, graph breaks and recompiles."""
        from neuron_explorer.analyses.compilation import compile_summary

        return memoised(self, "compile", lambda: compile_summary(self))

    def communication(self, hta_window: bool = False) -> pd.DataFrame:
        """Per device: compute and communication time, the overlapped part (`overlap_pct`:
        share of communication time that overlaps compute), exposed communication; over
        the analysed steps, or with `hta_window` over the kernels HTA keeps (HTA's
        `get_comm_comp_overlap`)."""
        from neuron_explorer.analyses.communication import communication

        return communication(self, hta_window)

    def temporal_breakdown(self, hta_window: bool = False) -> pd.DataFrame:
        """Per device, HTA's temporal breakdown: from the first kernel's start to the last
        one's end, the time idle, running computation, and only communication or memory
        work (ns and share); `hta_window`: over the kernels HTA keeps."""
        from neuron_explorer.analyses.communication import temporal_breakdown

        return memoised(self, f"temporal_breakdown:{hta_window}",
                        lambda: temporal_breakdown(self, hta_window))

    def critical_path(self, step: int | None = None) -> pd.DataFrame:
        """The chain of host work, launches, kernels and waits that sets each analysed
        step's length (or any recorded `step`'s, warm-up included): step, ts, dur, name,
        kind, category, track, rank; a step's segments are contiguous and sum to the
        step."""
        from neuron_explorer.analyses.critical_path import critical_path

        return memoised(self, f"critical_path:{step}", lambda: critical_path(self, step))

    def queue_length(self, hta_window: bool = False) -> pd.DataFrame:
        """Per device queue (stream), its length after each launch and each start: stream,
        track_id, ts, queue_length (the work launched to it that has not started);
        `hta_window`: without the last step's launches, as HTA counts."""
        from neuron_explorer.analyses.queue_length import queue_length

        return memoised(self, f"queue_length:{hta_window}",
                        lambda: queue_length(self, hta_window))

    def queue_length_summary(self, hta_window: bool = False, full: int = 1024) -> pd.DataFrame:
        """Per queue: count, mean, std, min, quartiles and max of its length over its
        samples (HTA's summary), its time-weighted mean, the share of time it was empty,
        and the time it held `full` launches or more (a CUDA stream's launch queue is full
        at 1024: the next launch blocks the host) and that time's share."""
        from neuron_explorer.analyses.queue_length import queue_length_summary

        return memoised(self, f"queue_length_summary:{hta_window}:{full}",
                        lambda: queue_length_summary(self, hta_window, full))

    def launch_stats(self, hta_window: bool = False) -> pd.DataFrame:
        """Per launched kernel, copy or memset: the launch call's (or op's) time, the
        kernel's, and its launch delay (HTA's kernel launch statistics); `launch_outliers`
        in `analyses.launch_stats` picks HTA's short, slow-launch and delayed groups."""
        from neuron_explorer.analyses.launch_stats import launch_stats

        return memoised(self, f"launch_stats:{hta_window}", lambda: launch_stats(self, hta_window))

    def op_kernels(self, hta_window: bool = False) -> pd.DataFrame:
        """Per ATen op and the kernels one call of it launched (in launch order): count,
        the mean delay from the op's start to its first launch call and from that call to
        its kernel (HTA's `get_aten_op_kernels_and_delay`); `hta_window`: the launches HTA
        keeps."""
        from neuron_explorer.analyses.launch_stats import op_kernels

        return memoised(self, f"op_kernels:{hta_window}", lambda: op_kernels(self, hta_window))

    def kernel_types(self, hta_window: bool = False) -> pd.DataFrame:
        """Per device: time covered by computation, communication and memory kernels and by
        their overlaps (HTA's kernel-type breakdown), share, and the plain sum per type;
        `hta_window`: over the steps HTA keeps (all but the last)."""
        from neuron_explorer.analyses.communication import kernel_types

        return kernel_types(self, hta_window)

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
        """Findings of every bottleneck rule, ranked by time lost, each after the fix it
        waits on."""
        from neuron_explorer.rules import run_rules

        return memoised(self, "bottlenecks", lambda: run_rules(self))

    # --- display --------------------------------------------------------------------------
    @cached_property
    def plot(self) -> TracePlot:
        """The trace's figures (plotly): `trace.plot.timeline()`, `.breakdown()`,
        `.roofline()`..."""
        from neuron_explorer.plot import TracePlot

        return TracePlot(self)

    def __repr__(self) -> str:
        return (f"<Trace {os.path.basename(self.path)}: {self.source_format}, "
                f"{len(self._slices)} slices, {len(self.steps)} steps>")

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
