"""What the checkpoint_recompute finding says removing the checkpoints saves, against a
recording of the blocks called plainly (modelled host clock: both runs exact)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import record_variants
from neuron_explorer import load
from neuron_explorer.rules import checkpoint_recompute
from neuron_explorer.rules.finding import step_time

pytestmark = pytest.mark.slow
PROGRAM = Path(__file__).parent / "programs" / "checkpointed_blocks.py"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    paths = record_variants(tmp_path_factory.mktemp("checkpoint"), PROGRAM,
                            {"checkpointed": [], "plain": ["--no-checkpoint"]}, modelled=True)
    return {name: load(path) for name, path in paths.items()}


def test_removing_the_checkpoints_saves_what_the_plain_run_measures(runs) -> None:
    """The recompute goes whole (its ops, and the Python and hooks of the calls: the
    ops alone were 17% short), and nothing said so before this rule."""
    checkpointed, plain = runs["checkpointed"], runs["plain"]
    (f,) = [f for f in checkpointed.bottlenecks() if f.rule_id == "checkpoint_recompute"]
    saved = step_time(checkpointed) - step_time(plain)
    assert saved > 0
    assert f.time_lost_ns == pytest.approx(saved, rel=0.02), (f.time_lost_ns, saved)
    assert "model.blocks.3" in f.recommendation and "torch.utils.checkpoint" in f.recommendation
    assert f.saving_basis.startswith("replay")
    assert not [g for g in plain.bottlenecks() if g.rule_id == "checkpoint_recompute"]


def test_no_finding_where_memory_needs_the_checkpoints(runs, monkeypatch) -> None:
    """Where the activations would not fit beside the recorded peak, the checkpoints are
    what keeps the run within memory: nothing to advise."""
    monkeypatch.setattr(checkpoint_recompute, "capacity", lambda _trace: 1 << 20)
    assert checkpoint_recompute.check(runs["checkpointed"]) == []
