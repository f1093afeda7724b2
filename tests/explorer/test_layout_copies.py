"""Layout copies: a permuted view made contiguous before a matmul every step. A trial's
attention block made five such copies a step, 6% of it, and no finding named them."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import record_variants
from neuron_explorer import load
from neuron_explorer.analyses.steady_state import in_analysed_steps
from neuron_explorer.common import trace_format as tf

pytestmark = pytest.mark.slow
PROGRAM = Path(__file__).parent / "programs" / "permuted_matmul.py"


def _median_step(trace) -> float:
    return float(in_analysed_steps(trace, trace.steps)["dur"].median())


def test_a_permuted_matmul_input_claims_what_keeping_its_layout_saves(tmp_path) -> None:
    paths = record_variants(tmp_path, PROGRAM, {"permuted": [], "fixed": ["--fixed"]},
                            modelled=True)
    permuted, fixed = load(paths["permuted"]), load(paths["fixed"])
    copies = permuted.ops[permuted.ops["name"] == "aten::_copy_from"]
    marked = permuted.slice_args.column(tf.ARG_LAYOUT_COPY, copies["id"].to_numpy())
    assert len(copies) == 8 and all(bool(m) for m in marked)  # one a step, each marked
    (f,) = [f for f in permuted.bottlenecks() if f.rule_id == "layout_copies"]
    assert f.title == "Layout copies: a strided view made contiguous a step"
    line = PROGRAM.read_text().splitlines().index(
        "        h = torch.matmul(x.permute(1, 0, 2), self.w)  # a copy: the view made "
        "contiguous") + 1
    assert f"permuted_matmul.py:{line}" in f.explanation
    assert "the two savings overlap rather than add" in f.explanation  # compiling folds them
    saved = _median_step(permuted) - _median_step(fixed)
    assert saved > 0.03 * _median_step(permuted)  # the premise
    claimed = f.time_lost_ns / len(in_analysed_steps(permuted, permuted.steps))
    assert claimed == pytest.approx(saved, rel=0.1), (claimed, saved)
    assert not [g for g in fixed.bottlenecks() if g.rule_id == "layout_copies"]
