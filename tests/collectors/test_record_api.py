"""The Python API in-process: record(), step(), annotate(), hooks, compile events, clock."""

from __future__ import annotations

import threading
import time

import neuron_explorer
import pytest
import torch
from neuron_explorer.backend.clock import clock
from neuron_explorer.backend.events import CompileEvent, KernelRun, OpLaunch, hub
from neuron_explorer.collectors import session
from neuron_explorer.collectors.trace_writer import RecordingError
from torch import nn

from .trace_reading import parse


def _train(steps: int, explicit_every: int | None = None) -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 2)).to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    @neuron_explorer.annotate("batch")
    def batch() -> torch.Tensor:
        return torch.randn(4, 8, device="neuron")

    if explicit_every:
        neuron_explorer.step()  # from here on only explicit marks end steps
    for i in range(steps):
        with neuron_explorer.annotate("iteration"):
            loss = model(batch()).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
        if explicit_every and (i + 1) % explicit_every == 0:
            neuron_explorer.step()


@pytest.fixture(scope="module")
def explicit_steps_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("api") / "run.pftrace"
    with neuron_explorer.record(path, level="engine", quiet=True) as rec:
        _train(4, explicit_every=2)
    assert rec.recorder.steps_completed == [0, 1, 2]
    return parse(path)


def test_explicit_steps_override_optimizer_steps(explicit_steps_trace) -> None:
    steps = explicit_steps_trace.by_category("step")
    assert [s.args["step"] for s in steps] == [0, 1, 2]
    optimizer = [s for s in explicit_steps_trace.by_category("optimizer") if s.name == "SGD.step"]
    assert [o.args["step"] for o in optimizer] == [1, 1, 2, 2]


def test_a_first_mark_right_after_a_step_ends_that_step(tmp_path) -> None:
    """A no-grad loop marking steps after each model call: the model's return ends the
    first step before the first mark, which ended an empty step of its own (0 ns, read
    as a training step among eval passes: a report's step time of 0 and shares of inf)."""
    model = nn.Linear(8, 2).to("neuron")
    x = torch.randn(4, 8, device="neuron")
    path = tmp_path / "marks.pftrace"
    with neuron_explorer.record(path, level="op", quiet=True) as rec, torch.no_grad():
        for _ in range(3):
            model(x)
            neuron_explorer.step()
    assert rec.recorder.steps_completed == [0, 1, 2]
    steps = parse(path).by_category("step")
    assert len(steps) == 3 and min(s.dur for s in steps) > 0


def test_annotations_nest_and_decorate(explicit_steps_trace) -> None:
    annotations = explicit_steps_trace.by_category("annotation")
    iterations = [a for a in annotations if a.name == "iteration"]
    batches = [a for a in annotations if a.name == "batch"]
    assert len(iterations) == 4 and len(batches) == 4
    assert all(b.parent.name == "iteration" for b in batches)
    assert all(i.parent.category == "step" for i in iterations)


def test_modules_forward_and_backward(explicit_steps_trace) -> None:
    forward = {m.args["module"] for m in explicit_steps_trace.by_category("module")}
    assert forward == {"model", "model.0", "model.1", "model.2"}
    backward = explicit_steps_trace.by_category("backward")
    assert {b.args["module"] for b in backward} >= {"model", "model.0", "model.2"}
    assert all(b.args["phase"] == "backward" for b in backward)
    nested = [b for b in backward if b.args["module"] == "model.2"]
    assert all(b.parent.args["module"] == "model" for b in nested)


def test_record_function_ranges_are_annotations(tmp_path) -> None:
    path = tmp_path / "rf.pftrace"
    with (neuron_explorer.record(path, level="framework", quiet=True),
          torch.profiler.record_function("my_range")):
        torch.ones(2, device="neuron").sum().item()
    trace = parse(path)
    ranges = [a for a in trace.by_category("annotation") if a.name == "my_range"]
    assert len(ranges) == 1
    assert trace.by_category("sync")[0].parent is ranges[0]
    assert not trace.by_category("op")  # framework level


def test_step_window_from_the_api(tmp_path) -> None:
    path = tmp_path / "w.pftrace"
    with neuron_explorer.record(path, level="op", steps=(1, 3), quiet=True) as rec:
        _train(5)
        assert rec.recorder.stopped  # the window closed the trace at step 3
    trace = parse(path)
    assert [s.args["step"] for s in trace.by_category("step")] == [1, 2]
    assert {o.args["step"] for o in trace.by_category("op")} == {1, 2}


def test_only_one_recording_at_a_time(tmp_path) -> None:
    with (neuron_explorer.record(tmp_path / "a.pftrace", quiet=True),
          pytest.raises(RecordingError, match="already recording")):
        neuron_explorer.record(tmp_path / "b.pftrace").start()
    assert session.active() is None


def test_full_disk_stops_recording_not_the_program(capsys) -> None:
    with neuron_explorer.record("/dev/full", level="framework", quiet=True):
        _train(2)  # a step end flushes: the write fails there
    err = capsys.readouterr().err
    assert "stopped recording: cannot write to /dev/full" in err
    assert session.active() is None


def test_recording_time_is_kept_off_the_host_clock(tmp_path, monkeypatch) -> None:
    from neuron_explorer.collectors.perfetto_writer import PerfettoWriter

    original = PerfettoWriter.begin

    def slow_begin(self, *args, **kwargs):
        time.sleep(0.002)  # recording that costs 2 ms per slice
        return original(self, *args, **kwargs)

    monkeypatch.setattr(PerfettoWriter, "begin", slow_begin)
    model = nn.Sequential(*[nn.Identity() for _ in range(50)])
    x = torch.ones(2)
    with neuron_explorer.record(tmp_path / "c.pftrace", level="framework", quiet=True):
        real0, host0 = time.perf_counter_ns(), clock.now()
        model(x)
        real, host = time.perf_counter_ns() - real0, clock.now() - host0
    assert real > 51 * 2_000_000  # the slow recording really ran
    assert host < real / 4  # but the program's timeline does not show it


