"""`neuron-explorer record` end to end: real programs on the neuron device, traces parsed back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import neuron_explorer
import pytest
from neuron_explorer.collectors.output_claim import lock_file
from neuron_explorer.common.trace_format import CAT_METADATA, ENGINE_TRACKS
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from .conftest import CLI, cli_env
from .trace_reading import parse, read_events


def _assert_the_host_clock_never_stepped_back(trace) -> None:
    """The recorder writes each track's slices of one category in the order they happened,
    so a begin stamped before the one written before it is the host clock stepping back.
    It once did, around a long GC pause in the first forward (the pause taken off twice:
    `test_a_gc_pause_inside_a_stamp_is_taken_off_once`), and ops then nested under the
    wrong slices in 3 of 6 recordings of this program."""
    categories: dict[int, str] = {}
    last: dict[tuple[int, int], int] = {}
    for p in trace.packets:
        for c in p.interned_data.event_categories:
            categories[c.iid] = c.name
        te = p.track_event
        if not p.HasField("track_event") or te.type != pb.TrackEvent.TYPE_SLICE_BEGIN:
            continue
        key = (te.track_uuid, te.category_iids[0])
        assert p.timestamp + 1000 >= last.get(key, 0), (
            f"the host clock stepped back {last[key] - p.timestamp} ns between two "
            f"{categories.get(key[1])} slices")
        last[key] = max(last.get(key, 0), p.timestamp)


def test_records_a_training_script_into_a_complete_trace(record_cli, programs: Path) -> None:
    (programs / "train_small.pftrace").write_bytes(b"keep me")  # never overwritten silently
    proc = record_cli("train_small.py", "3")
    assert proc.returncode == 0, proc.stderr
    # the program ran as `python train_small.py 3` would
    assert "argv ['3'] main __main__" in proc.stdout
    assert proc.stdout.count("loss") == 3
    assert (programs / "train_small.pftrace").read_bytes() == b"keep me"
    out = programs / "train_small.1.pftrace"
    assert "trace written to train_small.1.pftrace" in proc.stderr
    assert "steps recorded: 3 (0–2)" in proc.stderr
    assert "neuron-explorer view train_small.1.pftrace" in proc.stderr

    trace = parse(out)
    names = trace.track_names()
    assert {"MainThread", "Kernels", "HBM in use (bytes)", *ENGINE_TRACKS.values()} <= names
    assert any(n.startswith("neuron:0 (") for n in names)
    assert any(n.startswith("DMA q") for n in names)

    meta = json.loads(trace.instants[0].args["json"])
    assert trace.instants[0].category == CAT_METADATA
    assert meta["level"] == "engine" and meta["command"][-2:] == ["train_small.py", "3"]
    assert meta["hardware"] in ("trn1", "trn2", "trn3") and meta["hardware_figures"]

    steps = trace.by_category("step")
    assert [s.args["step"] for s in steps][:3] == [0, 1, 2]
    assert all(s.depth == 0 for s in steps)

    ops = trace.by_category("op")
    addmm = [o for o in ops if o.name == "aten::addmm"]
    assert addmm, "forward matmuls are recorded"
    _assert_the_host_clock_never_stepped_back(trace)
    first = addmm[0]
    assert first.args["module"] == "model.0"
    assert first.args["source"].startswith("train_small.py:")
    assert first.args["shapes"].startswith("[[") and "float32" in first.args["dtypes"]
    assert first.args["flops"] > 0 and first.args["bytes"] > 0
    assert first.parent.name == "model.0" and first.parent.parent.name == "model"
    # every op of the loop sits inside a step and says which; setup before the first
    # step (model.to) and the code after the last one belong to no step
    first_step, last_step = steps[0], steps[-1]
    outside = 0
    for op in ops:
        top = op
        while top.parent is not None:
            top = top.parent
        if top.category == "step":
            assert top.args["step"] == op.args["step"]
        else:
            outside += 1
            assert op.ts < first_step.ts or op.ts >= last_step.ts + last_step.dur
    assert 0 < outside < len(ops) // 4

    backward = trace.by_category("backward")
    assert {"model", "model.0", "model.2"} <= {b.args["module"] for b in backward}
    assert any(o.args["module"] == "model.0" and o.parent.category == "backward" for o in ops)

    annotations = {a.name for a in trace.by_category("annotation")}
    assert {"forward_backward", "loss_fn", "optimizer_phase"} <= annotations
    assert {s.name for s in trace.by_category("optimizer")} >= {"SGD.step", "SGD.zero_grad"}
    assert trace.by_category("dataloader")
    syncs = trace.by_category("sync")
    assert syncs and syncs[0].args["source"].startswith("train_small.py:")

    # flows: op -> kernel -> first instruction on each engine
    kernels = {k.args["kernel_id"]: k for k in trace.by_category("kernel")}
    ops_by_flow = {f: o for o in ops for f in o.flow_out}
    for kernel in kernels.values():
        assert (kernel.flow_in
                and ops_by_flow[kernel.flow_in[0]].args["op_id"] == kernel.args["op_id"])
    assert ops_by_flow[first.flow_out[0]] is first
    kernel_of_flow = {f: k for k in kernels.values() for f in k.flow_out}
    instructions = trace.by_category("instruction") + trace.by_category("dma")
    ended = [i for i in instructions if i.flow_in]
    assert ended
    for ins in ended:
        assert kernel_of_flow[ins.flow_in[0]].args["kernel_id"] == ins.args["kernel_id"]
    assert {"engine", "opcode", "bytes", "flops", "kernel_id"} <= set(instructions[0].args)
    assert all(i.args["kernel_id"] in kernels for i in instructions)
    counter_names = {trace.track_name(t) for t, _, _ in trace.counters}
    assert {"HBM in use (bytes)", "SBUF occupancy (bytes)"} <= counter_names


def test_module_json_and_step_window(record_cli, programs: Path) -> None:
    proc = record_cli("--format", "json", "--level", "op", "--steps", "1:3", "-o", "w.json",
                      "-m", "train_small", "5")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("loss") == 5
    doc = json.loads((programs / "w.json").read_text())
    events = [e for e in doc["traceEvents"] if e]
    assert {e["ph"] for e in events} <= {"X", "i", "C", "s", "f", "M"}
    slices = [e for e in events if e["ph"] == "X"]
    assert all(isinstance(e["ts"], float) and isinstance(e["dur"], float) for e in slices)
    steps = sorted(e["args"]["step"] for e in slices if e["cat"] == "step")
    assert steps == [1, 2]
    ops = [e for e in slices if e["cat"] == "op"]
    assert ops and {e["args"]["step"] for e in ops} == {1, 2}
    assert not [e for e in slices if e["cat"] in ("instruction", "dma")]  # op level
    starts = {e["id"] for e in events if e["ph"] == "s"}
    assert starts and {e["id"] for e in events if e["ph"] == "f"} <= starts
    # a file cut short (a killed run) still reads up to the cut
    raw = (programs / "w.json").read_bytes()
    (programs / "cut.json").write_bytes(raw[: len(raw) // 2])
    partial = read_events(str(programs / "cut.json"))
    assert 10 < len(partial) < len(events) and partial == events[: len(partial)]


@pytest.mark.parametrize(("command", "mode", "code", "message"), [
    (["train_small.py"], "raise", 1, "ValueError: boom at step 2"),
    (["--", "python", "train_small.py"], "exit3", 3, None),
])
def test_program_errors_keep_the_exit_code_and_the_trace(
        record_cli, programs: Path, command: list[str], mode: str, code: int,
        message: str | None) -> None:
    proc = record_cli("-o", "t.pftrace", "--level", "framework", *command, "5", mode)
    assert proc.returncode == code, proc.stderr
    if message:
        assert message in proc.stderr
        assert 'train_small.py", line' in proc.stderr and "runpy" not in proc.stderr
    trace = parse(programs / "t.pftrace")
    assert [s.args["step"] for s in trace.by_category("step")][:2] == [0, 1]
    assert not trace.by_category("op")  # framework level
    # the trace says how the program ended, and its report leads with it (a crashed run's
    # report read as a finished run's)
    import neuron_explorer
    from neuron_explorer.report import report_sections

    loaded = neuron_explorer.load(programs / "t.pftrace", cache=False)
    assert loaded.metadata["exit_code"] == code
    said = report_sections(loaded)[0].content["program"]
    assert said.startswith(f"exited with code {code}")
    if message:
        raised = (programs / "train_small.py").read_text().splitlines().index(
            '            raise ValueError("boom at step 2")') + 1
        assert loaded.metadata["program_error"] == f"{message} (train_small.py:{raised})"
        assert message in said
    else:
        assert "program_error" not in loaded.metadata


def _start_looping(programs: Path, out: str) -> subprocess.Popen:
    proc = subprocess.Popen([*CLI, "-o", out, "--level", "op", "train_small.py", "3", "loop"],
                            cwd=programs, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=cli_env())
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        if "READY" in line or time.monotonic() > deadline:
            break
    return proc


def _assert_the_loaded_trace_says_whether_it_is_complete(path: Path, complete: bool) -> None:
    """Killed or not, the loaded trace says whether it is complete: a SIGKILL between two
    flushes leaves whole packets, and only the missing end mark tells."""
    import warnings

    import neuron_explorer
    from neuron_explorer.common.errors import TruncatedTraceWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = neuron_explorer.load(path, cache=False)
    cut = [w for w in caught if issubclass(w.category, TruncatedTraceWarning)]
    assert bool(cut) == (not complete), [str(w.message) for w in caught]
    if not complete:
        assert "no end mark" in str(cut[0].message)
        assert any("no end mark" in w for w in loaded.warnings)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signals_complete_the_trace(programs: Path, signum: int) -> None:
    proc = _start_looping(programs, "s.pftrace")
    time.sleep(0.5)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == -signum  # as `python train_small.py` ends on that signal
    if signum == signal.SIGINT:
        assert "KeyboardInterrupt" in stderr
    pb.Trace.FromString((programs / "s.pftrace").read_bytes())  # whole packets only
    trace = parse(programs / "s.pftrace")
    assert "trace written to s.pftrace" in stderr
    assert not os.path.exists(lock_file(str(programs / "s.pftrace")))  # its claim is gone
    assert len(trace.by_category("step")) >= 3
    assert trace.by_category("op")
    _assert_the_loaded_trace_says_whether_it_is_complete(programs / "s.pftrace", True)


def test_a_killed_recording_leaves_a_readable_prefix_and_refuses_a_second_meanwhile(
        record_cli, programs: Path) -> None:
    """A SIGKILL leaves the steps flushed before it, in whole packets, read as cut short.
    And two `record`s with one -o both said "trace written", the second silently replacing
    the first: while one writes it, the other is refused in one line; once it ends, even
    killed, the output is free again. (One looping recording for both: each recording
    costs seconds of imports.)"""
    out = programs / "same.pftrace"
    first = _start_looping(programs, out.name)
    try:
        second = record_cli("-o", out.name, "--level", "op", "train_small.py", "1")
        assert second.returncode == 2
        assert "same.pftrace is being written by another `neuron-explorer record`" in \
            second.stderr and second.stderr.count("\n") == 1, second.stderr
        time.sleep(0.5)
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=60)
    assert first.returncode == -signal.SIGKILL  # as `python train_small.py` ends on it
    packets = pb.Trace.FromString(out.read_bytes()).packet  # whole packets only
    # completed steps were flushed before the kill
    assert any(p.HasField("track_event") for p in packets)
    _assert_the_loaded_trace_says_whether_it_is_complete(out, False)
    assert os.path.exists(lock_file(str(out)))  # a killed recording leaves its claim's file
    again = record_cli("-o", out.name, "--level", "op", "train_small.py", "1")
    assert again.returncode == 0, again.stderr
    assert not os.path.exists(lock_file(str(out)))  # ... which the next one removes


def test_child_processes_are_recorded_into_their_own_traces(record_cli, programs: Path) -> None:
    proc = record_cli("-o", "c.pftrace", "--level", "op", "children.py")
    assert proc.returncode == 0, proc.stderr
    assert "fork child" in proc.stdout and "child 512.0" in proc.stdout
    forked = sorted(programs.glob("c.pid*.pftrace"))
    assert len(forked) == 1, proc.stderr
    ranked = programs / "c.rank1.pftrace"  # a torchrun-style worker is named by its rank
    assert ranked.exists(), proc.stderr
    children = [*forked, ranked]
    assert "child processes:" in proc.stderr
    pids = set()
    for path in children:
        trace = parse(path)
        assert {o.name for o in trace.by_category("op")} >= {"aten::mm"}
        pids |= {d.process.pid for d in trace.tracks.values() if d.HasField("process")}
    parent = parse(programs / "c.pftrace")
    assert "aten::mm" not in {o.name for o in parent.by_category("op")}
    assert int(children[0].name.split(".pid")[1].split(".")[0]) in pids


@pytest.mark.parametrize(("args", "message"), [
    (["missing.py"], "no such script: missing.py"),
    (["-o", "nowhere/t.pftrace", "train_small.py"], "folder"),
    (["--bogus", "train_small.py"], "unknown option --bogus"),
    (["--steps", "3:1", "train_small.py"], "--steps"),
    (["-m", "no_such_module_here"], "no module named"),
    (["--hardware", "trn9", "train_small.py"], "preset 'trn9': choose one of trn1, trn2, trn3"),
])
def test_bad_input_is_one_clear_line_before_anything_runs(record_cli, programs: Path,
                                                          args: list[str], message: str) -> None:
    before = set(os.listdir(programs))
    proc = record_cli(*args, timeout=60, fresh=True)  # before torch loads
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert proc.stdout == ""
    assert set(os.listdir(programs)) == before


_COMPILED_MODULE = """
import warnings
import torch
model = torch.compile(torch.nn.Linear(4, 4).to("neuron"), backend="neuron").eval()
with torch.no_grad():
    for _ in range(3):
        model(torch.ones(2, 4, device="neuron"))
