"""Device memory: host buffers relabelled as `neuron` storages, counted against HBM.

A neuron storage's data pointer is a host buffer's; the host buffer is kept alive by
a `Block` hung on the storage's Python object (PyTorch preserves that object for
the storage's whole life), and the Block's release is what frees the device bytes.
Each device may hold at most its share of the chip's HBM; past that, allocation
raises `torch.OutOfMemoryError` worded like CUDA's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from neuron_explorer.backend.clock import clock
from neuron_explorer.backend.events import MemoryChange, hub

# It returns an UntypedStorage; torch's stub says Storage.
_construct_storage: Callable[[int, torch.device, int], torch.UntypedStorage] = (
    torch._C._construct_storage_from_data_pointer)  # type: ignore[assignment]
_host_storage = torch.UntypedStorage
_perf_ns = clock.real_ns  # exclusions in the clock's own measure

GIB = 1 << 30
MIB = 1 << 20
UNKNOWN_NUMEL = 1 << 62


class AllocationContext:
    """The op being emulated, so that allocations it makes can name it (set only while a
    sink listens), and whether device accounting is suspended (a compiled graph runs)."""

    op_id: int | None = None
    # The op's host start: its allocations and releases are dated there. The clock read
    # inside the emulation runs ahead (the emulation is excluded only when the op ends),
    # so an op's allocations were dated after its end, some after the program's exit.
    host_ns = 0
    suspended: bool = False


context = AllocationContext()


class MemoryStats:
    """Live and peak bytes of one device, with the counters `memory_stats` reports."""

    __slots__ = (
        "alloc_count",
        "allocated_total",
        "capacity",
        "device",
        "free_count",
        "freed_total",
        "in_use",
        "oom_count",
        "peak",
    )

    def __init__(self, device: int, capacity: int) -> None:
        self.device = device
        self.capacity = capacity
        self.in_use = 0
        self.peak = 0
        self.alloc_count = 0
        self.free_count = 0
        self.allocated_total = 0
        self.freed_total = 0
        self.oom_count = 0

    def as_dict(self) -> dict[str, int]:
        """The subset of CUDA's `memory_stats` keys this device can answer."""
        return {
            "allocated_bytes.all.current": self.in_use,
            "allocated_bytes.all.peak": self.peak,
            "allocated_bytes.all.allocated": self.allocated_total,
            "allocated_bytes.all.freed": self.freed_total,
            "allocation.all.allocated": self.alloc_count,
            "allocation.all.freed": self.free_count,
            "allocation.all.current": self.alloc_count - self.free_count,
            "num_ooms": self.oom_count,
        }


class Block:
    """Owns the host buffer behind one neuron storage; releasing it frees device bytes."""

    __slots__ = ("__weakref__", "host", "made_by", "max_view_numel", "nbytes", "stats", "views")

    def __init__(self, host: torch.UntypedStorage, nbytes: int, stats: MemoryStats) -> None:
        self.host = host
        self.nbytes = nbytes
        self.stats = stats
        # the id of the op that last wrote it while recorded (0: none): the data flow a
        # what-if replay of the run compiled fuses along
        self.made_by = 0
        # At least the elements of any view of this memory (zero sizes read as 1): its
        # bytes, until a larger (expanded) view is made; unknown for an empty block,
        # whose (n, 0) views can still make an (n, m) product.
        self.max_view_numel = nbytes or UNKNOWN_NUMEL
        # CPU views of this memory by (offset, shape, stride, dtype): kept here, not on
        # the tensors, so that pickling a tensor never carries a host copy along.
        self.views: dict[tuple, torch.Tensor] = {}

    def __del__(self) -> None:
        stats = self.stats
        stats.in_use -= self.nbytes
        stats.free_count += 1
        stats.freed_total += self.nbytes
        if not hub.active:
            return  # only a recorded run shows the host clock: nothing to keep off it
        real_start, now = clock.stamp()
        # A release inside an op's emulation (an out= resize, a replaced storage) names
        # that op; one between ops names none.
        op_id = context.op_id
        hub.memory_changed(MemoryChange(stats.device, now if op_id is None else context.host_ns,
                                        -self.nbytes, stats.in_use, op_id))
        # Returning a large host buffer to the OS (munmap) takes real time the chip would
        # not spend: release it here and keep that off the clock, unless it happens inside
        # an op's emulation or a compiled graph, whose whole interval is excluded already.
        del self.views, self.host
        if context.op_id is None and not context.suspended:
            clock.exclude(_perf_ns() - real_start)


