"""The cost of one collective on the simulated interconnect (closed forms, in ns).

The classic alpha-beta model: an algorithm takes some steps, each paying the latency of
the slowest link the group crosses (alpha), and moves some bytes over that link's
bandwidth (beta); a reduction also combines E elements at R per ns. With n ranks, S bytes
and E elements:

- all-reduce, ring: 2(n-1) alpha + 2(n-1)/n S/B + (n-1)/n E/R; tree: 2 ceil(log2 n) alpha
  + 2 S/B + E/R (the cheaper one is used, as collective libraries' tuners do);
- reduce-scatter, ring: (n-1) alpha + (n-1)/n (S/B + E/R) (S: the full buffer);
- all-gather, ring, and all-to-all, pairwise: (n-1) alpha + (n-1)/n S/B;
- broadcast: pipelined ring (n-1) alpha + S/B or tree ceil(log2 n)(alpha + S/B);
- send/recv: alpha + S/B; barrier: 2 ceil(log2 n) alpha.

Every collective also pays the fixed cost of starting it. The link is the slowest tier the
group spans (cores of one chip, NeuronLink between chips, EFA between instances): a ring
has one edge in and one out of every chip and instance. The figures are calibrated on
AWS's nccom-test results for trn1 (common/presets.py INTERCONNECTS).
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
    """What a collective costs on the device: the algorithm and link used (the trace shows
    it, e.g. "ring over the core link") and its time."""

    algorithm: str
    transfer_ns: int


def link_for(preset: HardwarePreset, topology: Topology, ranks: tuple[int, ...]) -> Link:
    """The outermost link the ranks of a group must cross (its step latency), at the lowest
    bandwidth of the links the group's ring uses: two ranks on one chip put a core-to-core
    edge in the ring, and on trn1 that link is slower than NeuronLink."""
    net = interconnect_for(preset)
    tier = topology.tier(ranks)
    chips = {topology.chip_of(r) for r in ranks}
    core = net.core_link_bytes_per_ns if len(chips) < len(set(ranks)) else math.inf
    if tier == "instance":
        spans_chips = len(chips) > len({topology.instance_of(r) for r in ranks})
        chip = preset.neuronlink_bytes_per_ns if spans_chips else math.inf
        return Link(tier, min(net.instance_link_bytes_per_ns, chip, core),
                    net.instance_step_ns)
    if tier == "chip":
        return Link(tier, min(preset.neuronlink_bytes_per_ns, core), net.chip_step_ns)
    return Link(tier, net.core_link_bytes_per_ns, net.core_step_ns)


def _ceil_log2(n: int) -> int:
    return max(1, math.ceil(math.log2(n)))


def collective_cost(collective: str, nbytes: int, n: int, link: Link, start_ns: int,
                    itemsize: int = 4, reduce_elements_per_ns: float = math.inf) -> Cost:
    """Time of `collective` moving `nbytes` (elements of `itemsize` bytes) among `n` ranks
    over `link`, reducing at `reduce_elements_per_ns` (module doc)."""
    alpha, beta = link.step_ns, 1.0 / link.bytes_per_ns
    gamma = max(nbytes // max(itemsize, 1), 0) / reduce_elements_per_ns  # reduce all
    if n <= 1:
        return Cost("local", start_ns)
    if collective == ALL_REDUCE:
        ring = 2 * (n - 1) * alpha + (n - 1) / n * (2 * nbytes * beta + gamma)
        tree = 2 * _ceil_log2(n) * alpha + 2 * nbytes * beta + gamma
        algorithm, t = ("ring", ring) if ring <= tree else ("tree", tree)
    elif collective == REDUCE_SCATTER:
        algorithm, t = "ring", (n - 1) * alpha + (n - 1) / n * (nbytes * beta + gamma)
    elif collective in (ALL_GATHER, ALL_TO_ALL):
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
    return Cost(f"{algorithm} over the {link.tier} link", start_ns + round(t))


def preset_collective_cost(preset: HardwarePreset, collective: str, nbytes: int, n: int,
                           link: Link, itemsize: int = 4) -> Cost:
    """`collective_cost` with the preset's start cost and reduction rate."""
    net = interconnect_for(preset)
    return collective_cost(collective, nbytes, n, link, net.collective_start_ns, itemsize,
                           net.reduce_elements_per_ns)


def bus_bandwidth(collective: str, nbytes: int, n: int, seconds: float) -> float:
    """Bus bandwidth (bytes/s) as collective benchmarks report it: the algorithm bandwidth
    scaled by the share of the data each rank's link carries."""
    algbw = nbytes / seconds
    if collective == ALL_REDUCE:
        return algbw * 2 * (n - 1) / n
    if collective in (ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL):
        return algbw * (n - 1) / n
    return algbw
