"""An op with no device lowering inside a compiled graph runs on the host: the recording
warned, but the trace had no fallback op and no finding named it. The graph's launch is
marked a fallback, its compile span lists the ops, and `host_fallback` names them."""

from __future__ import annotations

import warnings

import neuron_explorer
import torch
import torch.nn.functional as F


def test_a_fallback_inside_a_compiled_graph_reaches_the_finding(tmp_path):
    conv = torch.nn.Conv2d(4, 4, 3, padding=1).to("neuron")

    def f(x):  # nearest upsampling decomposes to aten::_unsafe_index, which has no lowering
        return conv(F.interpolate(x, scale_factor=2, mode="nearest")).sum()

    g = torch.compile(f, backend="neuron")
    path = tmp_path / "fallback.pftrace"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with neuron_explorer.record(path, level="op", quiet=True):
            x = torch.randn(1, 4, 8, 8).to("neuron")
            for _ in range(3):
                g(x).item()
                neuron_explorer.step()
    assert any("aten::_unsafe_index has no neuron device lowering" in str(w.message)
               for w in caught)
    trace = neuron_explorer.load(path)
    graphs = trace.ops[trace.ops["name"].str.startswith("graph:")]
    assert len(graphs) and graphs["fallback"].astype(bool).all()
    (finding,) = [f for f in trace.bottlenecks() if f.rule_id == "host_fallback"]
    assert "aten::_unsafe_index" in finding.explanation
    assert any("inside graph:" in e["description"] for e in finding.evidence)


def test_a_dtype_cast_left_by_a_decomposition_runs_on_the_device():
    """`prims::convert_element_type` (a cast decompositions leave in graphs; a user's
    `h / (h.abs().mean().item() + 1.0)` made one a call) had no lowering: it ran on the
    host, a round trip each call."""
    def f(x):
        return torch.ops.prims.convert_element_type(x * 2, torch.float16) + 1

    g = torch.compile(f, backend="neuron")
    x = torch.randn(64, 64, device="neuron")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = g(x)
    assert not [w for w in caught if "no neuron device lowering" in str(w.message)]
    assert out.dtype == torch.float16
    expected = torch.ops.prims.convert_element_type(x.cpu() * 2, torch.float16) + 1
    assert torch.equal(out.cpu(), expected)
