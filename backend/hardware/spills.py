"""SBUF allocation of a kernel's declared tiles, and the spills when they do not fit.

A kernel may declare its SBUF tiles (`KernelBuilder.sbuf_tile`) and which instructions
read and write them (`KernelBuilder.touch`). As the Neuron compiler allocates a traced
kernel, a tile then holds its bytes per partition from its first access to its last
(its live range: NKI's allocation assigns "an address to a tile at its first write and
releases the address after its last read"), not while a Python reference to it exists;
a write of all of a tile starts a new value, so a buffer rewritten in a loop holds
nothing between its last read and the next write.

When the values live at some point need more than one partition's SBUF, those that
do not fit go to HBM (the runtime's scratchpad) and come back before their next use,
as the compiler's spill and reload code does. What goes is chosen by the next use,
furthest first (Belady's rule, what an allocator that sees the whole kernel can do),
among the values the instruction at hand does not touch; whole tiles go, as many as
the excess needs. A spill stores the value after the writes that made it and frees
its space when the store is done; a reload reads it back, into space freed by values
whose live range ended (the longest ago first) or by further spills, before the
instruction that needs it, which waits for it. A value stored once and not written
since is dropped without a second store. The stores and reloads run on their own DMA
queues (the Neuron profiler's spill/reload queues), as `DmaSpill` and `DmaReload`
instructions, so they can stall compute.

A kernel whose live values always fit is left as it was: no instruction and no
dependency is added, its time does not change.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from neuron_explorer.backend.hardware.builder import KernelBuilder


# `KernelBuilder.touch` codes: a read, a write of part of the tile, a write of all of it
READ, WRITE, WHOLE = 0, 1, 2


class SbufOverflow(ValueError):
    """The tiles one instruction reads and writes need more than a partition's SBUF."""

    def __init__(self, message: str, instruction: int) -> None:
        super().__init__(message)
        self.instruction = instruction


class Accesses:
    """The declared accesses in instruction order, each to a value: a tile's data from a
    write of all of it (or its first access) to just before the next such write. A value
    is what lives, spills and reloads (a buffer rewritten in a loop holds one value per
    iteration, dead between its last read and the next write)."""

    def __init__(self, b: KernelBuilder) -> None:
        tile = np.array(b._touch_tile, np.int64)
        lo = np.array(b._touch_lo, np.int64)
        hi = np.array(b._touch_hi, np.int64)
        code = np.array(b._touch_write, np.int8)
        order = np.lexsort((lo, tile))  # by tile, then instruction (stable)
        t, start = tile[order], lo[order]
        new_tile = np.r_[True, t[1:] != t[:-1]] if len(t) else np.zeros(0, bool)
        # a whole write by a later instruction than the tile's previous access
        rewrite = (code[order] == WHOLE) & np.r_[True, start[1:] != start[:-1]]
        segment = np.empty(len(t), np.int64)
        segment[order] = np.cumsum(new_tile | rewrite) - 1
        by_lo = np.argsort(lo, kind="stable")
        self.value = segment[by_lo]
        self.lo, self.hi, self.code = lo[by_lo], hi[by_lo], code[by_lo]
        n = int(segment.max()) + 1 if len(segment) else 0
        self.tile = np.zeros(n, np.int64)  # each value's tile
        self.tile[segment] = tile
        size = np.array([x[0] for x in b._tiles] or [0], np.int64)
        self.size = size[self.tile]  # bytes per partition of each value

    def live_peak(self) -> int:
        """The highest sum of live values' bytes per partition, a value living from its
        first access to its last."""
        if not len(self.value):
            return 0
        n = len(self.tile)
        first = np.full(n, np.iinfo(np.int64).max, np.int64)
        last = np.full(n, -1, np.int64)
        np.minimum.at(first, self.value, self.lo)
        np.maximum.at(last, self.value, self.hi)
        points = np.concatenate([first, last + 1])
        deltas = np.concatenate([self.size, -self.size])
        order = np.lexsort((deltas, points))  # at one point, ends before starts
        return int(np.max(np.cumsum(deltas[order]), initial=0))


def place(b: KernelBuilder) -> list[int]:
    """Allocate the declared tiles' values; add the spills and reloads they need.
    Returns, for each instruction added, the instruction it was added for (the one that
    reads the value it reloads, or whose new value needed the space)."""
    capacity = b.preset.sbuf_partition_bytes
    acc = Accesses(b)
    peak = acc.live_peak()
    b.sbuf_tile_peak = min(peak, capacity)
    if peak <= capacity:
        return []
    return _Placement(b, capacity, acc).run()