def test_compile_spans_nest_and_breaks_are_instants(tmp_path) -> None:
    path = tmp_path / "compile.pftrace"
    with neuron_explorer.record(path, level="op", quiet=True):
        t = clock.now()
        # sent as each span ends: innermost first
        hub.compile_event(CompileEvent("neuron_compile", "neuron_compile", t + 20, t + 60,
                                       {"graph_id": 1, "kernels": 3}))
        hub.compile_event(CompileEvent("aot_autograd", "aot_autograd", t + 10, t + 70))
        hub.compile_event(CompileEvent("graph_break", "graph_break", t + 80, t + 80,
                                       {"reason": "print()", "source": "train.py:9"}))
        hub.compile_event(CompileEvent("dynamo", "dynamo", t, t + 100, {"graph_id": 1}))
        hub.compile_event(CompileEvent("recompile", "recompile", t + 150, t + 150,
                                       {"reason": "guard failed: x.size(0) == 4"}))
    trace = parse(path)
    spans = {s.name: s for s in trace.by_category("compile")}
    assert spans["dynamo"].depth + 1 == spans["aot_autograd"].depth
    assert spans["neuron_compile"].parent is spans["aot_autograd"]
    assert spans["neuron_compile"].args["kernels"] == 3
    breaks = [i for i in trace.instants if i.category == "graph_break"]
    assert breaks[0].args["reason"] == "print()" and breaks[0].args["source"] == "train.py:9"
    recompiles = [i for i in trace.instants if i.category == "recompile"]
    assert "guard failed" in recompiles[0].args["reason"]


def test_overlapping_kernels_get_their_own_lanes(tmp_path) -> None:
    path = tmp_path / "lanes.pftrace"
    tid = threading.get_ident()
    with neuron_explorer.record(path, level="op", quiet=True):
        t = clock.now()
        for op_id, (start, end) in enumerate([(100, 500), (200, 300), (600, 700)], 1_000_001):
            hub.kernel_scheduled(KernelRun(op_id, op_id, f"k{op_id}", 0, t, t + start, t + end,
                                           1, 1, 1, {"tensor": end - start}, 0, 0))
            hub.op_launched(OpLaunch(op_id, "aten::mm", 0, t, t + 10, ((2, 2),), ("float32",),
                                     1, 1, False, (op_id,), tid))
    trace = parse(path)
    kernels = trace.by_category("kernel")
    lanes = {k.name: trace.track_name(k.track) for k in kernels}
    assert lanes["k1000001"] == "Kernels" and lanes["k1000003"] == "Kernels"
    assert lanes["k1000002"] == "Kernels 2"
    assert all(k.depth == 0 for k in kernels)


@pytest.mark.filterwarnings("ignore:Using `torch.compile:UserWarning")
def test_torch_compile_runs_are_recorded_without_compiler_internals(tmp_path) -> None:
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)).to("neuron")
    compiled = torch.compile(model, backend="neuron")
    x = torch.randn(8, 16, device="neuron")
    path = tmp_path / "compiled.pftrace"
    with neuron_explorer.record(path, level="op", quiet=True):
        for _ in range(2):
            compiled(x).sum().backward()
    trace = parse(path)
    modules = {m.args["module"] for m in trace.by_category("module")}
    assert modules == {"model"}  # no fx GraphModules from the compiler
    compile_spans = trace.by_category("compile")
    assert compile_spans and all(s.parent is not None for s in compile_spans)
    graph_ops = [o for o in trace.by_category("op") if "graph_id" in o.args]
    assert len(graph_ops) >= 4  # forward and backward graphs, two iterations
    assert all(o.parent.category in ("module", "backward", "step") for o in graph_ops)


def test_memory_an_op_allocates_is_dated_at_the_op(tmp_path) -> None:
    """Allocations inside an op's emulation read the clock before the emulation is taken
    off it: in an inference script the outputs of nn.MultiheadAttention's fast path showed
    up on the HBM counter after the program had exited (it fell to 0, then rose again)."""
    path = tmp_path / "mha.pftrace"
    attn = nn.MultiheadAttention(64, 4, batch_first=True).to("neuron").eval()
    x = torch.randn(2, 16, 64).to("neuron")
    with neuron_explorer.record(path, level="op", quiet=True), torch.no_grad():
        y = attn(x, x, x, need_weights=False)[0]
        del y
    trace = neuron_explorer.load(path)
    ops = trace.ops
    (mha,) = ops[ops["name"] == "aten::_native_multi_head_attention"].itertuples()
    hbm = trace.table("counters").sort_values("ts", kind="stable")
    inside = hbm[(hbm["ts"] > mha.ts) & (hbm["ts"] < mha.ts + mha.dur)]
    assert inside.empty  # nothing dated in the middle of the fallback op
    assert (hbm["ts"] == mha.ts).any()  # its output, at its start


def test_step_used_as_a_with_block_says_how_steps_are_marked() -> None:
    """`with neuron_explorer.step():` failed on None ("'NoneType' object does not support
    the context manager protocol"); it now says to call it at the end of each step."""
    with pytest.raises(TypeError, match=r"call it once at the end of each step"), \
            neuron_explorer.step():
        pass
