"""Running a kernel: `nki.jit`, `nki.simulate_kernel` (numpy in, numpy out) and
`nki.benchmark` (the simulated schedule, with time per kernel source line).

A kernel runs as Python once per call. Its calls compute the numbers on the host and
issue engine instructions into a KernelBuilder; the builder's list scheduler then
times them on the preset's NeuronCore, engines running concurrently, each
instruction waiting only for the tiles it reads.
"""

from __future__ import annotations

import functools
import linecache
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from neuron_explorer.backend.hardware import KernelBuilder, get_preset
from neuron_explorer.backend.hardware.kernel import FIRST_DMA, Kernel
from neuron_explorer.backend.hardware.spills import SbufOverflow
from neuron_explorer.common.collector_pause import collector_paused
from neuron_explorer.common.engine_profile import ENGINE_COLUMNS, engine_profile, spill_profile
from neuron_explorer.nki import dtypes
from neuron_explorer.nki.errors import NkiError
from neuron_explorer.nki.sourced import with_sources
from neuron_explorer.nki.tensor import HBM, Tensor
from neuron_explorer.nki.trace import Trace


class JitKernel:
    """An `@nki.jit` kernel. Call it with `neuron` tensors (one launch on the device),
    with numpy arrays (as nki.simulate_kernel), or run it with `nki.benchmark`."""

    def __init__(self, func: Callable, grid: tuple[int, ...] = (), **options) -> None:
        functools.update_wrapper(self, func)
        self.func = func
        self.grid = grid
        self.options = options

    def __call__(self, *args, **kwargs):
        import torch
        if any(isinstance(a, torch.Tensor) for a in args):
            from neuron_explorer.nki.launch import launch
            return launch(self, args, kwargs)
        return simulate_kernel(self, *args, **kwargs)

    def __getitem__(self, grid) -> JitKernel:
        """An SPMD launch: `kernel[4](...)` or `kernel[2, 2](...)` runs one program per
        grid point, each seeing its `nl.program_id(axis)`; they share the HBM tensors."""
        dims = grid if isinstance(grid, tuple) else (grid,)
        if not dims or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0
                               for d in dims):
            raise NkiError(f"{self.func.__name__}[{grid!r}]: a launch grid is one or more "
                           "positive ints, e.g. kernel[4](...) or kernel[2, 2](...)")
        return JitKernel(self.func, grid=dims, **self.options)

    def __repr__(self) -> str:
        return f"<nki.jit kernel {self.func.__qualname__}>"


def jit(func: Callable | None = None, **options):
    """Decorate an NKI kernel (`@nki.jit` or `@nki.jit(...)`)."""
    if func is None:
        return lambda f: JitKernel(f, **options)
    return JitKernel(func, **options)


@dataclass
class Run:
    """One traced run: the outputs, the scheduled kernel, each instruction's line."""

    name: str
    outputs: object  # numpy array(s), or None without numerics
    kernel: Kernel
    lines: list[tuple[str, int]]
    output_dtypes: object  # the dtype name of each output, shaped like `outputs`
    output_shapes: object  # the shape of each output, shaped like `outputs`
    sbuf_peak: int
    psum_peak: int
    builder: KernelBuilder | None = None  # the KernelBuilder before scheduling (its dependencies)


def _as_hbm(arg, numerics: bool, i: int):
    values = getattr(arg, "values", None)
    if isinstance(values, np.ndarray):  # launch.HostArg: values with their dtype
        dtype = dtypes.normalize(arg.dtype)
        return Tensor(values.shape, dtype, HBM, name=f"arg{i}",
                      data=dtypes.cast(values, dtype).copy() if numerics else None,
                      initialized=True, at="kernel argument")
    if isinstance(arg, np.ndarray) or (hasattr(arg, "shape") and hasattr(arg, "dtype")):
        dtype = dtypes.normalize(arg.dtype)
        data = None
        if numerics:
            if not isinstance(arg, np.ndarray):
                raise NkiError(f"argument {i} has no values ({type(arg).__name__}); pass a "
                               "numpy array, or run without numerics (nki.benchmark)")
            data = dtypes.cast(arg, dtype).copy()
        return Tensor(arg.shape, dtype, HBM, name=f"arg{i}", data=data, initialized=True,
                      at="kernel argument")
    return arg


