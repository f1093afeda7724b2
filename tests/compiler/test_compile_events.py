"""Graph breaks and recompiles show up as CompileEvents with their reasons and the
user's source line; a graph traced with symbolic sizes compiles once and launches with
the real ones."""

from __future__ import annotations

import inspect
import time

import pytest
import torch

# each test counts its own function's compiles from the first call: in shuffled order
# another test's compiles of the same function at other sizes made the first symbolic
pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def line_of(fn, text: str) -> int:
    """The file line number of the first line of `fn` containing `text`."""
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def breaks_with_print(x):
    y = torch.relu(x) * 2
    print("checkpoint")  # Dynamo cannot trace print: the graph breaks here
    return y + 1


def test_graph_break_is_recorded_with_reason_and_user_line(recorder, capsys):
    x = torch.randn(4, 4)
    out = torch.compile(breaks_with_print, backend="neuron")(x.to("neuron"))
    assert torch.allclose(out.cpu(), breaks_with_print(x))
    assert "checkpoint" in capsys.readouterr().out

    (brk,) = recorder.compiles_of("graph_break")
    assert brk.start_ns == brk.end_ns  # an instant
    assert "print" in brk.args["reason"]
    line = line_of(breaks_with_print, "Dynamo cannot trace print")
    expected = f"{__file__}:{line} in breaks_with_print"
    assert brk.args["source"] == expected
    # Both halves still ran on the device as compiled graphs.
    assert len(recorder.graph_launches()) == 2


def scale_and_shift(x):
    return x * 2 + 1


def test_recompile_is_recorded_with_the_failed_guard_and_sizes_become_symbolic(recorder):
    compiled = torch.compile(scale_and_shift, backend="neuron")
    for rows in (4, 5, 7):
        x = torch.randn(rows, 3)
        assert torch.allclose(compiled(x.to("neuron")).cpu(), scale_and_shift(x))

    (recompile,) = recorder.compiles_of("recompile")
    assert "size mismatch" in recompile.args["reason"]
    assert "x" in recompile.args["reason"]
    assert recompile.args["source"].startswith(f"{__file__}:")
    assert recompile.args["source"].endswith("in scale_and_shift")

    # The second graph has symbolic sizes; each launch still reports real shapes.
    spans = [ev for ev in recorder.compiles_of("neuron_compile") if "sizes" not in ev.args]
    assert [ev.args["dynamic_shapes"] for ev in spans] == [False, True]
    launches = recorder.graph_launches()
    assert [op.input_shapes for op in launches] == [((4, 3),), ((5, 3),), ((7, 3),)]
    assert launches[1].graph_id == launches[2].graph_id != launches[0].graph_id
    kernels = {k.op_id: k for k in recorder.kernels}
    assert kernels[launches[2].op_id].hbm_bytes > kernels[launches[1].op_id].hbm_bytes


def double_rows(x):
    return torch.cat([x, x]) * 3


def test_a_symbolic_graph_compiles_once_and_runs_every_size(recorder):
    compiled = torch.compile(double_rows, backend="neuron")
    for rows in (4, 5, 7, 5, 9):
        x = torch.randn(rows, 3)
        assert torch.allclose(compiled(x.to("neuron")).cpu(), double_rows(x))
    launches = recorder.graph_launches()
    symbolic = launches[1].graph_id
    assert {op.graph_id for op in launches[1:]} == {symbolic}
    spans = recorder.compiles_of("neuron_compile")
    # one span per graph: the symbolic one compiled its program when it was traced
    assert [ev.args["graph_id"] for ev in spans] == [launches[0].graph_id, symbolic]
    assert spans[1].args["dynamic_shapes"] and spans[1].args["kernel_count"] == 1
    # ... and each size runs it at that size
    assert [op.input_shapes for op in launches] == [((n, 3),) for n in (4, 5, 7, 5, 9)]
    kernels = {k.op_id: k for k in recorder.kernels}
    hbm = [kernels[op.op_id].hbm_bytes for op in launches[1:]]
    assert hbm[0] < hbm[1] < hbm[3] and hbm[0] == hbm[2]


def test_a_new_size_of_a_symbolic_graph_costs_the_host_nothing(recorder, monkeypatch):
    """Planning a new size's instructions is the cost model's work: off the host clock."""
    from neuron_explorer.backend.clock import clock
    from neuron_explorer.backend.compiler.graph_compiler import CompiledGraph

    compiled = torch.compile(double_rows, backend="neuron")
    for rows in (4, 5):  # the second call traces the symbolic graph
        compiled(torch.randn(rows, 3, device="neuron"))
    plan = CompiledGraph._plan_launch

    def slow_plan(self, binding):
        time.sleep(0.2)  # a planning that takes long: the host clock must not see it
        return plan(self, binding)

    monkeypatch.setattr(CompiledGraph, "_plan_launch", slow_plan)
    x = torch.randn(9, 3, device="neuron")
    start = clock.now()
    compiled(x)
    assert clock.now() - start < 100_000_000
    assert not recorder.compiles_of("neuron_compile")[2:]


def test_new_sizes_after_the_recompile_leave_the_steady_state_alone(tmp_path):
    import neuron_explorer
    from neuron_explorer.analyses.steady_state import select_steps

    compiled = torch.compile(double_rows, backend="neuron")
    path = tmp_path / "sizes.pftrace"
    with neuron_explorer.record(path, level="op", quiet=True):
        for rows in (8, 9, 10, 11, 9, 10, 11):  # a recompile in step 1, new sizes to step 3
            compiled(torch.randn(rows, 3, device="neuron")).sum().item()
            neuron_explorer.step()
    trace = neuron_explorer.load(path)
    selection = select_steps(trace)
    assert selection.steps == (2, 3, 4, 5, 6)
    assert "after the last compile, in step 1" in selection.reason
    from neuron_explorer.report import render_report

    line = next(l for l in render_report(trace, "text").splitlines() if l.startswith("compile"))
    assert "in step 1 (not in the per-step figures)" in line, line
