"""The op families table (common/op_families.py): the lowering, the compiler, the numerics,
the what-if replay and the fp32_matmul rule agree with it, and no module outside common/
keeps a matmul list of its own."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest
import torch
from neuron_explorer import load
from neuron_explorer.backend import autocast, matmul_numerics
from neuron_explorer.backend.compiler import fusion
from neuron_explorer.backend.hardware import LOWERINGS, get_preset
from neuron_explorer.backend.hardware import lower_matmul as mmx
from neuron_explorer.backend.hardware.lowering import kernel_name
from neuron_explorer.backend.hardware.optable import ATTENTION, ATTENTION_BACKWARD, lowering_for
from neuron_explorer.backend.mixed_precision import with_dtype
from neuron_explorer.backend.replay import lower_key, spec_of
from neuron_explorer.common import op_families as of
from neuron_explorer.rules import fp32_matmul

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "explorer"))

import scenarios  # tests/explorer's hand-made traces

# The lowerings that make a matmul kernel, by the family of the ops they lower.
FAMILY_OF_LOWERING = {
    mmx.lower_mm: of.MATMUL, mmx.lower_linear: of.MATMUL, mmx.lower_dot: of.MATMUL,
    mmx.lower_addbmm: of.MATMUL,
    mmx.lower_convolution: of.CONVOLUTION, mmx.lower_convolution_backward: of.CONVOLUTION,
    mmx.lower_attention: of.ATTENTION, mmx.lower_attention_backward: of.ATTENTION,
}
# (op, matmul-like): the ops the rule and the replay are checked on.
SAMPLE = [("aten::mm", True), ("aten::addmm", True), ("aten::bmm", True),
          ("aten::matmul", True), ("aten::linear", True), ("aten::baddbmm", True),
          ("aten::conv2d", True), ("aten::add", False)]


def _lowering_family(op: str) -> str | None:
    fn = lowering_for(op)
    return FAMILY_OF_LOWERING.get(getattr(fn, "func", fn))


def test_names_read_as_their_packet():
    assert of.base_name("aten::addmm_.out") == "addmm"
    assert of.family("aten::addmm") == of.family("addmm.default") == of.MATMUL
    assert of.family("aten::convolution_backward") == of.CONVOLUTION
    assert of.family("aten::_scaled_dot_product_flash_attention") == of.ATTENTION
    assert of.family("aten::add.Tensor") is None and of.family("aten::mm_like") is None
    assert of.is_matmul("aten::bmm") and not of.is_matmul("aten::conv2d")
    assert of.is_matmul_like("aten::conv2d") and not of.is_matmul_like("aten::relu")


def test_families_are_disjoint_and_their_subsets_are_matmuls():
    names = [op for ops in of.FAMILIES.values() for op in ops]
    assert len(names) == len(set(names))
    assert of.GEMM.issubset(of.FAMILIES[of.MATMUL])
    assert of.ADDS_INPUT.issubset(of.FAMILIES[of.MATMUL])


def test_every_op_lowered_to_a_matmul_kernel_is_in_its_family():
    lowered = {op: _lowering_family(op) for op in LOWERINGS}
    matmul_kernels = {op: fam for op, fam in lowered.items() if fam is not None}
    assert {"mm", "addmm", "bmm", "baddbmm", "linear", "conv2d"} <= set(matmul_kernels)
    assert {op: of.family(op) for op in matmul_kernels} == matmul_kernels


def test_every_op_of_a_family_the_device_runs_has_its_familys_lowering():
    for name, ops in of.FAMILIES.items():
        for op in ops:
            assert lowering_for(op) is None or _lowering_family(op) == name, op
    assert {*ATTENTION, *ATTENTION_BACKWARD} <= of.FAMILIES[of.ATTENTION]


def test_ops_that_add_an_input_lower_with_it_first():
    for op in of.ADDS_INPUT:
        fn = lowering_for(op)
        # addbmm sums its batch away: a lowering of its own, which takes the input first
        assert fn is mmx.lower_addbmm if op == "addbmm" else \
            getattr(fn, "keywords", {}).get("bias_first") is True, op
    plain = of.FAMILIES[of.MATMUL] - of.ADDS_INPUT
    assert not any(getattr(lowering_for(op), "keywords", {}) for op in plain)


def test_the_compilers_anchors_are_the_gemms_and_the_convolutions():
    assert {op.name() for op in fusion._EPILOGUE_ANCHORS} == {f"aten::{n}" for n in of.GEMM}
    assert all(of.family(op.name()) in (of.MATMUL, of.CONVOLUTION) for op in fusion._MATMULS)


def test_gemms_are_named_by_their_dims():
    x, w = ((64, 32), "float32"), ((32, 16), "float32")
    key = ("aten::mm", (x, w), (((64, 16), "float32"),), ())
    assert kernel_name("mm", spec_of(key)) == "mm_f32_64x32x16"


def test_host_numerics_round_once_for_matmuls_and_convolutions_only():
    call = torch.mm
    for name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::convolution",
                 "aten::convolution_backward", "aten::mv", "aten::dot"):
        assert isinstance(matmul_numerics.host_kernel(name, call), matmul_numerics.Fp32Accumulate)
    for name in ("aten::add", "aten::addmm_", "aten::_scaled_dot_product_flash_attention"):
        assert matmul_numerics.host_kernel(name, call) is call


def test_autocast_lowers_the_precision_of_matmul_like_ops():
    """Autocast's list is PyTorch's CUDA policy: matmul-like ops, and addr and prelu."""
    others = {n for n in autocast.LOWER_PRECISION if not of.is_matmul_like(n)}
    assert others == {"addr", "prelu"}


@pytest.mark.parametrize("name, matmul_like", SAMPLE)
def test_the_replay_casts_the_tables_matmuls(name, matmul_like):
    assert of.is_matmul_like(name) is matmul_like
    f32 = ((64, 64), "float32")
    key = (name, (f32, f32), (f32,), ())
    assert (with_dtype(key, "bf16") != key) is matmul_like


def test_the_replay_casts_attention_and_it_gets_faster():
    q = ((8, 128, 64), "float32")
    key = ("aten::_scaled_dot_product_fused_attention_overrideable", (q, q, q), (q,), ())
    trn2 = get_preset("trn2")
    before, _ = lower_key(key, trn2)
    after, _ = lower_key(with_dtype(key, "bf16"), trn2)
    assert before is not None and after is not None
    assert after.duration_ns < before.duration_ns


@pytest.mark.parametrize("name, matmul_like", SAMPLE)
def test_the_fp32_rule_flags_the_tables_matmuls(tmp_path, name, matmul_like):
    sc = scenarios.Scenario()
    sc.step(0)
    sc.op(100, 500, name, 1, 0, kernel=(700, 8000), busy={"tensor": 8000}, flops=10**6,
          dtypes="[float32, float32]", shapes="[[64, 64], [64, 64]]")
    findings = fp32_matmul.check(load(sc.write(tmp_path, "t"), cache=False))
    assert bool(findings) is matmul_like


# -- no local matmul lists --------------------------------------------------------------

FOLDERS = ["backend", "collectors", "workloads", "explorer", "webapp"]
# Lists that name matmuls among other ops for another reason: not which ops are matmuls.
OTHER_FACTS = {
    ("common/autocast_policy.py", "LOWER_PRECISION"): "PyTorch's CUDA autocast policy",
    ("backend/dispatch.py", "_SEE_MATH_BITS"): "ops PyTorch's conjugate fallback lets through",
    ("backend/kernels.py", "HOT_STRUCTURED"): "frequent ops of every kind, registered directly",
}


def _names(node: ast.AST) -> list[str]:
    """The op names in a literal collection (strings, `aten.<op>...` attributes) or in an
    alternation in a string ('mm|addmm|...')."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and "|" in node.value:
        return re.findall(r"\w+", node.value)
    names = []
    for e in getattr(node, "elts", []) if isinstance(node, (ast.Set, ast.List, ast.Tuple)) else []:
        while isinstance(e, ast.Attribute) and isinstance(e.value, ast.Attribute):
            e = e.value  # aten.mm.default -> aten.mm
        if isinstance(e, ast.Constant) and isinstance(e.value, str):
            names.append(e.value)
        elif isinstance(e, ast.Attribute):
            names.append(e.attr)
    return names


