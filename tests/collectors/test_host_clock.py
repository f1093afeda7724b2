"""The host clock through `neuron-explorer record`: load, GC and our own work stay off the
program's time, real waits stay on it, modelled runs are byte-identical, `diff
--fail-above` guards step time, and slow runs say why."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import neuron_explorer
import pytest
from cli_runner import run_command
from neuron_explorer.backend.clock import HostClock
from neuron_explorer.common.trace_format import (
    CAT_UNCOUNTED,
    META_HOST_CLOCK,
    META_HOST_CPUS,
    META_PID,
    META_START,
)

from .conftest import CLI, PROGRAMS, cli_env

ROOT = Path(__file__).resolve().parents[2]
_BUSY = ("import sys, time\nend = time.monotonic() + float(sys.argv[1])\n"
         "while time.monotonic() < end: pass\n")


def _ops(path: Path):
    return neuron_explorer.load(str(path)).ops.sort_values("op_id")


def _gaps_ms(ops) -> list[float]:
    ts, end = ops["ts"].to_numpy(), (ops["ts"] + ops["dur"]).to_numpy()
    return [float(g) / 1e6 for g in ts[1:] - end[:-1]]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity")
def test_preemption_and_gc_are_not_program_time_but_sleep_is(record_cli, programs,
                                                              monkeypatch) -> None:
    monkeypatch.delenv("NEURON_HOST_CLOCK", raising=False)  # the default clock
    proc = record_cli("-o", "probe.pftrace", "--level", "op", "host_clock_probe.py")
    assert proc.returncode == 0, proc.stderr
    real = json.loads(proc.stdout.strip().splitlines()[-1])
    if real["work_wall"] < 1.5 * real["work_cpu"]:
        pytest.skip("the busy process did not share the CPU: nothing preempted the program")
    ops = _ops(programs / "probe.pftrace")
    probes = ops[ops["name"].isin(["aten::neg", "aten::abs", "aten::sin", "aten::cos"])]
    work, sleep, collect = _gaps_ms(probes)
    cpu_ms, gc_ms = real["work_cpu"] / 1e6, real["gc_cpu"] / 1e6
    # Python work while another process took the CPU half the time: its CPU time counts,
    # the time it waited for the CPU does not
    assert 0.8 * cpu_ms < work < 1.25 * cpu_ms + 3, (work, real)
    assert 50 <= sleep < 65  # a sleep is a real wait; the wake-up wait for the CPU is not
    assert collect < 0.2 * gc_ms + 2, (collect, gc_ms)  # the GC pause is left out...
    trace = neuron_explorer.load(str(programs / "probe.pftrace"))
    marks = trace.slices[trace.slices["category"] == CAT_UNCOUNTED]
    gc_marks = marks[marks["name"] == "GC (generation 2)"]
    assert len(gc_marks) >= 1  # ... and marked as such
    assert max(a["paused_ns"] for a in gc_marks["args"]) > 0.5 * real["gc_cpu"]
    assert trace.metadata[META_HOST_CLOCK]["source"] == "load-free"


def test_work_the_program_does_not_do_never_runs_the_clock_backwards(record_cli,
                                                                      programs) -> None:
    # Printing a tensor runs formatting ops with the device's accounting suspended; their
    # time was once taken off twice, so the op after a print started before the one before
    proc = record_cli("-o", "print.pftrace", "--level", "op", "print_tensor.py")
    assert proc.returncode == 0, proc.stderr
    gaps = _gaps_ms(_ops(programs / "print.pftrace"))
    assert min(gaps) >= 0, gaps


def _modelled(folder: Path, *runs: tuple[str, ...]) -> list[subprocess.CompletedProcess]:
    """Record each `(out, *args)` in `folder` with the modelled clock, all at once: they are
    independent (each child waits mostly on its own imports), and a modelled recording
    does not depend on what else runs."""
    env = {**cli_env(), "NEURON_HOST_CLOCK": "modelled"}

    def record(run: tuple[str, ...]) -> subprocess.CompletedProcess:
        return subprocess.run([*CLI, "-o", *run], cwd=folder, capture_output=True, text=True,
                              env=env, timeout=120, check=False)

    with ThreadPoolExecutor(len(runs)) as pool:
        return list(pool.map(record, runs))


@pytest.fixture(scope="module")
def small_runs(tmp_path_factory) -> Path:
    """`train_small.py 3` recorded with the modelled clock (all three at once), twice on
    trn2 (m1, m2) and once on trn3: for the tests of identical bytes and of a faster chip."""
    folder = tmp_path_factory.mktemp("modelled")
    shutil.copy(PROGRAMS / "train_small.py", folder)
    shutil.copy(PROGRAMS / "device_paced.py", folder)
    runs = [("m1.pftrace", "--hardware", "trn2", "train_small.py", "3"),
            ("m2.pftrace", "--hardware", "trn2", "train_small.py", "3"),
            ("trn3.pftrace", "--hardware", "trn3", "train_small.py", "3"),
            ("paced.pftrace", "device_paced.py"),
            ("synced.pftrace", "device_paced.py", "sync")]
    for proc in _modelled(folder, *runs):
        assert proc.returncode == 0, proc.stderr
    return folder


@pytest.mark.slow  # small_runs records five runs: 13-17 s
def test_two_modelled_recordings_are_byte_identical(small_runs) -> None:
    assert (small_runs / "m1.pftrace").read_bytes() == (small_runs / "m2.pftrace").read_bytes()
    trace = neuron_explorer.load(str(small_runs / "m1.pftrace"))
    assert trace.metadata[META_HOST_CLOCK]["source"] == "modelled"
    assert trace.metadata[META_START] == 0 and trace.metadata[META_PID] == 1
    # the machine's cores, which the data-loader advice sizes its workers by
    assert trace.metadata[META_HOST_CPUS] == len(os.sched_getaffinity(0))
    assert len(trace.steps) >= 3 and (trace.steps["dur"] > 0).all()
    # the report says what the clock leaves out (a user's sleeping data loader showed
    # "dataloader 0 ns" and no finding, without a word why)
    from neuron_explorer.report import report_sections

    head = report_sections(trace)[0].content
    assert "data loading, sleeps, I/O, Python work between ops and compiling count nothing" \
        in head["host clock"]


@pytest.mark.slow  # 10-14 s in a CI run
def test_modelled_json_recordings_of_a_compiled_model_are_byte_identical(programs) -> None:
    for proc in _modelled(programs, ("c1.json", "compiled_block.py"),
                          ("c2.json", "compiled_block.py")):
        assert proc.returncode == 0, proc.stderr
    assert (programs / "c1.json").read_bytes() == (programs / "c2.json").read_bytes()


def test_a_bad_host_clock_setting_is_one_clear_line(record_cli) -> None:
    os.environ["NEURON_HOST_CLOCK"] = "sundial"
    try:
        proc = record_cli("-o", "x.pftrace", "train_small.py", "1")
    finally:
        del os.environ["NEURON_HOST_CLOCK"]
    assert proc.returncode == 2
    assert "NEURON_HOST_CLOCK='sundial' is not a host clock" in proc.stderr
    assert "Traceback" not in proc.stderr


def _diff(*args: str) -> subprocess.CompletedProcess:
    """`neuron-explorer diff ARGS` (forked after its imports: cli_runner)."""
    return run_command("diff", *args, cwd=ROOT, env=cli_env(), timeout=120)


@pytest.mark.slow  # 10-14 s in a CI run
def test_diff_fail_above_exit_codes() -> None:
    eager = str(ROOT / "sample_traces" / "gpt_eager.pftrace")
    compiled = str(ROOT / "sample_traces" / "gpt_compiled.pftrace")
    a = neuron_explorer.load(eager).summary()["step_time_ns"]
    b = neuron_explorer.load(compiled).summary()["step_time_ns"]
    slower, faster = (eager, compiled) if a > b else (compiled, eager)
    growth = (max(a, b) / min(a, b) - 1) * 100
    calls = [(faster, slower, "--fail-above", "5"),
             (faster, slower, "--fail-above", f"{growth + 1:.1f}"),
             (slower, faster, "--fail-above", "0"), (faster, faster, "--fail-above", "0"),
             (faster, slower), (faster, slower, "--fail-above", "-3")]
    regressed, within, improved, same, plain, bad = (_diff(*c) for c in calls)
    assert regressed.returncode == 1
    assert "step time grew" in regressed.stderr and "more than --fail-above 5%" in regressed.stderr
    assert "Summary" in regressed.stdout  # the diff itself is still printed
    assert within.returncode == 0
    assert improved.returncode == 0
    assert same.returncode == 0
    assert plain.returncode == 0  # without the option: never a failure
    assert bad.returncode == 2 and "is not a percentage" in bad.stderr


def test_diff_fail_above_needs_step_times(tmp_path) -> None:
    from neuron_explorer.collectors.perfetto_writer import PerfettoWriter

    empty = tmp_path / "empty.pftrace"
    writer = PerfettoWriter(str(empty))
    writer.thread(1, 1, "MainThread")
    writer.close()
    sample = str(ROOT / "sample_traces" / "mlp_eager.pftrace")
    proc = _diff(sample, str(empty), "--fail-above", "5")
    assert proc.returncode == 2 and "cannot check --fail-above" in proc.stderr
    assert "Traceback" not in proc.stderr


def _run_on_a_terminal(args: list[str], cwd: Path, timeout: float = 120) -> str:
    """Run with stderr (and stdout) on a pseudo-terminal; return all it printed."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(args, cwd=cwd, stdin=subprocess.DEVNULL, stdout=follower,
                            stderr=follower, env=cli_env())
    os.close(follower)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.5)
        if ready:
            try:
                data = os.read(leader, 65536)
            except OSError:  # the terminal closed: the program ended
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    proc.wait(timeout=10)
    os.close(leader)
    return b"".join(chunks).decode(errors="replace")


