"""Ops common models reach without asking (the attention layers' eval fast paths,
sorting, top-k, distances, bags of embeddings, searchsorted, bincount) run on the
device: no host-fallback warning, the CPU's exact numbers, and kernels on the engines
the chip would use, in eager and compiled mode."""

from __future__ import annotations

import warnings

import pytest
import torch
from neuron_explorer.backend.events import EventSink, hub
from neuron_explorer.backend.hardware.kernel import ENGINE_NAMES


class Kernels(EventSink):
    """The engines each kernel of an op used, by op name."""

    def __init__(self) -> None:
        self.ops: dict[int, str] = {}
        self.engines: dict[str, set[str]] = {}
        self.fallback: list[str] = []

    def op_launched(self, ev) -> None:
        if ev.fallback:
            self.fallback.append(ev.name)

    def kernel_scheduled(self, ev) -> None:
        kernel = ev.kernel
        arrays = kernel.arrays()
        if kernel.section is None:
            labels = [ev.name] * len(kernel)
        else:
            names = [s.ops[0] for s in kernel.sections]
            labels = [names[i] for i in kernel.section.tolist()]
        for engine, label in zip(arrays["engine"].tolist(), labels, strict=True):
            name = ENGINE_NAMES[engine]
            self.engines.setdefault(label, set()).add("dma" if name.startswith("dma") else name)


@pytest.fixture
def kernels():
    sink = Kernels()
    hub.subscribe(sink, instruction_arrays=True)
    yield sink
    hub.unsubscribe(sink)


def _on_device(fn, *tensors):
    """fn on neuron tensors (results back on the host), failing on any fallback warning."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*no neuron device lowering.*")
        out = fn(*[t.to("neuron") for t in tensors])
    return torch.utils._pytree.tree_map(
        lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, out)


def _engines_of(kernels: Kernels, op: str) -> set[str]:
    base = op.split("::")[-1]  # eager kernels are named "topk_f32_8x5", sections "aten::topk"
    found = [engines for label, engines in kernels.engines.items()
             if label.split("::")[-1].startswith(base)]
    assert found, f"no kernel for {op}: {sorted(kernels.engines)}"
    return set().union(*found)


def _assert_exact(got, want) -> None:
    got, want = torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w), (g, w)


def _data():
    torch.manual_seed(0)
    return torch.randn(8, 64)


CASES = {
    "topk": (lambda x: torch.topk(x, 5, dim=-1), "aten::topk", {"gpsimd"}),
    "sort": (lambda x: torch.sort(x, dim=-1), "aten::sort", {"gpsimd"}),
    "cdist": (lambda x: torch.cdist(x[:4, :16], x[4:, :16]), "aten::_cdist_forward",
              {"tensor", "vector", "scalar"}),
    "searchsorted": (lambda x: torch.searchsorted(x.sort(dim=-1).values, x),
                     "aten::searchsorted", {"gpsimd"}),
    "bincount": (lambda x: torch.bincount((x.abs() * 4).long().flatten()), "aten::bincount",
                 {"gpsimd"}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_runs_on_the_device_with_exact_numbers(name, kernels):
    fn, op, engines = CASES[name]
    x = _data()
    _assert_exact(_on_device(fn, x), fn(x))
    assert op not in kernels.fallback
    assert engines <= _engines_of(kernels, op)


def test_embedding_bag_gathers_and_reduces_on_the_device(kernels):
    torch.manual_seed(0)
    bag = torch.nn.EmbeddingBag(50, 16, mode="sum")
    indices = torch.randint(0, 50, (40,))
    offsets = torch.tensor([0, 7, 19, 30])
    want = bag(indices, offsets)
    got = _on_device(lambda i, o: bag.to("neuron")(i, o), indices, offsets)
    assert torch.equal(got, want)
    engines = _engines_of(kernels, "aten::_embedding_bag")
    assert {"gpsimd", "vector", "dma"} <= engines
    assert not [op for op in kernels.fallback if "embedding_bag" in op]


def test_multihead_attention_fast_path_runs_like_sdpa(kernels):
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(32, 4, batch_first=True).eval()
    q = torch.randn(2, 10, 32)
    with torch.no_grad():
        want = mha(q, q, q)
        device_mha = mha.to("neuron")
        got = _on_device(lambda t: device_mha(t, t, t), q)
    _assert_exact(got, want)
    engines = _engines_of(kernels, "aten::_native_multi_head_attention")
    assert {"tensor", "vector", "scalar"} <= engines
    assert not kernels.fallback


def test_transformer_encoder_layer_fast_path_stays_on_the_device(kernels):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True).eval()
    src = torch.randn(2, 10, 32)
    with torch.no_grad():
        want = layer(src)
        device_layer = layer.to("neuron")
        got = _on_device(device_layer, src)
    assert torch.equal(got, want)
    assert {"tensor", "vector", "scalar"} <= _engines_of(
        kernels, "aten::_transformer_encoder_layer_fwd")
    assert not kernels.fallback


def test_compiled_graph_runs_the_lowerings_inside_its_program(kernels):
    def fn(x):
        values, _ = torch.topk(x, 4, dim=-1)
        ordered = torch.sort(x, dim=-1).values
        return values.sum() + ordered[:, 0].sum() + torch.cdist(x[:4, :16], x[4:, :16]).sum()

    x = _data()
    compiled = torch.compile(fn, backend="neuron", fullgraph=True)
    got = _on_device(compiled, x)
    assert torch.allclose(got, fn(x), rtol=1e-6)
    assert not kernels.fallback
    assert "gpsimd" in _engines_of(kernels, "aten::topk")
    assert "gpsimd" in _engines_of(kernels, "aten::sort")
    assert "tensor" in _engines_of(kernels, "aten::_cdist_forward")


@pytest.mark.slow
def test_compiled_attention_layer_and_bags_stay_on_the_device(kernels):
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(32, 4, batch_first=True).eval()
    bag = torch.nn.EmbeddingBag(50, 32, mode="mean")
    indices = torch.randint(0, 50, (20,))
    offsets = torch.tensor([0, 5, 11])
    q = torch.randn(3, 10, 32)

    def fn(layer, bags, q, indices, offsets):
        return layer(q, q, q, need_weights=False)[0].sum(1) + bags(indices, offsets)

    with torch.no_grad():
        want = fn(mha, bag, q, indices, offsets)
        compiled = torch.compile(fn, backend="neuron")
        device_mha, device_bag = mha.to("neuron"), bag.to("neuron")
        got = _on_device(lambda *t: compiled(device_mha, device_bag, *t), q, indices, offsets)
    assert torch.allclose(got, want, atol=1e-5)
    assert not kernels.fallback
    assert {"gpsimd", "vector"} <= _engines_of(kernels, "aten::_embedding_bag")
    assert "tensor" in set().union(*kernels.engines.values())
