"""short_kernel_sequence: kernels shorter than their launches, in a sequence that recurs
every step; the saving is what the run replayed with each occurrence fused saves (the
launches and gaps fusing removes, where the critical path runs through them, for a trace
that cannot be replayed)."""

from __future__ import annotations

import re
from pathlib import Path

import neuron_explorer
import numpy as np
import pytest
from neuron_explorer.analyses.steady_state import analysed_steps
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


def _launch(sc: Scenario, ts: int, name: str, op_id: int, step: int, kernel_ns: int,
            kernel: str | None = None, **args) -> None:
    """A 40 us op launching one `kernel_ns` kernel (named `kernel`, default k_<op>) 5 us
    after it returns, with extra op `args` (a copy's direction, a graph's id)."""
    kid = sc.next_kernel
    sc.next_kernel += 1
    sc.b.slice(sc.host, ts, 40_000, name, "op",
               {"op_id": op_id, "kernel_id": kid, "device": 0, "step": step, **args},
               flow_out=[op_id])
    sc.b.slice(sc.kernels, ts + 45_000, kernel_ns, kernel or f"k_{name.split('::')[-1]}",
               "kernel", {"kernel_id": kid, "op_id": op_id, "step": step}, flow_in=[op_id])


def _ops_trace(tmp: Path, ops: list[tuple], name: str) -> neuron_explorer.Trace:
    """Per 1 ms step, `ops` one after another as `_launch` makes them: (op name, kernel
    name or None, args); 10 us kernels, no sync."""
    sc = Scenario()
    for n in range(STEPS):
        t = n * STEP_NS
        sc.b.slice(sc.host, t, STEP_NS, f"step {n}", "step", {"step": n})
        for i, (op, kernel, args) in enumerate(ops):
            _launch(sc, t + 100_000 + 40_000 * i, op, 100 * n + i, n, 10_000, kernel, **args)
    return neuron_explorer.load(sc.write(tmp, name))


TO_DEVICE = ("aten::_to_copy", "copy_host_to_device", {"direction": "host_to_device"})


def test_host_to_device_copies_are_not_kernels_to_fuse(tmp_path):
    """Our recordings write a transfer as a kernel named copy_host_to_device: five short
    copies a step are no sequence to fuse (batching them is host_device_copies' advice),
    nor are copies known only by their op's direction."""
    copies = _ops_trace(tmp_path, [TO_DEVICE] * 5, "copies")
    assert (copies.kernels["kind"] == "kernel").all()
    assert not len(copies.kernel_sequences(3))
    assert not len(rule.short_windows(copies)) and not rule.check(copies)
    by_arg = _ops_trace(tmp_path, [("aten::_to_copy", "k_dma", {"direction": "host_to_device"})]
                        * 5, "by_arg")
    assert not len(by_arg.kernel_sequences(3)) and not rule.check(by_arg)
    # a copy launched between kernels ends their sequence; on the device it is no kernel
    mixed = _ops_trace(tmp_path, [("aten::mul", None, {}), ("aten::add", None, {}), TO_DEVICE,
                                  ("aten::relu", None, {}), ("aten::neg", None, {}),
                                  ("aten::exp", None, {})], "mixed")
    pairs = mixed.kernel_sequences(2)["sequence"].tolist()
    assert "k_mul | k_add" in pairs and "k_relu | k_neg" in pairs
    assert "k_add | k_relu" not in pairs and not any("copy" in p for p in pairs)
    cast = _ops_trace(tmp_path, [("aten::_to_copy", "k__to_copy", {"direction":
                                                                    "device_to_device"})] * 3,
                      "cast")
    assert cast.kernel_sequences(3)["sequence"].tolist() == [" | ".join(["k__to_copy"] * 3)]