def test_record_shows_a_live_status_line_on_a_terminal_only(record_cli, programs) -> None:
    shown = _run_on_a_terminal([*CLI, "-o", "tty.pftrace", "--level", "op",
                                "steps_for_a_while.py", "10"], programs)
    assert re.search(r"neuron-explorer: recording · \d+ steps? · [\d.]+ (bytes|KiB|MiB) · \d+ s",
                     shown), shown
    assert "\r\x1b[K" in shown  # redrawn in place, and cleared before the summary
    assert "trace written to tty.pftrace" in shown
    piped = record_cli("-o", "pipe.pftrace", "--level", "op", "steps_for_a_while.py", "4")
    assert piped.returncode == 0 and "recording · " not in piped.stderr


def test_a_slow_half_precision_op_is_explained_once(tmp_path, monkeypatch, capsys) -> None:
    import torch
    from neuron_explorer.collectors import recording_notices

    # every op counts as slow here (even one the load-free clock measures at 0 ns: it holds
    # still while it takes off run delay reported late)
    monkeypatch.setattr(recording_notices, "SLOW_OP_NS", -1)
    monkeypatch.setattr(recording_notices, "host_has_native_bf16", lambda: False)
    a = torch.ones(8, 8, dtype=torch.bfloat16, device="neuron")
    with neuron_explorer.record(tmp_path / "bf16.pftrace", level="op", quiet=True):
        for _ in range(3):
            a = a @ a
        (torch.ones(4, device="neuron") + 1).sum()
    err = capsys.readouterr().err
    assert err.count("neuron-explorer: ") == 1, err
    assert "bfloat16" in err and "no native bfloat16" in err and "--steps" in err


