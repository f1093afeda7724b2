"""Layout copies: a permuted view made contiguous before a matmul every step. A trial's
attention block made five such copies a step, 6% of it, and no finding named them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cli_runner import median_step, record_variants
from neuron_explorer import load
from neuron_explorer.analyses.steady_state import in_analysed_steps
from neuron_explorer.common import trace_format as tf

pytestmark = pytest.mark.slow
PROGRAM = Path(__file__).parent / "programs" / "permuted_matmul.py"



def test_a_permuted_matmul_input_claims_what_keeping_its_layout_saves(tmp_path) -> None:
    paths = record_variants(tmp_path, PROGRAM, {"permuted": [], "fixed": ["--fixed"]},
                            modelled=True)
    permuted, fixed = load(paths["permuted"]), load(paths["fixed"])
    copies = permuted.ops[permuted.ops["name"] == "aten::_copy_from"]
    marked = permuted.slice_args.column(tf.ARG_LAYOUT_COPY, copies["id"].to_numpy())
    assert len(copies) == 8 and all(bool(m) for m in marked)  # one a step, each marked
    (f,) = [f for f in permuted.bottlenecks() if f.rule_id == "layout_copies"]
    assert f.title == "Layout copies: a strided view made contiguous a step"
    line = next(i for i, text in enumerate(PROGRAM.read_text().splitlines(), 1)
                if "h = torch.matmul(x.permute(1, 0, 2), self.w)" in text)
    assert f"permuted_matmul.py:{line}" in f.explanation
    assert "the two savings overlap rather than add" in f.explanation  # compiling folds them
    # a copy the user's permute makes: keeping the layout is the advice, not compiling
    assert "per-head views" not in f.explanation
    assert f.recommendation.startswith("Compute in the layout the tensor has")
    saved = median_step(permuted) - median_step(fixed)
    assert saved > 0.03 * median_step(permuted)  # the premise
    claimed = f.time_lost_ns / len(in_analysed_steps(permuted, permuted.steps))
    assert claimed == pytest.approx(saved, rel=0.1), (claimed, saved)
    assert not [g for g in fixed.bottlenecks() if g.rule_id == "layout_copies"]


def test_copies_inside_pytorchs_own_modules_are_not_claimed(tmp_path) -> None:
    """An nn.MultiheadAttention beside the layer transposes its heads: 6 layout copies a
    step of its own, which no change to the user's code removes. A trial's finding counted
    44 such copies with its user's 2 and claimed 25x what fixing the user's saved. Here the
    finding would claim 654 us a step for a fix that saves 74 us: only the user's copy is
    counted, whose saving (under 2% of the step) earns no finding."""
    import numpy as np
    from neuron_explorer.rules.layout_copies import layout_copies
    from neuron_explorer.what_if.counterfactual import removal_saving_ns

    paths = record_variants(tmp_path, PROGRAM, {"permuted": ["--attention"],
                                                "fixed": ["--attention", "--fixed"]},
                            modelled=True)
    permuted, fixed = load(paths["permuted"]), load(paths["fixed"])
    every, _ = layout_copies(permuted)
    own, allocations = layout_copies(permuted, own=True)
    # the user's one a step, the module's six (its backward's write of the three heads'
    # gradients into one zeroed buffer is a write into memory, not a layout copy)
    assert len(own) == 8 and len(every) == 64
    assert set(own["module"].astype(str)) == {"model"}
    saved = median_step(permuted) - median_step(fixed)
    steps = len(in_analysed_steps(permuted, permuted.steps))
    claimed = removal_saving_ns(permuted, np.concatenate([own["id"].to_numpy(), allocations]),
                                "test") / steps
    assert claimed == pytest.approx(saved, rel=0.1), (claimed, saved)
    assert not [g for g in permuted.bottlenecks() if g.rule_id == "layout_copies"]


def test_a_write_into_memory_already_there_is_no_layout_copy(tmp_path) -> None:
    """Each call writes the permuted input into a slice of a buffer made before the loop,
    as a decoder's static KV cache does (`cache[:, :, pos] = k`): a copy of a strided view,
    but into memory the program keeps its data in. A trial's decoder was told to stop
    making its cache writes contiguous, 6.6% of its step claimed for removing them."""
    import numpy as np
    from neuron_explorer.rules import thresholds as th
    from neuron_explorer.rules.finding import step_time
    from neuron_explorer.what_if.counterfactual import removal_saving_ns

    paths = record_variants(tmp_path, PROGRAM, {"writes": ["--fixed", "--cache-write"]},
                            modelled=True)
    writes = load(paths["writes"])
    copies = writes.ops[writes.ops["name"] == "aten::_copy_from"]
    marked = writes.slice_args.column(tf.ARG_LAYOUT_COPY, copies["id"].to_numpy())
    assert len(copies) == 8 and all(bool(m) for m in marked)  # they read a strided view
    removed = removal_saving_ns(writes, copies["id"].to_numpy(np.int64), "test")
    assert removed > th.LAYOUT_COPIES_MIN_SHARE * step_time(writes)  # what was claimed
    assert not [f for f in writes.bottlenecks() if f.rule_id == "layout_copies"]


def test_attentions_head_copies_are_told_only_compiling_removes_them(tmp_path) -> None:
    """A hand-written attention's q @ k.transpose(-2, -1) and att @ v read per-head views
    that PyTorch's matmul makes contiguous first, forward and backward. A trial's finding
    told its user to compute in the layout the tensors have: that removed 2 of its 16
    copies a step (86 us of the 1.18 ms claimed a step), and only compiling removed the
    others."""
    from neuron_explorer.rules.layout_copies import feeds_head_matmul, layout_copies

    program = PROGRAM.with_name("gpt_train.py")
    paths = record_variants(tmp_path, program, {"eager": ["--steps", "3"],
                                                "compiled": ["--steps", "3", "--compile"]},
                            modelled=True)
    eager, compiled = load(paths["eager"]), load(paths["compiled"])
    (f,) = [f for f in eager.bottlenecks() if f.rule_id == "layout_copies"]
    line = next(i for i, text in enumerate(program.read_text().splitlines(), 1)
                if "att = (q @ k.transpose(-1, -2))" in text)
    said = re.search(r" (\d+) of them a step are batches of per-head views that a batched "
                     r"matmul reads next, at [^(]*gpt_train.py:(\d+) ", f.explanation)
    assert said and int(said.group(2)) == line, f.explanation
    assert 0 < int(said.group(1)) < 16
    part = re.search(r"replayed without them alone, the analysed steps save ([\d.]+) (us|ms) "
                     r"of the", f.explanation)
    assert part, f.explanation
    assert float(part.group(1)) * (1e3 if part.group(2) == "us" else 1e6) < f.time_lost_ns
    assert f.recommendation.startswith("Compile the model for the copies that feed batched "
                                       "matmuls")
    # compiled, as advised, the attention runs inside the graphs: no such copy is launched
    copies, _ = layout_copies(compiled)
    assert not feeds_head_matmul(compiled, copies).any()