class _Placement:
    """One sweep over the accesses in instruction order, keeping what is resident."""

    def __init__(self, b: KernelBuilder, capacity: int, acc: Accesses) -> None:
        self.b = b
        self.capacity = capacity
        self.value, self.lo, self.hi = acc.value.tolist(), acc.lo.tolist(), acc.hi.tolist()
        self.write = (acc.code != READ).tolist()
        self.tile = acc.tile.tolist()
        self.size = acc.size.tolist()
        n = len(self.size)
        self.uses: list[list[int]] = [[] for _ in range(n)]  # each value's access points
        for v, first in zip(self.value, self.lo, strict=True):
            uses = self.uses[v]
            if not uses or uses[-1] != first:
                uses.append(first)
        self.next = [0] * n  # index of each value's next access point in `uses`
        self.resident: set[int] = set()
        self.seen = [False] * n
        self.stored: list[tuple[int, ...]] = [()] * n  # the spill store of its HBM copy
        self.dirty = [False] * n  # written since its last store
        self.last: list[dict[int, int]] = [{} for _ in range(n)]  # engine -> last access
        self.writes: list[dict[int, int]] = [{} for _ in range(n)]  # since its last store
        self.untouched = capacity  # never used yet
        self.freed: deque[list] = deque()  # [bytes, ids to wait for], oldest first
        self.used = 0
        self.peak = 0
        self.origin: list[int] = []

    def run(self) -> list[int]:
        i, n = 0, len(self.value)
        while i < n:
            j = i
            while j < n and self.lo[j] == self.lo[i]:
                j += 1
            self._instruction(range(i, j))
            i = j
        self.b.sbuf_tile_peak = self.peak
        return self.origin

    def _instruction(self, events: range) -> None:
        at = self.lo[events[0]]
        values = list(dict.fromkeys(self.value[k] for k in events))
        for v in values:
            uses, k = self.uses[v], self.next[v]
            while k < len(uses) and uses[k] <= at:
                k += 1
            self.next[v] = k
        touching = set(values)
        for v in values:
            if v in self.resident:
                continue
            waits = self._acquire(self.size[v], touching, at)
            ids = [i for k in events if self.value[k] == v
                   for i in range(self.lo[k], self.hi[k] + 1)]
            if self.seen[v]:  # spilled: reload it before this instruction
                before = len(self.b)
                reload = self.b.spill_transfer(self._nbytes(v), self._partitions(v),
                                               self.stored[v] + tuple(waits), store=False)
                self.origin.extend([at] * (len(self.b) - before))
                self.last[v] = {self.b._engine[r]: r for r in reload}
                waits = list(reload)
            self.b.wait_for(ids, waits)
            self.seen[v] = True
            self.resident.add(v)
            self.used += self.size[v]
            self.peak = max(self.peak, self.used)
        engine = self.b._engine
        for k in events:
            v = self.value[k]
            for i in range(self.lo[k], self.hi[k] + 1):
                self.last[v][engine[i]] = i
                if self.write[k]:
                    self.writes[v][engine[i]] = i
                    self.dirty[v] = True
        for v in values:
            if self.next[v] >= len(self.uses[v]):  # its last access: the space is free
                self.resident.discard(v)
                self.used -= self.size[v]
                self.freed.append([self.size[v], list(self.last[v].values())])

    def _partitions(self, v: int) -> int:
        return self.b._tiles[self.tile[v]][1]

    def _nbytes(self, v: int) -> int:
        return self.size[v] * self._partitions(v)

    def _acquire(self, nbytes: int, touching: set[int], at: int) -> list[int]:
        """Space for `nbytes` per partition: never used, then freed the longest ago, then
        spilled; returns the instructions whose accesses to that space come first."""
        waits: list[int] = []
        take = min(self.untouched, nbytes)
        self.untouched -= take
        nbytes -= take
        while nbytes > 0 and self.freed:
            entry = self.freed[0]
            waits.extend(entry[1])
            if entry[0] > nbytes:
                entry[0] -= nbytes
                return waits
            nbytes -= entry[0]
            self.freed.popleft()
        while nbytes > 0:
            victims = [t for t in self.resident if t not in touching]
            if not victims:
                names = ", ".join(dict.fromkeys(self.b._tiles[self.tile[v]][2]
                                                or f"tile {self.tile[v]}" for v in touching))
                raise SbufOverflow(
                    f"SBUF overflow: the tiles one instruction reads and writes ({names}) "
                    f"need more than the {self.capacity} B of a partition", at)
            v = max(victims, key=lambda t: (self._next_use(t), self.size[t]))
            freed = self._spill(v, at)
            if self.size[v] > nbytes:  # the rest of its space is free for later tiles
                self.freed.appendleft([self.size[v] - nbytes, list(freed)])
            waits.extend(freed)
            nbytes -= self.size[v]
        return waits

    def _next_use(self, v: int) -> int:
        uses, k = self.uses[v], self.next[v]
        return uses[k] if k < len(uses) else 1 << 62

    def _spill(self, v: int, at: int) -> list[int]:
        """Store value `v` (unless HBM holds it already) and give up its space;
        returns what a new tenant of the space waits for."""
        if self.dirty[v]:
            before = len(self.b)
            store = self.b.spill_transfer(self._nbytes(v), self._partitions(v),
                                          tuple(self.writes[v].values()), store=True)
            self.origin.extend([at] * (len(self.b) - before))
            self.stored[v] = store
            self.dirty[v] = False
            self.writes[v] = {}
        waits = list(self.stored[v]) + list(self.last[v].values())
        self.last[v] = {}
        self.resident.discard(v)
        self.used -= self.size[v]
        return waits