def _is_matmul_list(names: list[str]) -> bool:
    """Two matmuls or more, a GEMM among them (a stated exception to a family, such as
    `GEMM | {"matmul", "linear"}`, names no GEMM)."""
    matmuls = [n for n in names if of.is_matmul(n)]
    return len(matmuls) >= 2 and any(of.base_name(n) in of.GEMM for n in matmuls)


def _local_lists(rel: str, source: str) -> list[str]:
    """Where the module at `rel` names two or more matmuls in one literal."""
    tree = ast.parse(source)
    owner: dict[int, str] = {}  # node -> the name it is assigned to
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            for inner in ast.walk(node):
                owner.setdefault(id(inner), names[0] if names else "")
    found = []
    for node in ast.walk(tree):
        names = _names(node)
        if _is_matmul_list(names) and (rel, owner.get(id(node), "")) not in OTHER_FACTS:
            found.append(f"{rel}:{getattr(node, 'lineno', '?')}: {', '.join(names)}")
    return found


def test_no_module_outside_common_lists_matmuls():
    files = [p for folder in FOLDERS for p in sorted((REPO / folder).rglob("*.py"))]
    assert len(files) > 100
    found = [line for path in files
             for line in _local_lists(path.relative_to(REPO).as_posix(),
                                      path.read_text(encoding="utf-8"))]
    assert not found, "read common/op_families.py instead:\n" + "\n".join(found)


@pytest.mark.parametrize("source", [
    'MATMULS = {"aten::mm", "aten::bmm"}\n',
    'if base in ("mm", "addmm", "gelu"):\n    pass\n',
    "ANCHORS = {aten.mm.default, aten.addmm.default}\n",
    'MATMUL = re.compile(r"(?:^|::)(?:mm|addmm|bmm)$")\n',
])
def test_the_check_finds_a_local_list(source):
    assert _local_lists("backend/x.py", source)
    assert not _local_lists("backend/x.py", 'ONE = {"aten::mm", "aten::add"}\n')