def _format_bytes(n: int) -> str:
    if n >= GIB:
        return f"{n / GIB:.2f} GiB"
    if n >= MIB:
        return f"{n / MIB:.2f} MiB"
    return f"{n / 1024:.2f} KiB" if n >= 1024 else f"{n} bytes"


def out_of_memory(stats: MemoryStats, nbytes: int) -> torch.OutOfMemoryError:
    """The error for `nbytes` that do not fit (counted in `num_ooms`), worded like CUDA's."""
    stats.oom_count += 1
    free = stats.capacity - stats.in_use
    return torch.OutOfMemoryError(
        f"neuron out of memory. Tried to allocate {_format_bytes(nbytes)}. "
        f"neuron:{stats.device} has a total capacity of {_format_bytes(stats.capacity)} "
        f"of which {_format_bytes(free)} is free. Of the allocated memory "
        f"{_format_bytes(stats.in_use)} is allocated by PyTorch. Try a smaller batch size "
        "or model, free tensors you no longer need (del, then let them go out of scope), "
        "or pick a preset with more HBM per core (NEURON_HARDWARE=trn3)."
    )


def allocate(stats: MemoryStats, nbytes: int, device: torch.device,
             op_id: int | None = None) -> torch.UntypedStorage:
    """A new neuron storage of `nbytes` on `device` (uninitialised), counted in `stats`."""
    if stats.in_use + nbytes > stats.capacity:  # before taking the host memory
        raise out_of_memory(stats, nbytes)
    host = _host_storage(nbytes)
    storage = _construct_storage(host.data_ptr(), device, nbytes)
    attach(stats, storage, host, op_id)
    return storage


def adopt(stats: MemoryStats, host: torch.UntypedStorage, device: torch.device,
          op_id: int | None = None) -> torch.UntypedStorage:
    """Relabel a host storage the emulation just filled as a neuron storage (no copy)."""
    storage = _construct_storage(host.data_ptr(), device, host.nbytes())
    attach(stats, storage, host, op_id)
    return storage


def attach(stats: MemoryStats, storage: torch.UntypedStorage, host: torch.UntypedStorage,
           op_id: int | None = None) -> Block:
    """Make `host` the memory behind neuron `storage` (which already points at it)."""
    nbytes = host.nbytes()
    in_use = stats.in_use + nbytes
    if in_use > stats.capacity:
        raise out_of_memory(stats, nbytes)
    # torch preserves a storage's Python object, and the attributes set on it
    storage._neuron_block = block = Block(host, nbytes, stats)  # type: ignore[attr-defined]
    stats.in_use = in_use
    stats.alloc_count += 1
    stats.allocated_total += nbytes
    stats.peak = max(stats.peak, in_use)
    if hub.active:
        if op_id is None and context.op_id is not None:
            op_id, now = context.op_id, context.host_ns
        else:
            now = clock.now()
        block.made_by = op_id or 0  # the op whose result this memory holds
        hub.memory_changed(MemoryChange(stats.device, now, nbytes, in_use, op_id))
    return block


def block_of(storage: torch.UntypedStorage) -> Block:
    """The Block `attach` hung on a neuron storage."""
    return storage._neuron_block  # type: ignore[attr-defined]  # set by attach


def swap_blocks(a: torch.UntypedStorage, b: torch.UntypedStorage) -> None:
    """Exchange the Blocks of two neuron storages whose data pointers were swapped."""
    a._neuron_block, b._neuron_block = b._neuron_block, a._neuron_block  # type: ignore[attr-defined]
