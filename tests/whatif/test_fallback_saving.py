"""What the host-fallback finding says a device version of the op saves, against a
recording of one (modelled clock: both the same every run). `nn.EmbeddingBag`'s backward
falls back to the host; `nn.Embedding` and a mean over the bag run on the device, and in
this host-bound loop cost more ops than the fallback's round trip: 136 us a step slower.
The finding replayed the fallback ops gone altogether and promised 50 us a step; a device
version costs the host an op's dispatch too."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import record_variants
from neuron_explorer import load
from neuron_explorer.rules.finding import step_time

pytestmark = pytest.mark.slow
PROGRAM = Path(__file__).parent / "programs" / "embedding_bag.py"


def test_a_fallback_whose_device_version_costs_as_much_saves_nothing(tmp_path) -> None:
    paths = record_variants(tmp_path, PROGRAM, {"bag": [], "dense": ["--dense"]},
                            modelled=True)
    bag, dense = load(paths["bag"]), load(paths["dense"])
    saved = step_time(bag) - step_time(dense)
    assert saved < 0  # the premise: the device version is slower here
    (f,) = [f for f in bag.bottlenecks() if f.rule_id == "host_fallback"]
    assert "aten::_embedding_bag_backward" in f.explanation
    assert f.time_lost_ns == 0 and not f.saves_time
    assert f.saving_basis.startswith("replay: the run replayed with each of these ops one op")
