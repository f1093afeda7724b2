"""Graph breaks and recompiles show up as CompileEvents with their reasons and the
user's source line; a graph traced with symbolic sizes launches with the real ones."""

from __future__ import annotations

import inspect

import torch


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
    spans = recorder.compiles_of("neuron_compile")
    assert [ev.args["dynamic_shapes"] for ev in spans] == [False, True]
    launches = recorder.graph_launches()
    assert [op.input_shapes for op in launches] == [((4, 3),), ((5, 3),), ((7, 3),)]
    assert launches[1].graph_id == launches[2].graph_id != launches[0].graph_id
    kernels = {k.op_id: k for k in recorder.kernels}
    assert kernels[launches[2].op_id].hbm_bytes > kernels[launches[1].op_id].hbm_bytes
