"""The cost of one collective on the simulated interconnect (closed forms, in ns).

The classic alpha-beta model: an algorithm takes some steps, each paying the latency of
the slowest link the group crosses (alpha), and moves some bytes over that link's
bandwidth (beta). With n ranks and S bytes:

- all-reduce, ring: 2(n-1) alpha + 2(n-1)/n S/B; tree: 2 ceil(log2 n) alpha + 2 S/B
  (the cheaper one is used, as collective libraries' tuners do);
- all-gather / reduce-scatter, ring: (n-1) alpha + (n-1)/n S/B (S: the full buffer);
- all-to-all, pairwise: (n-1) alpha + (n-1)/n S/B;
- broadcast: pipelined ring (n-1) alpha + S/B or tree ceil(log2 n)(alpha + S/B);
- send/recv: alpha + S/B; barrier: 2 ceil(log2 n) alpha.

Every collective also pays the fixed cost of starting its kernel. The link is the
slowest tier the group spans (cores of one chip, NeuronLink between chips, EFA between
instances): a ring has one edge in and one out of every chip and instance.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from neuron_explorer.backend.distributed.topology import Topology
from neuron_explorer.common.presets import HardwarePreset, interconnect_for

ALL_REDUCE = "all_reduce"
ALL_GATHER = "all_gather"
REDUCE_SCATTER = "reduce_scatter"
ALL_TO_ALL = "all_to_all"
BROADCAST = "broadcast"
SEND = "send"
RECV = "recv"
BARRIER = "barrier"


class Link(NamedTuple):
    """The slowest link of a group: its tier, bandwidth (B/ns) and per-step latency (ns)."""

    tier: str
    bytes_per_ns: float
    step_ns: int


class Cost(NamedTuple):
    """What a collective costs on the device: the algorithm used and its time."""

    algorithm: str
    transfer_ns: int


def link_for(preset: HardwarePreset, topology: Topology, ranks: tuple[int, ...]) -> Link:
    """The slowest link the ranks of a group must cross."""
    net = interconnect_for(preset)
    tier = topology.tier(ranks)
    if tier == "instance":
        return Link(tier, net.instance_link_bytes_per_ns, net.instance_step_ns)
    if tier == "chip":
        return Link(tier, preset.neuronlink_bytes_per_ns, net.chip_step_ns)
    return Link(tier, preset.dma_bytes_per_ns, net.core_step_ns)


def _ceil_log2(n: int) -> int:
    return max(1, math.ceil(math.log2(n)))


def collective_cost(collective: str, nbytes: int, n: int, link: Link, start_ns: int) -> Cost:
    """Time of `collective` moving `nbytes` among `n` ranks over `link` (module doc)."""
    alpha, beta = link.step_ns, 1.0 / link.bytes_per_ns
    if n <= 1:
        return Cost("local", start_ns)
    if collective == ALL_REDUCE:
        ring = 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes * beta
        tree = 2 * _ceil_log2(n) * alpha + 2 * nbytes * beta
        algorithm, t = ("ring", ring) if ring <= tree else ("tree", tree)
    elif collective in (ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL):
        algorithm = "pairwise" if collective == ALL_TO_ALL else "ring"
        t = (n - 1) * alpha + (n - 1) / n * nbytes * beta
    elif collective == BROADCAST:
        ring = (n - 1) * alpha + nbytes * beta
        tree = _ceil_log2(n) * (alpha + nbytes * beta)
        algorithm, t = ("ring", ring) if ring <= tree else ("tree", tree)
    elif collective in (SEND, RECV):
        algorithm, t = "p2p", alpha + nbytes * beta
    elif collective == BARRIER:
        algorithm, t = "tree", 2 * _ceil_log2(n) * alpha
    else:
        raise ValueError(f"no cost model for collective {collective!r}")
    return Cost(algorithm, start_ns + round(t))


def bus_bandwidth(collective: str, nbytes: int, n: int, seconds: float) -> float:
    """Bus bandwidth (bytes/s) as collective benchmarks report it: the algorithm bandwidth
    scaled by the share of the data each rank's link carries."""
    algbw = nbytes / seconds
    if collective == ALL_REDUCE:
        return algbw * 2 * (n - 1) / n
    if collective in (ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL):
        return algbw * (n - 1) / n
    return algbw