def test_an_op_ending_at_a_step_boundary_keeps_every_step_at_the_top(
        tmp_path, monkeypatch) -> None:
    """Ops reach the file in batches, after the step boundary's begins. A boxing cost
    measured high (a loaded machine) once took the whole gap after the optimizer's last op
    off the clock, so the step began at that op's end: readers pairing begins and ends by
    time gave the op's end to the new step's first slice, and the step nested in the one
    before (1 shuffled CI run in 8)."""
    from neuron_explorer import cli
    from neuron_explorer.collectors import session

    from .trace_reading import parse

    monkeypatch.setattr(session, "_measured_costs", [10**9, 0])  # boxing: 1 s an op
    shutil.copy(PROGRAMS / "train_small.py", tmp_path)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["record", "-o", "t.pftrace", "train_small.py", "3"]) == 0
    trace = parse(tmp_path / "t.pftrace")
    steps = trace.by_category("step")
    assert len(steps) >= 3 and all(s.depth == 0 for s in steps)
    for op in trace.by_category("op"):  # every op closed by its own end, inside its step
        top = op
        while top.parent is not None:
            top = top.parent
        assert top.category != "step" or top.args["step"] == op.args["step"]


def test_an_engine_trace_grown_huge_is_explained_once(tmp_path, monkeypatch) -> None:
    from neuron_explorer.collectors import recording_notices

    monkeypatch.setattr(recording_notices, "LARGE_TRACE_BYTES", 1)
    script = tmp_path / "steps.py"
    script.write_text((Path(__file__).parent / "programs" / "steps_for_a_while.py").read_text())
    from neuron_explorer import cli

    err_file = tmp_path / "err.txt"
    with open(err_file, "w") as err, pytest.MonkeyPatch.context() as m:
        m.setattr("sys.stderr", err)
        m.chdir(tmp_path)
        assert cli.main(["record", "-o", "big.pftrace", "steps.py", "3"]) == 0
    text = err_file.read_text()
    assert text.count("at --level engine") == 1, text
    assert "--level op" in text