warnings.warn("the program's own warning")
"""


def test_compiled_modules_record_without_torchs_global_hook_warning(record_cli, programs):
    """torch.compile(module) warned on every call that global module hooks (ours) fire for
    its wrapper too; the recorder reads the wrapper as the model, so the user sees none,
    and the program's own warnings still show."""
    (programs / "compiled_module.py").write_text(_COMPILED_MODULE)
    proc = record_cli("-o", "cm.pftrace", "--level", "op", "compiled_module.py")
    assert proc.returncode == 0, proc.stderr
    assert "global hooks" not in proc.stderr
    assert "the program's own warning" in proc.stderr
    assert "steps recorded: 3" in proc.stderr  # a step per call of the model, not two


_COMPILED_OPTIMIZER_STEP = """
import torch
m = torch.nn.Linear(16, 16).to("neuron")
opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)

@torch.compile(backend="neuron")
def opt_step():
    opt.step()

for _ in range(3):
    m(torch.randn(4, 16, device="neuron")).sum().backward()
    opt_step()
    opt.zero_grad()
"""


def test_a_compiled_optimizer_step_says_how_to_mark_steps(record_cli, programs):
    """An optimizer step inside a compiled function runs no step hook: the summary says
    why the run is one step and what marks steps, not that no optimizer step ran."""
    (programs / "compiled_step.py").write_text(_COMPILED_OPTIMIZER_STEP)
    proc = record_cli("-o", "cs.pftrace", "--level", "op", "compiled_step.py")
    assert proc.returncode == 0, proc.stderr
    assert ("steps recorded: 1 (the whole run: optimizer.step() ran inside a compiled "
            "function, where it ends no step; call neuron_explorer.step() after it)"
            in proc.stderr), proc.stderr
    # its graph breaks are torch's (Optimizer.step breaks around its update), and say so
    breaks = neuron_explorer.load(programs / "cs.pftrace").compile_summary()["graph_breaks"]
    assert len(breaks) and breaks["within"].str.startswith("torch/optim/optimizer.py:").all()
    assert (breaks["source"] == "compiled_step.py:8 in opt_step").all()  # the call of step()