def _outputs(result):
    if isinstance(result, Tensor):
        return result.data
    if isinstance(result, (tuple, list)):
        return type(result)(_outputs(r) for r in result)
    return result


def _output_meta(result, field: str):
    if isinstance(result, Tensor):
        return getattr(result, field)
    if isinstance(result, (tuple, list)):
        return type(result)(_output_meta(r, field) for r in result)
    return None


def run(kernel, args: tuple, kwargs: dict, preset="trn2", numerics: bool = True) -> Run:
    """`kernel` traced, scheduled and (with `numerics`) computed on the simulated core."""
    with collector_paused():  # a kernel's objects accumulate until its end
        return _run(kernel, args, kwargs, preset, numerics)


def _run(kernel, args: tuple, kwargs: dict, preset, numerics: bool) -> Run:
    func = kernel.func if isinstance(kernel, JitKernel) else kernel
    p = get_preset(preset) if isinstance(preset, str) else preset
    trace = Trace(p, func.__name__, numerics)
    grid = getattr(kernel, "grid", ()) or ()
    with trace:
        hbm_args = [_as_hbm(a, numerics, i) for i, a in enumerate(args)]
        trace.grid = grid
        result = None
        # the grid's programs one after another on the one NeuronCore: their instructions
        # are scheduled together, so independent programs overlap on the engines
        for program in np.ndindex(*grid) if grid else [()]:
            trace.start_program(program)
            result = func(*hbm_args, **kwargs)
    b = trace.builder
    trace.tag(("<kernel>", 0))
    try:  # the compiler's allocation: what does not fit spills (backend/hardware/spills.py)
        served = b.place_tiles()
    except SbufOverflow as e:
        path, line = trace.lines[e.instruction]
        raise NkiError(str(e), f"{os.path.basename(path)}:{line}") from None
    trace.lines.extend(trace.lines[i] for i in served)  # a spill counts for its line
    # referenced tiles past the capacity: the high-water is the allocation's
    sbuf_peak = trace.sbuf.peak if trace.sbuf.peak <= trace.sbuf.capacity else b.sbuf_tile_peak
    b.note_sbuf(sbuf_peak * p.partitions)
    b.note_psum(trace.psum.peak * p.partitions)
    built = with_sources(b.build(), trace.lines)
    outputs = _outputs(result) if numerics else None
    return Run(func.__name__, outputs, built, trace.lines, _output_meta(result, "dtype"),
               _output_meta(result, "shape"), sbuf_peak, trace.psum.peak, b)


def simulate_kernel(kernel, *args, preset="trn2", **kwargs):
    """Run `kernel` on numpy arrays on the simulated NeuronCore; returns its outputs as
    numpy arrays (bfloat16/fp8 values come back as float32 arrays holding them)."""
    return run(kernel, args, kwargs, preset, numerics=True).outputs


def benchmark(kernel, *args, preset="trn2", numerics: bool = False, **kwargs) -> Benchmark:
    """Time `kernel` on the simulated NeuronCore. Arguments are numpy arrays or anything
    with `shape` and `dtype` (without numerics only shapes are needed, so large shapes
    cost only the scheduling)."""
    return Benchmark(run(kernel, args, kwargs, preset, numerics))


@dataclass
class LineTime:
    """Engine time issued by one kernel source line."""

    file: str
    line: int
    source: str
    ns: dict[str, int]  # engine -> busy ns of this line's instructions
    instructions: int
    stall_ns: dict[str, int]  # engine -> idle time before this line's instructions

    @property
    def location(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}"

    @property
    def total_ns(self) -> int:
        return sum(self.ns.values())