def test_deferred_costs_never_move_the_clock_back_to_what_it_showed() -> None:
    clock = HostClock()
    shown = clock.now()
    clock.defer(10**12, shown)  # far more than the time since: only that time is taken
    assert clock.now() > shown  # strictly: a slice ending at `shown` ends before the next
    clock.defer(-5_000, 0)  # a negative cost is added
    before = clock.now()
    clock.defer(-5_000, 0)
    assert clock.now() >= before + 5_000


def test_load_free_readings_never_fall_when_run_delay_is_reported_late() -> None:
    """schedstat reports a thread's run delay at its next scheduling event, so a refresh can
    take off more than the time since the last reading; the clock must not step back (a
    range would then end before the one nested in it)."""
    from neuron_explorer.backend.clock import LOAD_FREE, WALL

    clock = HostClock()
    if not clock.schedstat_ok:
        pytest.skip("no per-thread schedstat here")
    clock.use(LOAD_FREE)
    try:
        first = clock.now()
        clock._uncounted += 10**9  # what a late-reported second of run delay adds
        later = clock.now()
        assert later > first
        assert clock.now() > later
    finally:
        clock.use(WALL)


def test_run_delay_between_recordings_is_not_taken_off_the_next_one() -> None:
    """A thread's run delay while nothing recorded must not be charged to the next
    recording (it had held the clock still for a whole step)."""
    from neuron_explorer.backend.clock import LOAD_FREE, WALL

    clock = HostClock()
    if not clock.schedstat_ok:
        pytest.skip("no per-thread schedstat here")
    clock.use(LOAD_FREE)
    clock.now()
    clock.use(WALL)
    clock._threads.run_delay -= 10**9  # a second of run delay while the clock was on wall
    clock.use(LOAD_FREE)
    try:
        first = clock.now()
        time.sleep(0.001)  # past the refresh interval
        assert clock.now() - first >= 500_000  # the millisecond counts, the second does not
    finally:
        clock.use(WALL)


@pytest.mark.slow  # small_runs records five runs: 13-17 s
def test_a_faster_chip_never_diffs_as_a_slower_step(small_runs) -> None:
    # The same host-bound script on trn2 then trn3: the device got faster, the host did
    # not change, so the step time must not grow (a loaded machine once made it 1.56x)
    guard = _diff(str(small_runs / "m1.pftrace"), str(small_runs / "trn3.pftrace"),
                  "--fail-above", "0")
    assert guard.returncode == 0, guard.stderr


