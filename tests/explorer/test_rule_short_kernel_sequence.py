"""short_kernel_sequence: kernels shorter than their launches, in a sequence that recurs
every step; the saving is the launches and gaps fusing removes, where the critical path
runs through them."""

from __future__ import annotations

from pathlib import Path

import neuron_explorer
import pytest
from neuron_explorer.rules import short_kernel_sequence as rule
from scenarios import Scenario

STEP_NS = 1_000_000
STEPS = 5
SAMPLED_0 = "trace_filter__sampled_rank-0.json.gz"


def _trace(tmp: Path, kernel_ns: int = 10_000, every: int = 1) -> neuron_explorer.Trace:
    """Per 1 ms step (every `every`-th step; the others launch one kernel): three 40 us ops
    one after another, each launching a `kernel_ns` kernel 5 us after it returns; no sync,
    so the host's work sets the step."""
    sc = Scenario()
    for n in range(STEPS):
        t = n * STEP_NS
        sc.b.slice(sc.host, t, STEP_NS, f"step {n}", "step", {"step": n})
        ops = ("aten::mul", "aten::add", "aten::relu") if n % every == 0 else ("aten::mul",)
        for i, name in enumerate(ops):
            op0 = t + 100_000 + 40_000 * i
            sc.op(op0, 40_000, name, 10 * n + i, n, kernel=(op0 + 45_000, kernel_ns))
    return neuron_explorer.load(sc.write(tmp, f"seq_{kernel_ns}_{every}"))


def _analysed(trace: neuron_explorer.Trace) -> int:
    from neuron_explorer.analyses.steady_state import analysed_steps

    return len(analysed_steps(trace).steps)


def test_a_repeating_sequence_of_short_kernels_saves_its_later_launches(tmp_path):
    """Fused, the add and relu launches (80 us a step, on the host's path) go; the device's
    30 us gaps between the kernels go too, but the path does not run through them."""
    trace = _trace(tmp_path)
    steps = _analysed(trace)
    (f,) = rule.check(trace)
    assert f.time_lost_ns == 80_000 * steps
    assert f.symptom_ns == (80_000 + 2 * 30_000) * steps
    assert f.severity == "medium" and f.share_of_step == pytest.approx(0.08)
    assert f.evidence[0]["description"].startswith("k_mul | k_add | k_relu")
    assert "torch.compile" in f.recommendation and "fused=True" not in f.recommendation


def test_kernels_longer_than_their_launches_are_not_worth_fusing(tmp_path):
    assert not rule.check(_trace(tmp_path, kernel_ns=50_000))


def test_a_sequence_missing_from_some_steps_is_not_repeated_every_step(tmp_path):
    """In steps 0, 2 and 4 only (the others launch one kernel)."""
    trace = _trace(tmp_path, every=2)
    found = trace.kernel_sequences(3).set_index("sequence")["count"]
    assert found["k_mul | k_add | k_relu"] == 3
    assert not len(rule.short_windows(trace)) and not rule.check(trace)


def test_fires_on_our_eager_recordings(repo_root):
    """The eager MLP's Adam foreach kernels (and its layers') recur every step: fusing
    names the fused optimizer; it is part of host_bound's saving, which is larger."""
    mlp = neuron_explorer.load(repo_root / "sample_traces" / "mlp_eager.pftrace")
    (f,) = rule.check(mlp)
    assert f.time_lost_ns == 7_250_000 and f.severity == "medium"
    assert f.time_lost_ns < f.symptom_ns
    assert "fused=True" in f.recommendation
    assert any("_foreach_" in e["description"] for e in f.evidence)
    host = {g.rule_id: g for g in neuron_explorer.rules.run_rules(mlp)}["host_bound"]
    assert f.time_lost_ns < host.time_lost_ns and "part of the host-bound" in f.explanation
    gpt = neuron_explorer.load(repo_root / "sample_traces" / "gpt_eager.pftrace")
    (f,) = rule.check(gpt)
    assert f.time_lost_ns == 14_400_000 and f.severity == "high"


def test_a_compiled_run_is_told_to_bring_its_eager_ops_into_the_graph(repo_root):
    trace = neuron_explorer.load(repo_root / "sample_traces" / "gpt_compiled.pftrace")
    (f,) = rule.check(trace)
    assert f.time_lost_ns == 1_200_000 and f.severity == "medium"
    assert "compiled graph" in f.recommendation


def test_silent_where_fusing_saves_little(repo_root, load_real):
    """The fp32 matmul recording analyses one step, in which nothing recurs; HTA's
    sampled trace has short-kernel sequences in both steps, but its steps are set by
    other work: fusing them saves 0.4 ms of 1.23 s."""
    fp32 = neuron_explorer.load(repo_root / "sample_traces" / "fp32_matmul.pftrace")
    assert not rule.check(fp32)
    sampled = load_real(SAMPLED_0)
    windows = rule.short_windows(sampled)
    assert windows["sequence"].nunique() == 17
    assert rule.saving(sampled, windows)[0] < 0.001 * sampled.summary()["step_time_ns"] * 2
    assert not rule.check(sampled)
