"""The collective cost model's closed forms and the topology (no processes needed)."""

from __future__ import annotations

import math

import pytest
from neuron_explorer.backend.distributed.interconnect import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    BROADCAST,
    SEND,
    bus_bandwidth,
    collective_cost,
    link_for,
)
from neuron_explorer.backend.distributed.topology import Topology, TopologyError, topology_for
from neuron_explorer.common.presets import PRESETS, interconnect_for

TRN1, TRN2 = PRESETS["trn1"], PRESETS["trn2"]


def test_large_all_reduce_reaches_the_ring_bound():
    n, nbytes = 8, 16 << 30
    topo = Topology(ranks_per_chip=1, chips_per_instance=16)  # 8 chips: NeuronLink
    link = link_for(TRN2, topo, tuple(range(n)))
    assert link.tier == "chip" and link.bytes_per_ns == TRN2.neuronlink_bytes_per_ns
    cost = collective_cost(ALL_REDUCE, nbytes, n, link, 0)
    bound = 2 * (n - 1) / n * nbytes / link.bytes_per_ns
    assert cost.algorithm == "ring over the chip link"
    assert bound <= cost.transfer_ns <= bound * 1.005  # + 2(n-1) steps of latency
    busbw = bus_bandwidth(ALL_REDUCE, nbytes, n, cost.transfer_ns / 1e9)
    assert busbw == pytest.approx(link.bytes_per_ns * 1e9, rel=5e-3)


def test_small_all_reduce_is_latency_bound_and_uses_the_tree():
    n = 16
    topo = Topology(ranks_per_chip=1, chips_per_instance=16)
    link = link_for(TRN1, topo, tuple(range(n)))
    cost = collective_cost(ALL_REDUCE, 64, n, link, 0)
    assert cost.algorithm == "tree over the chip link"
    latency = 2 * math.ceil(math.log2(n)) * link.step_ns
    assert latency <= cost.transfer_ns <= latency + 1
    # doubling a tiny message changes nothing measurable; doubling a huge one doubles it
    assert collective_cost(ALL_REDUCE, 128, n, link, 0).transfer_ns - cost.transfer_ns < 2
    big = collective_cost(ALL_REDUCE, 1 << 30, n, link, 0).transfer_ns
    assert 1.98 < collective_cost(ALL_REDUCE, 2 << 30, n, link, 0).transfer_ns / big < 2.0


@pytest.mark.parametrize("collective", [ALL_GATHER, ALL_TO_ALL])
def test_ring_and_pairwise_move_n_minus_1_over_n(collective):
    n, nbytes = 4, 1 << 28
    link = link_for(TRN2, Topology(1, 16), tuple(range(n)))
    cost = collective_cost(collective, nbytes, n, link, 0)
    expected = (n - 1) * link.step_ns + (n - 1) / n * nbytes / link.bytes_per_ns
    assert cost.transfer_ns == round(expected)


def test_broadcast_and_send():
    link = link_for(TRN2, Topology(1, 16), (0, 1))
    assert collective_cost(SEND, 1000, 2, link, 0).transfer_ns == round(
        link.step_ns + 1000 / link.bytes_per_ns)
    assert collective_cost(BROADCAST, 1 << 20, 2, link, 0).transfer_ns > 0


def test_the_slowest_tier_sets_the_link():
    topo = Topology(ranks_per_chip=2, chips_per_instance=2)  # 4 ranks per instance
    net = interconnect_for(TRN1)
    assert link_for(TRN1, topo, (0, 1)).bytes_per_ns == net.core_link_bytes_per_ns
    assert link_for(TRN1, topo, (0, 2)).tier == "chip"
    efa = link_for(TRN1, topo, (0, 4))
    assert efa.tier == "instance" and efa.bytes_per_ns == net.instance_link_bytes_per_ns
    assert efa.step_ns > link_for(TRN1, topo, (0, 2)).step_ns


def test_reductions_pay_per_element_so_narrow_dtypes_cost_more_per_byte():
    link = link_for(TRN1, Topology(2, 16), (0, 1))
    rate = interconnect_for(TRN1).reduce_elements_per_ns
    nbytes = 1 << 25
    costs = {size: collective_cost(ALL_REDUCE, nbytes, 2, link, 0, size, rate).transfer_ns
             for size in (1, 4)}
    # a 2-rank ring reduces half the elements: (n-1)/n E / R
    assert costs[1] - costs[4] == round(0.5 * (nbytes - nbytes // 4) / rate)
    # gathers reduce nothing
    gather = collective_cost(ALL_GATHER, nbytes, 2, link, 0, 1, rate).transfer_ns
    assert gather == collective_cost(ALL_GATHER, nbytes, 2, link, 0, 4, rate).transfer_ns


def test_one_rank_pays_only_the_start():
    link = link_for(TRN2, Topology(1, 16), (0,))
    assert collective_cost(ALL_REDUCE, 1 << 20, 1, link, 5000) == ("local", 5000)


def test_topology_from_the_preset_and_the_environment(monkeypatch):
    monkeypatch.delenv("NEURON_TOPOLOGY", raising=False)
    assert topology_for(TRN2) == Topology(8, 16)
    assert topology_for(TRN1, "ranks_per_chip=1") == Topology(1, 16)
    monkeypatch.setenv("NEURON_TOPOLOGY", "ranks_per_chip=2, chips_per_instance=4")
    assert topology_for(TRN2) == Topology(2, 4)
    with pytest.raises(TopologyError, match="NEURON_TOPOLOGY"):
        topology_for(TRN2, "cores=3")
    with pytest.raises(TopologyError, match="N >= 1"):
        topology_for(TRN2, "ranks_per_chip=0")


def test_a_ring_through_two_cores_of_a_chip_runs_at_the_core_links_rate():
    net = interconnect_for(TRN1)
    topo = Topology(ranks_per_chip=2, chips_per_instance=16)
    # one rank per chip: NeuronLink only
    assert link_for(TRN1, topo, (0, 2, 4, 6)).bytes_per_ns == TRN1.neuronlink_bytes_per_ns
    # both cores of each chip: the ring has core-to-core edges, slower on trn1
    both = link_for(TRN1, topo, tuple(range(8)))
    assert both.tier == "chip" and both.step_ns == net.chip_step_ns
    assert both.bytes_per_ns == net.core_link_bytes_per_ns < TRN1.neuronlink_bytes_per_ns
    # across instances EFA is slower still
    assert link_for(TRN1, topo, tuple(range(64))).bytes_per_ns == net.instance_link_bytes_per_ns