def test_fused_optimizer_only_where_its_step_is_a_sequence(tmp_path):
    """One foreach kernel after the backward (SGD without momentum) is the optimizer
    already in one kernel: fusing it into the backward is no fix, and fused=True saves
    nothing. Adam's chain of foreach kernels is what fused=True fuses."""
    one = _ops_trace(tmp_path, [("aten::mul", None, {}), ("aten::add", None, {}),
                                ("aten::relu", None, {}), ("aten::_foreach_add_", None, {})],
                     "sgd")
    (f,) = rule.check(one)
    assert f.time_lost_ns == 80_000 * _analysed(one)
    assert "fused=True" not in f.recommendation
    adam = _ops_trace(tmp_path, [("aten::mul", None, {}), ("aten::_foreach_mul_", None, {}),
                                 ("aten::_foreach_add_", None, {}),
                                 ("aten::_foreach_sqrt", None, {})], "adam")
    (f,) = rule.check(adam)
    assert f.time_lost_ns == 80_000 * _analysed(adam)
    assert "fused=True" in f.recommendation
    # the model's sequences 60 times over beside Adam's: fused=True is not worth naming
    # (an LSTM's, 0.3% of them the optimizer's, were told to fuse it; it saved 0.3%)
    sc = Scenario()
    ops = ["aten::mul", "aten::add", "aten::relu"] * 60 + [
        "aten::_foreach_mul_", "aten::_foreach_add_", "aten::_foreach_sqrt"]
    for n in range(STEPS):
        t = n * 10 * STEP_NS
        sc.b.slice(sc.host, t, 10 * STEP_NS, f"step {n}", "step", {"step": n})
        for i, op in enumerate(ops):
            _launch(sc, t + 100_000 + 40_000 * i, op, 1000 * n + i, n, 10_000)
    (f,) = rule.check(neuron_explorer.load(sc.write(tmp_path, "mostly_model")))
    assert "fused=True" not in f.recommendation


def test_a_compiled_graph_launch_is_not_fused_away(tmp_path):
    """Eager loss ops between a compiled forward and backward join the graphs when
    compiled with them: their launches go, the graphs' own launches stay."""
    graph = _ops_trace(tmp_path, [("graph:1", "graph_1_forward", {"graph_id": 1}),
                                  ("aten::neg", None, {}), ("aten::exp", None, {}),
                                  ("graph:2", "graph_2_backward", {"graph_id": 2})], "graph")
    (f,) = rule.check(graph)
    assert f.time_lost_ns == 80_000 * _analysed(graph)


def test_a_backwards_seed_between_two_graphs_fuses_under_no_fix(tmp_path):
    """`graph_1_forward | fill | graph_2_backward`: the fill is autograd's seed of the
    backward, eager between the compiled forward and backward whatever is compiled (a
    whole step compiled left it as it was, where 1.18 ms was claimed)."""
    seed = _ops_trace(tmp_path, [("graph:1", "graph_1_forward", {"graph_id": 1}),
                                 ("aten::fill_", None, {}),
                                 ("graph:2", "graph_2_backward", {"graph_id": 2})], "seed")
    assert rule.check(seed) == []


def _analysed(trace: neuron_explorer.Trace) -> int:
    from neuron_explorer.analyses.steady_state import analysed_steps

    return len(analysed_steps(trace).steps)


def test_a_repeating_sequence_of_short_kernels_saves_its_later_launches(tmp_path):
    """Fused, the add and relu launches (80 us a step, on the host's path) go; the device's
    30 us gaps between the kernels go too, but the path does not run through them. The
    symptom is the wall time they cover, 85 us a step: the launches at 140-220 us into the
    step, the gaps at 155-185 and 195-225 (their sum, 140 us a step, said 769 ms of a
    user's run analysed over 487)."""
    trace = _trace(tmp_path)
    steps = _analysed(trace)
    (f,) = rule.check(trace)
    assert f.time_lost_ns == 80_000 * steps
    assert f.symptom_ns == 85_000 * steps
    assert f.severity == "medium" and f.share_of_step == pytest.approx(0.08)
    assert f.evidence[0]["description"].startswith("k_mul | k_add | k_relu")
    # the sequence as the user's code: where its ops were called
    assert f"k_mul | k_add | k_relu ({STEPS} times, at train.py:10)" in f.explanation
    assert "torch.compile" in f.recommendation and "fused=True" not in f.recommendation