def stall_before(engine: np.ndarray, start: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Per instruction, how long its engine (or DMA queue) sat idle just before it,
    waiting for its inputs: start minus the latest end of the earlier instructions of
    the same stream (streams run in order)."""
    stall = np.zeros(len(engine), np.int64)
    end = start + dur
    for e in np.unique(engine):
        idx = np.flatnonzero(engine == e)
        order = idx[np.argsort(start[idx], kind="stable")]
        prev_end = np.maximum.accumulate(np.concatenate(([0], end[order][:-1])))
        stall[order] = np.maximum(start[order] - prev_end, 0)
    return stall


class Benchmark:
    """A kernel's simulated timing: total, per engine, per source line, and the schedule."""

    def __init__(self, run_: Run) -> None:
        self.run = run_
        self.kernel = run_.kernel
        self.outputs = run_.outputs

    @property
    def duration_ns(self) -> int:
        return int(self.kernel.duration_ns)

    @property
    def latency_us(self) -> float:
        return self.duration_ns / 1e3

    @property
    def engine_busy_ns(self) -> dict[str, int]:
        return dict(self.kernel.engine_busy_ns)

    def profile(self) -> dict:
        """Engine busy % (DMA: its queues' union), DMA/compute overlap %, SBUF/PSUM
        high-water marks (bytes over all partitions), the critical engine, and SBUF
        spills: `spill_bytes` (stores and reloads), `reload_bytes`, `spill_ns` (their
        time with no compute engine busy)."""
        a = self.kernel.arrays()
        engine = np.array(ENGINE_COLUMNS)[np.minimum(a["engine"], FIRST_DMA)]
        end = a["start"] + a["dur"]
        out = engine_profile(engine, a["start"], end, self.duration_ns)
        opcode = np.array(self.kernel.opcodes, dtype=object)[a["opcode"]]
        spills = spill_profile(engine, opcode, a["bytes"], a["start"], end)
        p = self.kernel
        return {**out, "sbuf_bytes": int(p.sbuf_bytes), "psum_bytes": int(p.psum_bytes),
                **spills}

    def sources(self) -> list[str]:
        """'file:line' of each instruction, in issue order."""
        return [f"{os.path.basename(f)}:{n}" for f, n in self.run.lines]

    def schedule(self) -> list[dict]:
        """Each instruction: engine, opcode, start_ns, dur_ns, bytes, flops, source."""
        src = self.sources()
        return [dict(zip(("engine", "opcode", "start_ns", "dur_ns", "bytes", "flops"), row,
                         strict=True), source=s)
                for row, s in zip(self.kernel.instructions(), src, strict=True)]

    def line_times(self) -> list[LineTime]:
        """Engine time per kernel source line, in line order (DMA queues summed)."""
        a = self.kernel.arrays()
        engine = np.minimum(a["engine"], FIRST_DMA)
        keys = sorted(set(self.run.lines))
        index = {k: i for i, k in enumerate(keys)}
        row = np.fromiter((index[k] for k in self.run.lines), np.int64, len(self.run.lines))
        busy = np.zeros((len(keys), len(ENGINE_COLUMNS)), np.int64)
        np.add.at(busy, (row, engine), a["dur"])
        counts = np.bincount(row, minlength=len(keys))
        stall = np.zeros_like(busy)
        np.add.at(stall, (row, engine), stall_before(a["engine"], a["start"], a["dur"]))
        return [LineTime(f, n, linecache.getline(f, n).strip() if n else "",
                         {e: int(busy[i, j]) for j, e in enumerate(ENGINE_COLUMNS)
                          if busy[i, j]}, int(counts[i]),
                         {e: int(stall[i, j]) for j, e in enumerate(ENGINE_COLUMNS)
                          if stall[i, j]})
                for i, (f, n) in enumerate(keys)]

    def table(self) -> str:
        """A line profile: each source line with its engine time and the compute engines'
        stall before its instructions (waiting for their inputs)."""
        head = (f"{'line':<28}" + "".join(f"{e:>12}" for e in ENGINE_COLUMNS)
                + f"{'stall':>12}  source")
        rows = [head]
        for lt in self.line_times():
            cells = "".join(f"{lt.ns.get(e, 0) / 1e3:>10.1f}us" for e in ENGINE_COLUMNS)
            stall = sum(v for e, v in lt.stall_ns.items() if e != "dma") / 1e3
            rows.append(f"{lt.location:<28}{cells}{stall:>10.1f}us  {lt.source}")
        rows.append(f"total {self.duration_ns / 1e3:.1f} us")
        return "\n".join(rows)