_TRAIN_THEN_EVAL = """
import torch
net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
net = net.to("neuron")
model = torch.compile(net, backend="neuron")
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for _ in range(3):
    loss = model(torch.ones(2, 4, device="neuron")).sum()
    opt.zero_grad(); loss.backward(); opt.step()
with torch.no_grad():
    model(torch.ones(2, 4, device="neuron"))
"""


def test_a_grad_mode_recompile_is_placed_in_the_users_code_and_costed_alone(record_cli,
                                                                            programs):
    """The recompile of a compiled module evaluated after training named torch's wrapper
    (`torch/_dynamo/external_utils.py`) as its place, was charged every graph's compile
    time, and was told to keep its 'guarded values' constant."""
    import neuron_explorer

    (programs / "train_then_eval.py").write_text(_TRAIN_THEN_EVAL)
    proc = record_cli("-o", "te.pftrace", "--level", "op", "train_then_eval.py")
    assert proc.returncode == 0, proc.stderr
    trace = neuron_explorer.load(str(programs / "te.pftrace"))
    recompiles = trace.compile_summary()["recompiles"]
    assert len(recompiles) == 1 and "grad_mode" in recompiles["reason"].iloc[0]
    assert recompiles["source"].iloc[0].endswith("train_then_eval.py:11 in <module>")
    (finding,) = [f for f in trace.bottlenecks() if f.rule_id == "recompilation"]
    assert "follows a change of grad mode" in finding.recommendation
    assert finding.severity == "low"  # nothing to fix: it does not rank with what is
    assert finding.time_lost_ns == 0  # the eval graph is needed: fixing saves nothing
    assert "site-packages" not in finding.recommendation
    compile_total = float(trace.compile_summary()["totals"]["compile_ns"].iloc[0])
    assert 0 < finding.symptom_ns < 0.9 * compile_total  # the recompile's, not all of it


