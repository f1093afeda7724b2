"""What a kernel would take with its SBUF tiles rotated: each write into a tile in a fresh
buffer, as a tile allocated inside its loop gets one, instead of the one buffer the kernel
reuses.

A tile allocated once, before a loop, serialises the loop: each iteration's load into it
waits until the last iteration's compute has read it (write after read), so DMA and
compute take turns. Rotated, the next loads run while this iteration computes. The
kernel is scheduled again without those waits (a write into an SBUF tile waiting for an
earlier access to the same tile, where the write does not itself read what that access
wrote); every other dependency, and the schedule's engines and queues, stay. SBUF's room
for the extra buffers is not checked: a kernel whose tiles fill SBUF gets less than this.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from neuron_explorer.backend.hardware import spills

if TYPE_CHECKING:
    from neuron_explorer.backend.hardware.builder import KernelBuilder


def rotated_length_ns(builder: KernelBuilder) -> int:
    """The kernel's length scheduled with its SBUF tiles rotated (after `build()`)."""
    return builder.length_with(rotated_deps(builder))


def rotated_deps(builder: KernelBuilder) -> list[tuple[int, ...]]:
    """Each instruction's dependencies without the waits a rotated buffer removes."""
    n = len(builder)
    tile = np.frombuffer(builder._touch_tile, np.int64)
    lo = np.frombuffer(builder._touch_lo, np.int64)
    hi = np.frombuffer(builder._touch_hi, np.int64)
    mode = np.frombuffer(builder._touch_write, np.int8)
    # one row per (instruction, tile, mode) access
    count = hi - lo + 1
    ids = np.repeat(lo - np.cumsum(np.r_[0, count[:-1]]), count) + np.arange(count.sum())
    tiles, writes = np.repeat(tile, count), np.repeat(mode != spills.READ, count)
    written: dict[int, set[int]] = {}
    read: dict[int, set[int]] = {}
    for i, t, w in zip(ids.tolist(), tiles.tolist(), writes.tolist(), strict=True):
        (written if w else read).setdefault(i, set()).add(t)
    out = list(builder._deps)
    for i, mine in written.items():
        if i >= n or not out[i]:
            continue
        reads = read.get(i, set())
        out[i] = tuple(d for d in out[i]
                       if not (mine & (written.get(d, set()) | read.get(d, set())))
                       or reads & written.get(d, set()))
    return out
