"""An op with no device lowering inside a compiled graph runs on the host: the recording
warned, but the trace had no fallback op and no finding named it. The graph's launch is
marked a fallback, its compile span lists the ops, and `host_fallback` names them."""

from __future__ import annotations

import warnings

import neuron_explorer
import torch
import torch.nn.functional as F
from neuron_explorer.analyses.phases import in_analysed_work


def test_a_fallback_inside_a_compiled_graph_reaches_the_finding(tmp_path):
    from neuron_explorer.backend import runtime

    # the backend warns once per op, when it first lowers it: another test's graph may have
    # lowered it already (the warning then never came, and this failed in shuffled order)
    runtime._warned_fallback.discard("aten::_unsafe_index")
    for key in [k for k in runtime._lowered if k[0] == "aten::_unsafe_index"]:
        del runtime._lowered[key]
    conv = torch.nn.Conv2d(4, 4, 3, padding=1).to("neuron")

    def f(x):  # nearest upsampling decomposes to aten::_unsafe_index, which has no lowering
        return conv(F.interpolate(x, scale_factor=2, mode="nearest")).sum()

    path, caught = _record_compiled(f, tmp_path / "fallback.pftrace", calls=3)
    assert any("aten::_unsafe_index has no neuron device lowering" in str(w.message)
               for w in caught)
    trace = neuron_explorer.load(path)
    graphs = trace.ops[trace.ops["name"].str.startswith("graph:")]
    assert len(graphs) and graphs["fallback"].astype(bool).all()
    (finding,) = [f for f in trace.bottlenecks() if f.rule_id == "host_fallback"]
    assert "aten::_unsafe_index" in finding.explanation
    assert any("inside graph:" in e["description"] for e in finding.evidence)


def test_each_fallback_a_graph_runs_is_counted(tmp_path):
    """A graph running an op with no lowering twice a call, called 3 times: 6 ran on the
    host. A trial's router ran `nonzero` once per expert, 72 times in 9 calls, and the
    finding said "(9x)": each graph's ops were listed once."""
    conv = torch.nn.Conv2d(4, 4, 3, padding=1).to("neuron")

    def f(x):  # each nearest upsampling decomposes to one aten::_unsafe_index
        up = F.interpolate(x, scale_factor=2, mode="nearest")
        return conv(F.interpolate(up, scale_factor=2, mode="nearest")).sum()

    path, _ = _record_compiled(f, tmp_path / "twice.pftrace", calls=4)
    trace = neuron_explorer.load(path)
    (finding,) = [f for f in trace.bottlenecks() if f.rule_id == "host_fallback"]
    launches = int(in_analysed_work(trace, trace.ops)["name"].str.startswith("graph:").sum())
    assert f"aten::_unsafe_index ({2 * launches}x)" in finding.explanation, (
        launches, finding.explanation)


def _record_compiled(f, path, calls: int) -> tuple:
    """`f` compiled, called `calls` times on a 1x4x8x8 input (a step each) while recorded
    into `path`: (path, the warnings caught)."""
    g = torch.compile(f, backend="neuron")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with neuron_explorer.record(path, level="op", quiet=True):
            x = torch.randn(1, 4, 8, 8).to("neuron")
            for _ in range(calls):
                g(x).item()
                neuron_explorer.step()
    return path, caught


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


def test_a_data_dependent_size_inside_a_graph_is_bound_from_its_run(recorder):
    """Under `capture_dynamic_output_shape_ops` (Dynamo's own advice at a boolean mask's
    graph break) the selection stays in the graph, its size known only once the graph has
    run (Dynamo's unbacked u0): the program was planned before the run and the call
    failed, "symbolic size u0 needs a binding". It is planned after the run, for each
    selected size; Dynamo's checks on that size (`_assert_scalar`) are host ints, not ops
    that fall back to the host."""
    def f(x):
        h = x * 2
        return h[h > 0].pow(2).mean() + h.sum()

    g = torch.compile(f, backend="neuron", fullgraph=True)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for positive in (10, 50):
            x = torch.cat([torch.full((positive,), 0.5), -torch.ones(64 - positive)])
            out = g(x.to("neuron"))
            assert torch.equal(out.cpu(), f(x))
    assert len(recorder.graph_launches()) == 2
    assert not [w for w in caught if "_assert_scalar" in str(w.message)]
