"""The kernel being traced: its KernelBuilder, the source line of each instruction,
and the on-chip memory allocator.

A kernel runs as plain Python once per call; every language call appends engine
instructions to the builder and remembers the kernel line that issued them (the first
caller frame outside this package).
"""

from __future__ import annotations

import os
import sys
import weakref
from contextvars import ContextVar, Token
from types import FrameType
from typing import Self

from neuron_explorer.backend.hardware import KernelBuilder
from neuron_explorer.common.presets import HardwarePreset
from neuron_explorer.nki.errors import NkiError

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
current_trace: ContextVar[Trace | None] = ContextVar("nki_trace", default=None)


def caller_line() -> tuple[str, int]:
    """(file, line) of the innermost frame outside this package: the kernel's line."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and _in_package(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return ("<unknown>", 0)
    return (frame.f_code.co_filename, frame.f_lineno)


_INSIDE: dict[str, bool] = {}


def _in_package(filename: str) -> bool:
    inside = _INSIDE.get(filename)
    if inside is None:
        inside = _INSIDE[filename] = os.path.dirname(os.path.abspath(filename)) == _PACKAGE_DIR
    return inside


def where() -> str:
    path, line = caller_line()
    return f"{os.path.basename(path)}:{line}"


def current(api: str = "this call") -> Trace:
    trace = current_trace.get()
    if trace is None:
        raise NkiError(f"{api} can only be used inside an @nki.jit kernel while it runs "
                       "(call it through nki.simulate_kernel, nki.benchmark or with neuron "
                       "tensors)", where())
    return trace


class Allocator:
    """SBUF or PSUM, per partition. A tile holds its bytes while the kernel holds a
    reference to it. A new tile takes free space while there is some; when the memory
    is full it takes the space of the tiles freed longest ago, and its first write
    waits until their last accesses are done (buffer reuse, as the compiler rotates
    buffers). PSUM tiles still referenced past the capacity are an error; SBUF ones
    (`spills`) are the builder's to place: tiles live only from their first access to
    their last, and those that still do not fit spill to HBM (backend/hardware/spills.py).
    A single tile larger than the memory is an error."""

    def __init__(self, name: str, capacity: int, spills: bool = False) -> None:
        self.name = name
        self.capacity = capacity
        self.spills = spills
        self.live: dict[int, tuple[int, str]] = {}  # tile id -> (bytes, description)
        self.freed: list[tuple[int, list]] = []  # (bytes, accesses list), oldest first
        self.retained = 0  # bytes of freed tiles not yet reused
        self.peak = 0
        self.closed = False

    def allocate(self, key: int, nbytes: int, what: str, at: str) -> list[int]:
        """Reserve `nbytes` per partition; returns the instruction ids to wait for."""
        used = sum(b for b, _ in self.live.values())
        if nbytes > self.capacity:
            raise NkiError(f"{self.name} overflow: {what} needs {nbytes} B per partition, "
                           f"more than the {self.capacity} B of a partition: split it into "
                           "smaller tiles", at)
        if used + nbytes > self.capacity and not self.spills:
            biggest = sorted(self.live.values(), reverse=True)[:3]
            held = "; ".join(f"{d} ({b} B)" for b, d in biggest)
            raise NkiError(
                f"{self.name} overflow: {what} needs {nbytes} B per partition but "
                f"{used} B of {self.capacity} B are held by live tiles (largest: {held}). "
                "Use smaller tiles or drop references to tiles no longer needed", at)
        deps: list[int] = []
        while used + self.retained + nbytes > self.capacity and self.freed:
            size, accesses = self.freed.pop(0)
            self.retained -= size
            for _box, ids in accesses:
                deps.extend(ids)
        self.live[key] = (nbytes, what)
        self.peak = max(self.peak, used + nbytes)
        return deps

    def release(self, key: int, accesses: list) -> None:
        if self.closed or key not in self.live:
            return
        size, _ = self.live.pop(key)
        self.freed.append((size, accesses))
        self.retained += size


class Trace:
    """One run of a kernel: the builder, per-instruction lines, memory, numerics."""

    def __init__(self, preset: HardwarePreset, name: str, numerics: bool) -> None:
        self.preset = preset
        self.builder = KernelBuilder(preset, name)
        self.numerics = numerics
        self.lines: list[tuple[str, int]] = []  # per instruction id
        self.sbuf = Allocator("SBUF", preset.sbuf_partition_bytes, spills=True)
        self.psum = Allocator("PSUM", preset.psum_partition_bytes)
        self._next_tile = 0
        self._token: Token[Trace | None] | None = None
        self.grid: tuple[int, ...] = ()  # the SPMD launch grid; () for a plain call
        self.program: tuple[int, ...] = ()  # the running program's position in it
        self.shared_hbm: list = []  # HBM tensors the programs share, in creation order
        self._hbm_created = 0

    def start_program(self, program: tuple[int, ...]) -> None:
        self.program = program
        self._hbm_created = 0

    def hbm_tensor(self, make, shape: tuple, dtype: str, at: str):
        """The program's next HBM tensor: created by the first program of a grid and the
        same tensor for the others (nl.shared_hbm is shared by every program)."""
        k = self._hbm_created
        self._hbm_created += 1
        if k < len(self.shared_hbm):
            t = self.shared_hbm[k]
            if tuple(t.shape) != tuple(shape) or t.dtype != dtype:
                raise NkiError(f"HBM tensor {k} is {list(t.shape)} {t.dtype} in the first "
                               f"program but {list(shape)} {dtype} in program "
                               f"{self.program}: every program must allocate the same "
                               "outputs", at)
            return t, False
        t = make()
        self.shared_hbm.append(t)
        return t, True

    def __enter__(self) -> Self:
        self._token = current_trace.set(self)
        return self

    def __exit__(self, *exc) -> None:
        assert self._token is not None, "__exit__ without __enter__"
        current_trace.reset(self._token)
        self.sbuf.closed = self.psum.closed = True

    def tag(self, line: tuple[str, int]) -> None:
        """Attribute the instructions added since the last tag to `line`."""
        missing = len(self.builder) - len(self.lines)
        if missing > 0:
            self.lines.extend([line] * missing)

    def track(self, tile: object, buffer: str, nbytes: int, what: str, at: str,
              accesses: list, partitions: int) -> tuple[list[int], int | None]:
        """Allocate an on-chip tile; free its space when the kernel drops it. Returns the
        instruction ids its first write waits for and, for SBUF, its handle in the
        builder's allocation (`KernelBuilder.touch` its accesses)."""
        memory = self.sbuf if buffer == "sbuf" else self.psum
        key = self._next_tile
        self._next_tile += 1
        deps = memory.allocate(key, nbytes, what, at)
        weakref.finalize(tile, memory.release, key, accesses)
        handle = self.builder.sbuf_tile(nbytes, partitions, what) if memory.spills else None
        return deps, handle