def _train_with_annotations(steps: int) -> None:
    import torch
    from torch import nn

    model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 2)).to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    @neuron_explorer.annotate("batch")
    def batch():
        return torch.randn(4, 8, device="neuron")

    neuron_explorer.step()
    for i in range(steps):
        with neuron_explorer.annotate("iteration"):
            loss = model(batch()).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
        if i % 2:
            neuron_explorer.step()


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity")
def test_ranges_nest_on_every_track_under_load(tmp_path, monkeypatch) -> None:
    """Busy processes on this thread's CPU preempt it between any two clock readings: a
    timestamp read apart from the start of the work excluded after it, or an exclusion
    nested in another (a GC pause freeing tensors), stepped the clock back, so that an
    annotation ended after its parent or an op after the next began."""
    from .trace_reading import partial_overlaps

    monkeypatch.delenv("NEURON_HOST_CLOCK", raising=False)  # the default clock
    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    busy = [subprocess.Popen([CLI[0], "-c", _BUSY, "60"]) for _ in range(2)]
    try:
        for proc in busy:
            os.sched_setaffinity(proc.pid, {cpu})
        os.sched_setaffinity(0, {cpu})
        bad = []
        for k in range(3):
            path = tmp_path / f"run{k}.json"
            with neuron_explorer.record(path, level="op", quiet=True):
                _train_with_annotations(4)
            assert neuron_explorer.load(str(path)).metadata[META_HOST_CLOCK]["source"] == \
                "load-free"
            bad += partial_overlaps(path)
    finally:
        os.sched_setaffinity(0, before)
        for proc in busy:
            proc.kill()
            proc.wait()
    assert not bad, bad[:5]


def test_nested_exclusions_and_a_timestamp_at_their_start_never_step_the_clock_back() -> None:
    """Work excluded inside other excluded work (a tensor freed inside a hook, a GC pause)
    is taken off once, and a timestamp read with `stamp()` is where the clock returns to
    after the work it starts is excluded."""
    clock = HostClock()
    fake = [1_000_000]
    clock._read = lambda: fake[0]  # a source that moves only when the test says
    clock.reset()
    outer_start, ts = clock.stamp()
    fake[0] += 10_000  # the outer work...
    inner_start = clock.real_ns()
    fake[0] += 30_000  # ... and, inside it, other work that is excluded on its own
    clock.exclude(clock.real_ns() - inner_start)
    fake[0] += 5_000
    clock.exclude(clock.real_ns() - outer_start)
    assert clock.now() == ts  # 45 µs of work excluded: the clock is back at its start
    fake[0] += 2_000  # the program's own time counts from there
    assert clock.now() == ts + 2_000


def test_a_gc_pause_inside_a_stamp_is_taken_off_once() -> None:
    """A garbage collection can start inside `stamp()`, after its reading (settling a
    deferred cost, building the returned pair: allocations). The GC callback takes the
    pause off the clock; if half of the stamp's pair were read after it, the exclusion the
    stamp starts would take the pause off again and the clock would step back by it.
    Recordings showed that: an op stamped 40-460 us before the op written before it,
    after a long GC in the first forward (3 of 6 recordings of train_small.py)."""
    clock = HostClock()
    fake = [1_000_000]
    clock._read = lambda: fake[0]  # a source that moves only when the test says
    clock.reset()
    settle = clock._settle

    def settle_after_a_gc(t: int) -> int:
        clock._settle = settle  # one collection
        clock._on_gc("start", {})
        fake[0] += 400_000  # a 400 us pause
        clock._on_gc("stop", {"generation": 0})
        return settle(t)

    clock._settle = settle_after_a_gc
    clock.defer(1_000, 0)  # a deferred cost: the stamp settles it
    start, ts = clock.stamp()
    fake[0] += 50_000  # the op's emulation, excluded when it ends
    clock.exclude(clock.real_ns() - start)
    assert clock.now() == ts  # the pause was left out once, by the GC callback