def test_a_command_of_the_recorders_environment_runs_without_it_on_path(monkeypatch,
                                                                        tmp_path) -> None:
    """`.venv/bin/neuron-explorer record -- torchrun ...` with the environment not
    activated said "no such program: torchrun": the recorder's own environment's commands
    are found beside its Python; a command found nowhere is still one clear error."""
    import shutil
    import sys

    from neuron_explorer.collectors.program import COMMAND, parse_program
    from neuron_explorer.collectors.trace_writer import RecordingError

    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on it
    program = parse_program(["torchrun", "--nproc_per_node=2", "train.py"])
    assert program.kind == COMMAND and program.args == ["--nproc_per_node=2", "train.py"]
    assert program.target == shutil.which("torchrun", path=str(Path(sys.executable).parent))
    with pytest.raises(RecordingError, match="no such program: no-such-command"):
        parse_program(["no-such-command"])


_BACKWARD_FALLBACK = """
import torch
bag = torch.nn.EmbeddingBag(16, 4).to("neuron")
loss = bag(torch.randint(0, 16, (8, 3)).to("neuron")).sum()
loss.backward()
"""


def test_a_warning_in_backward_points_at_the_program_not_the_recorder(record_cli, programs):
    """A host fallback in backward warns at the program's line that ran the backward, as
    it does without `record` (it pointed at the recorder's backward hook)."""
    (programs / "bag_backward.py").write_text(_BACKWARD_FALLBACK)
    proc = record_cli("-o", "bag.pftrace", "--level", "op", "bag_backward.py")
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stderr.splitlines() if "_embedding_bag_backward" in x)
    assert line.startswith("bag_backward.py:5:"), line  # as python names the script