def _busy_device(tmp: Path, fused: bool, steps: int = 20) -> neuron_explorer.Trace:
    """Per 200 us step, on the host: a 40 us matmul op launching a 150 us kernel, then mul,
    add and relu ops of 40 us, each launching a 10 us kernel as it returns (or, `fused`,
    the mul's one 30 us kernel and no add or relu), then 40 us of Python. The device,
    180 us busy a step, runs its queue in order: as recorded the host sets the pace;
    fused, the device does."""
    sc = Scenario()
    free = 0  # when the device's queue is next free
    ops = [("aten::mm", 150_000), ("aten::mul", 30_000 if fused else 10_000)]
    ops += [] if fused else [("aten::add", 10_000), ("aten::relu", 10_000)]
    host = 0
    for n in range(steps):
        step_start = host
        for i, (name, kernel_ns) in enumerate(ops):
            start = max(host + 40_000, free)
            sc.op(host, 40_000, name, 10 * n + i, n, kernel=(start, kernel_ns))
            free, host = start + kernel_ns, host + 40_000
        host += 40_000  # the Python around the ops
        sc.b.slice(sc.host, step_start, host - step_start, f"step {n}", "step", {"step": n})
    return neuron_explorer.load(sc.write(tmp, f"busy_{fused}"))


def test_fusing_where_the_device_is_nearly_as_busy_saves_what_the_fused_run_measures(
        tmp_path):
    """Fused, the add and relu launches go (80 us of the host's 200 us a step), but the
    device's 180 us of work then sets the step: 20 us a step saved, where the critical
    path counted the 80 us it ran through (a user's compiled run was promised 14x what
    compiling its loss saved). The replay's saving over the analysed steps is what the
    fused run's median step measures, within its first step's wait for the device and
    the recorded run's last kernels after its last step."""
    from neuron_explorer.analyses.device_pace import paced_durations

    recorded, fixed = _busy_device(tmp_path, False), _busy_device(tmp_path, True)
    (f,) = rule.check(recorded)
    steps = _analysed(recorded)
    per_step = float(np.median(paced_durations(recorded)) - np.median(paced_durations(fixed)))
    assert per_step == 20_000  # the premise: the device's 180 us set the fused step
    assert f.time_lost_ns == pytest.approx(per_step * steps, rel=0.1)
    assert f.saving_basis.startswith("replay")


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
    names the fused optimizer; it is part of host_bound's saving. Fused alone, the
    sequences would save 8.0 ms by replay (those holding autograd's seed of the backward
    left out: it stays eager whatever is compiled), more than compiling, the fix advised,
    saves (a graph's call costs the host more than one op): the finding claims
    compiling's. The optimizer's first launch stays (it is not fused into the backward)."""
    from neuron_explorer.rules import host_bound

    mlp = neuron_explorer.load(repo_root / "sample_traces" / "mlp_eager.pftrace")
    (f,) = rule.check(mlp)
    assert rule.saving(mlp, rule.short_windows(mlp))[0] == 7_974_022
    assert f.time_lost_ns == int(host_bound.compiled_saving_ns(mlp)) == 6_720_940
    assert f.severity == "high" and f.saving_basis.startswith("replay: the run replayed compiled")
    assert f.time_lost_ns < f.symptom_ns
    assert "fused=True" in f.recommendation
    assert any("_foreach_" in e["description"] for e in f.evidence)
    # which fix fuses how much: a user's CNN listed the optimizer's sequences alone, and
    # fused=True saved 22% of the claim (the rest is the model's, which compiling fuses)
    assert ("Of the launches fusing removes, 29% the optimizer's step (fused=True fuses "
            "those) and 71% the model's forward and backward") in f.explanation
    assert any("_foreach_" not in e["description"] for e in f.evidence)
    # the text names the most frequent sequences with their counts, not only the evidence
    counts = rule.short_windows(mlp).groupby("sequence")["window"].nunique()
    top = counts.idxmax()
    assert f"{top} ({counts[top]} times, at " in f.explanation
    host = {g.rule_id: g for g in neuron_explorer.rules.run_rules(mlp)}["host_bound"]
    assert f.time_lost_ns <= host.time_lost_ns and "part of the host-bound" in f.explanation
    # the GPT's sequences fused save less than compiling (29.7 ms): their replay's 16.8 ms
    # (13.9 ms by the critical path, which left out each removed op's own front end;
    # 17.8 with the windows holding autograd's seed)
    gpt = neuron_explorer.load(repo_root / "sample_traces" / "gpt_eager.pftrace")
    (f,) = rule.check(gpt)
    assert f.time_lost_ns == 16_787_042 and f.severity == "high"
    assert f.time_lost_ns < host_bound.compiled_saving_ns(gpt)


def test_a_compiled_run_is_told_to_bring_its_eager_ops_into_the_graph(repo_root):
    trace = neuron_explorer.load(repo_root / "sample_traces" / "gpt_compiled.pftrace")
    (f,) = rule.check(trace)
    # the eager loss's and optimizer's sequences fused, by replay (0.9 ms by the critical
    # path, the launches alone; the optimizer's fused step saves 0.65 ms a step of it);
    # not those holding autograd's seed of the backward, eager whatever is compiled
    # (1.68 ms with them, where bringing every eager launch in saves 2.07)
    assert f.time_lost_ns == 1_077_436 and f.severity == "medium"
    assert "compiled graph" in f.recommendation
    # no compiled replay caps it here: it overlaps the host-bound finding's saving, and
    # may be the larger (called "part of" a smaller host-bound claim, it read as wrong)
    assert "the two savings overlap rather than add" in f.explanation
    assert "part of the host-bound" not in f.explanation


def test_silent_where_fusing_saves_little(repo_root, load_real):
    """The fp32 matmul recording analyses one step, in which nothing recurs; HTA's
    sampled trace has short-kernel sequences in both steps, but its steps are set by
    other work: fusing them saves 1.7 ms of 1.23 s (by replay, the ops that launch the
    later kernels gone)."""
    fp32 = neuron_explorer.load(repo_root / "sample_traces" / "fp32_matmul.pftrace")
    assert not rule.check(fp32)
    sampled = load_real(SAMPLED_0)
    windows = rule.short_windows(sampled)
    assert windows["sequence"].nunique() == 17
    assert rule.saving(sampled, windows)[0] < 0.002 * sampled.summary()["step_time_ns"] * 2
    assert not rule.check(sampled)


@pytest.mark.slow
def test_a_compiled_models_sequences_outside_it_are_not_called_its_forward(tmp_path):
    """A compiled model with an EMA of its weights updated in a Python loop: the finding
    listed the EMA's sequences and said the part not the optimizer's was "the model's
    forward and backward (compiling fuses those)", of a model compiled already. It names
    the code outside the model, by its lines, and what fuses it."""
    from cli_runner import record_variants

    program = Path(__file__).parents[1] / "whatif" / "programs" / "small_mlp.py"
    path = record_variants(tmp_path, program, {
        "ema": ["3", "--compile", "--optimizer", "adam", "--ema"]}, modelled=True)["ema"]
    (f,) = rule.check(neuron_explorer.load(path))
    lines = program.read_text().splitlines()
    ema_line = next(i for i, line in enumerate(lines, 1) if "average.mul_(" in line)
    assert (f"code outside the model at {program}:{ema_line}") in f.explanation
    assert "torch._foreach_* ops over all its tensors at once" in f.explanation
    model = re.search(r"(\d+)% the model's forward and backward", f.explanation)
    assert model is None or int(model.group(1)) < 10, f.explanation
    # no graph break in this run: none to remove
    assert "graph break" not in f.recommendation
    assert "compile the loss and optimizer step too" in f.recommendation


@pytest.mark.slow
def test_an_eager_loops_work_after_its_optimizer_step_is_named(tmp_path):
    """The same EMA, eager: its ops run after the optimizer's step, so they land in the next
    step, and the first recorded step has none. A sequence had to recur in every analysed
    step, the first recorded one included, so a user's EMA loop (31% of the step) was
    named by no finding."""
    from cli_runner import record_variants

    program = Path(__file__).parents[1] / "whatif" / "programs" / "small_mlp.py"
    trace = neuron_explorer.load(record_variants(tmp_path, program, {
        "ema": ["3", "--optimizer", "adam", "--ema"]}, modelled=True)["ema"])
    assert 0 in analysed_steps(trace).steps  # the premise: no warm-up left out
    (f,) = rule.check(trace)
    lines = program.read_text().splitlines()
    ema_line = next(i for i, line in enumerate(lines, 1) if "average.mul_(" in line)
    assert (f"code outside the model at {program}:{ema_line}") in f.explanation


def test_the_advice_names_no_fused_op_the_device_runs_as_its_parts(tmp_path):
    """The fix said "or call a fused op where one exists (F.scaled_dot_product_attention
    ...)", on MLPs too: this device runs SDPA eagerly as its parts, and a user's attention
    rewritten to it ran 9% slower. And "wrap the module that runs it": compiling the one
    module named saved 72% of a claim that counts every module's sequences."""
    (f,) = rule.check(_trace(tmp_path))
    assert "scaled_dot_product_attention" not in f.recommendation
    assert "fused op" not in f.recommendation
    assert "the saving counts the sequences of every module" in f.recommendation