_SHOW_POLICY = ("import os, subprocess, sys, torch\n"
                "print(os.environ.get('OMP_WAIT_POLICY'))\n"
                "print(subprocess.run([sys.executable, '-c', \"import os; "
                "print(os.environ.get('OMP_WAIT_POLICY'))\"], capture_output=True, "
                "text=True).stdout.strip())\n")


@pytest.mark.parametrize("user_choice", [None, "ACTIVE"])
def test_record_lets_openmp_workers_sleep_unless_the_user_chose(record_cli, programs,
                                                                 monkeypatch, user_choice):
    """Spinning OpenMP workers made a loaded machine's recordings twice as slow
    (thread_pool_wait.py); the program and its children get the passive policy."""
    if user_choice is None:
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
        monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    else:
        monkeypatch.setenv("OMP_WAIT_POLICY", user_choice)
    (programs / "show_policy.py").write_text(_SHOW_POLICY)
    # a fresh process: `record` chooses the policy before it imports torch
    proc = record_cli("-o", "policy.pftrace", "--level", "op", "show_policy.py", fresh=True)
    assert proc.returncode == 0, proc.stderr
    expected = user_choice or "PASSIVE"
    assert proc.stdout.split()[:2] == [expected, expected]
    meta = neuron_explorer.load(str(programs / "policy.pftrace")).metadata[META_HOST_CLOCK]
    assert meta["omp_wait_policy"] == expected


def test_a_modelled_recording_after_device_work_starts_with_an_idle_device(
        tmp_path, monkeypatch) -> None:
    """A modelled recording restarts the host clock at 0: work the device ran before it
    (timed on the wall clock, seconds into the process) must not lie in the new clock's
    future, or the first wait for the device stands still that long (one step of 1.86 s
    among steps of 1.1 ms, after a warm-up in the same process)."""
    import torch

    monkeypatch.setenv("NEURON_HOST_CLOCK", "modelled")
    model = torch.nn.Linear(64, 64).to("neuron")
    x = torch.randn(32, 64).to("neuron")
    for _ in range(3):  # warm-up before the recording
        model(x).sum().item()
    out = tmp_path / "after_warm_up.pftrace"
    with neuron_explorer.record(str(out)):
        for _ in range(3):
            model(x).sum().item()
            neuron_explorer.step()
    trace = neuron_explorer.load(out)
    steps = trace.steps
    assert len(steps) >= 3
    assert steps["dur"].max() < 2 * steps["dur"].min()  # no step waits out the warm-up
    assert trace.kernels["ts"].min() < steps["dur"].min()  # the device starts at once


@pytest.mark.slow  # small_runs records five runs: 13-17 s
def test_a_sync_after_the_optimizer_step_stays_inside_its_step(small_runs) -> None:
    """A step begins where the one before ended; a `synchronize()` right after the
    optimizer step was written before that begin, at its time, and so held the next step:
    a user's steps read 16 us long, the device's 1.89 ms outside them. Each sync is inside
    its step now, and each step as long as without it plus its wait."""
    plain = neuron_explorer.load(str(small_runs / "paced.pftrace"))
    synced = neuron_explorer.load(str(small_runs / "synced.pftrace"))
    s = synced.table("slices")
    syncs = s[s["name"] == "sync (synchronize)"]
    assert len(syncs) == 4 and (syncs["dur"] > 0).all()
    inside = syncs[:3]  # the last follows the last step: the code after the loop
    assert (s.loc[inside["parent_id"], "kind"] == "step").all()
    steps = synced.steps["dur"].to_numpy()[1:4]
    assert (steps == plain.steps["dur"].to_numpy()[1:4] + inside["dur"].to_numpy()).all()


def test_the_cores_are_counted_where_the_system_has_no_affinity(monkeypatch) -> None:
    """macOS has no os.sched_getaffinity: a recording there must not fail at its start."""
    from neuron_explorer.collectors.recorder import _usable_cpus

    assert _usable_cpus() == len(os.sched_getaffinity(0))
    monkeypatch.delattr(os, "sched_getaffinity")
    assert _usable_cpus() == os.cpu_count()
