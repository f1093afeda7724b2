"""host_device_copies on a compiled run's eager uploads between its graphs: the copies'
ops on the host's path are what batching them saves; host_bound names the copies when
they are most of its launches."""

from __future__ import annotations

from pathlib import Path

import neuron_explorer
import pytest
from neuron_explorer.rules import host_bound, host_device_copies
from scenarios import Scenario

STEP_NS = 1_000_000
STEPS = 5
COPY_OP_NS = 40_000


def _trace(tmp: Path, uploads: int, graphs: int = 1, eager: int = 0,
           optimizer_op: str = "aten::_foreach_add_",
           eager_op: str = "aten::mse_loss") -> neuron_explorer.Trace:
    """Per 1 ms step: `uploads` 40 us aten::_to_copy ops, each launching a 1 us
    copy_host_to_device, then `graphs` compiled graphs' 40 us launches of a 20 us kernel,
    then `eager` eager ops of a 2 us kernel each (half `eager_op` at train.py:55, half
    inside the optimizer's step); no sync, so the host's ops set the step and the device waits on
    them."""
    sc = Scenario()
    for n in range(STEPS):
        t = n * STEP_NS
        sc.b.slice(sc.host, t, STEP_NS, f"step {n}", "step", {"step": n})
        ops = [("aten::_to_copy", "copy_host_to_device", 1_000,
                {"direction": "host_to_device"})] * uploads
        ops += [("graph:1", "graph_1_forward", 20_000, {"graph_id": 1})] * graphs
        if eager:
            ops += [(eager_op, "eager_f32", 2_000, {"source": "train.py:55"})] * (eager // 2)
            first = t + 100_000 + COPY_OP_NS * len(ops)
            sc.b.slice(sc.host, first, COPY_OP_NS * (eager - eager // 2) + 1_000,
                       "AdamW.step", "optimizer", {"step": n})
            ops += [(optimizer_op, "foreach_add_f32", 2_000,
                     {"source": "adamw.py:1"})] * (eager - eager // 2)
        for i, (op, kernel, kernel_ns, args) in enumerate(ops):
            op0, op_id, kid = t + 100_000 + COPY_OP_NS * i, 100 * n + i, sc.next_kernel
            sc.next_kernel += 1
            sc.b.slice(sc.host, op0, COPY_OP_NS, op, "op",
                       {"op_id": op_id, "kernel_id": kid, "device": 0, "step": n, **args},
                       flow_out=[op_id])
            sc.b.slice(sc.kernels, op0 + COPY_OP_NS + 5_000, kernel_ns, kernel, "kernel",
                       {"kernel_id": kid, "op_id": op_id, "step": n}, flow_in=[op_id])
    return neuron_explorer.load(sc.write(tmp, f"uploads_{uploads}_{graphs}_{eager_op[6:]}"))


def _analysed(trace: neuron_explorer.Trace) -> int:
    from neuron_explorer.analyses.steady_state import analysed_steps

    return len(analysed_steps(trace).steps)


def test_many_small_uploads_cost_their_ops_on_the_host_path(tmp_path):
    """Ten uploads a step: 1 us each on the link, but 400 us of the host's dispatch on
    the critical path, which one batched copy saves, less the one left and the split
    that hands out the pieces, an op too (the replay without the other eight a step)."""
    trace = _trace(tmp_path, 10)
    (f,) = host_device_copies.check(trace)
    assert f.time_lost_ns == 8 * COPY_OP_NS * _analysed(trace)
    assert f.symptom_ns == 10 * 1_000 * _analysed(trace)
    assert f.saving_basis.startswith("replay")
    assert f.recommendation.startswith(
        "Move each step's small tensors of one dtype in one copy (10 copies")


def test_host_bound_names_the_copies_when_they_are_most_launches(tmp_path):
    many = _trace(tmp_path, 10)
    per_step, share = host_bound.copies_starving(many)
    assert per_step == 10 and share == pytest.approx(10 / 11)
    (f,) = host_bound.check(many)
    assert f.recommendation.startswith("Most of the host's launches are host<->device copies")
    assert "already compiled" in f.recommendation
    few = _trace(tmp_path, 1, graphs=3)
    assert host_bound.copies_starving(few)[1] == pytest.approx(0.25)
    (f,) = host_bound.check(few)
    assert "copies" not in f.recommendation
    assert host_bound.copies_starving(_trace(tmp_path, 0)) == (0.0, 0.0)


def test_host_bound_leads_with_copies_only_where_their_finding_has_a_fix(tmp_path):
    """A compiled model's one upload of its input a step is half of what the host
    launches, but no copies finding says how to do without it: the advice led with "move
    each batch in one copy ... or create the tensors on the device (see the host<->device
    copies finding)", which had nothing to batch, no finding to see, and, done, made an
    inference step 12 us slower."""
    one = _trace(tmp_path, 1, graphs=1)
    assert host_bound.copies_starving(one)[1] == pytest.approx(0.5)
    assert host_device_copies.check(one) == []
    (f,) = host_bound.check(one)
    assert "copies" not in f.recommendation
    assert f.recommendation.startswith("The model is already compiled")


def test_host_bound_on_a_compiled_run_names_the_eager_ops_beside_its_graphs(tmp_path):
    """A compiled model whose loss, clipping and optimizer step run eager launches mostly
    outside its graphs: "increase the batch size" left a compiled LM's step as it was;
    compiling what ran eager saved what the finding claimed (845 of 854 us a step)."""
    trace = _trace(tmp_path, 0, graphs=2, eager=8)
    (f,) = host_bound.check(trace)
    # its optimizer's step is 40% of the host's op time: its fix comes first, once
    assert f.recommendation.startswith("The largest part of the host's launches is the "
                                       "optimizer's step (4 ops a step"), f.recommendation
    assert (" The model is already compiled, but 8 ops a step still launch one by one "
            "outside its graphs (4 at train.py:55, 4 in the optimizer's step): bring them "
            "into compiled code (the saving counts all of them brought in: a fix that "
            "brings in some saves their part). Compute the loss inside the compiled "
            "function, and compile the rest of the step beside the model and its loss") \
        in f.recommendation
    assert f.recommendation.count("fused=True") == 1
    assert "increase the batch size" not in f.recommendation
    (tmp_path / "fused").mkdir()
    fused = _trace(tmp_path / "fused", 0, graphs=2, eager=8,
                   optimizer_op="aten::_fused_adamw_")
    (f,) = host_bound.check(fused)  # its optimizer is fused already: no fused=True advice
    assert "outside its graphs" in f.recommendation and "fused=True" not in f.recommendation
    few = _trace(tmp_path, 0, graphs=2, eager=2)  # fewer eager launches than 2x the graphs'
    (f,) = host_bound.check(few)
    assert "outside its graphs" not in f.recommendation


def test_eager_metrics_beside_a_compiled_loss_are_named_so(tmp_path):
    """Where no loss op runs eagerly, what runs beside the graphs is work on the model's
    outputs (a compiled loss, eager accuracy and confidence): the advice said to compute
    the loss inside the compiled function, which it was."""
    trace = _trace(tmp_path, 0, graphs=2, eager=8, eager_op="aten::argmax")
    (f,) = host_bound.check(trace)
    assert "Compute the loss" not in f.recommendation
    assert ("The loss is compiled already: compute the metrics on the model's outputs "
            "(argmax, softmax, running sums) inside the compiled function too, and return "
            "them detached") in f.recommendation


def test_eager_ops_beside_a_compiled_loss_are_not_called_the_loss(tmp_path):
    """eager_beside_graphs called every training run's eager ops "the loss and other
    code beside the model", also where they were metrics beside a compiled loss."""
    from neuron_explorer.rules.eager_beside_graphs import _what
    from neuron_explorer.what_if.into_graphs import eager_launches

    for op, said in (("aten::mse_loss", "the loss and other code beside the model"),
                     ("aten::argmax", ("work on the model's outputs beside it, the loss "
                                       "compiled with it"))):
        (tmp_path / op[6:]).mkdir()
        trace = _trace(tmp_path / op[6:], 0, graphs=2, eager=8, eager_op=op)
        assert _what(trace, eager_launches(trace).movable) == said
