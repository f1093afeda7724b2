"""Per-step figures use the steady-state steps and say which (issue 12, item 3)."""

from __future__ import annotations

from pathlib import Path

import neuron_explorer
import pytest
import scenarios
from neuron_explorer.analyses.steady_state import analysed_steps
from neuron_explorer.common.errors import TruncatedTraceWarning
from neuron_explorer.report import render_report

COMPILE_NS = 2_000_000  # a compile span far longer than a step


def _compiled(meta: dict | None = None) -> scenarios.Scenario:
    """Step 0 compiles for 2 ms (the device idles meanwhile); steps 1-3 run 10 us each."""
    sc = scenarios.Scenario()
    sc.b.slice(sc.host, 0, COMPILE_NS + 10_000, "step 0", "step", {"step": 0})
    sc.b.slice(sc.host, 100, COMPILE_NS, "neuron_compile", "compile", {"graph_id": 1})
    sc.op(COMPILE_NS + 200, 500, "graph:1", 1, 0, kernel=(COMPILE_NS + 800, 9000),
          busy={"tensor": 9000}, flops=900_000_000, nbytes=10_000, instructions=False)
    base = COMPILE_NS + 10_000
    for n in range(1, 4):
        t = base + (n - 1) * scenarios.STEP
        sc.b.slice(sc.host, t, scenarios.STEP, f"step {n}", "step", {"step": n})
        sc.op(t + 100, 500, "graph:1", n + 1, n, kernel=(t + 700, 9000),
              busy={"tensor": 9000}, flops=900_000_000, nbytes=10_000, instructions=False)
    if meta:
        sc.b.metadata(sc.host, meta, ts=1)
    return sc


def _load(sc: scenarios.Scenario, tmp: Path, name: str) -> neuron_explorer.Trace:
    return neuron_explorer.load(sc.write(tmp, name))


def test_compile_step_is_left_out_of_per_step_figures(tmp_path: Path) -> None:
    t = _load(_compiled(), tmp_path, "compiled")
    s = t.summary()
    assert s["steps_analysed"] == [1, 2, 3]
    assert "after the last compile, in step 0" in s["steps_analysed_text"]
    assert s["step_time_ns"] == scenarios.STEP and s["compile_ns"] == COMPILE_NS
    bd = t.breakdown()
    assert sorted(set(bd["step"])) == [1, 2, 3]
    idle = bd[(bd["side"] == "device") & (bd["category"] == "idle")]["ns"]
    assert idle.max() == 1000  # 10 us steps with 9 us of kernel: not 2 ms of compile
    host_compile = bd[(bd["side"] == "host") & (bd["category"] == "compile")]["ns"]
    assert host_compile.sum() == 0
    assert s["mfu"] == pytest.approx(900_000_000 / (1e14 * 10e-6))
    text = render_report(t, "text")
    assert "steps 1–3 of 0–3 (after the last compile, in step 0)" in text
    assert "compile (on its own)" in text and "not in the per-step figures" in text


def test_every_step_compiling_keeps_them_all_and_says_so(tmp_path: Path) -> None:
    sc = scenarios.Scenario()
    for n in range(2):
        t = sc.step(n)
        sc.b.slice(sc.host, t + 100, 500, "neuron_compile", "compile", {"graph_id": n})
    s = _load(sc, tmp_path, "all_compile").summary()
    assert s["steps_analysed"] == [0, 1] and "every step compiles" in s["steps_analysed_text"]


def test_a_last_step_that_compiles_again_leaves_the_quiet_steps(tmp_path: Path) -> None:
    """A compiled loop whose short last batch recompiles: the steps after the last compile
    were none, so every step was analysed, and a user's report showed 64 ms of compile
    "per step" and no finding. The steps that compiled nothing are analysed."""
    sc = _compiled()
    t = COMPILE_NS + 10_000 + 3 * scenarios.STEP
    sc.b.slice(sc.host, t, COMPILE_NS, "step 4", "step", {"step": 4})
    sc.b.slice(sc.host, t + 100, COMPILE_NS - 200, "neuron_compile", "compile", {"graph_id": 2})
    s = _load(sc, tmp_path, "last_compiles").summary()
    assert s["steps_analysed"] == [1, 2, 3]
    assert "the steps that compiled nothing (steps 0, 4 compiled)" in s["steps_analysed_text"]


def test_the_users_steps_window_is_used_as_recorded(tmp_path: Path) -> None:
    t = _load(_compiled({"steps": [0, 4]}), tmp_path, "window")
    assert t.summary()["steps_analysed"] == [0, 1, 2, 3]
    assert "--steps 0:4" in t.summary()["steps_analysed_text"]


def test_the_code_after_the_last_step_mark_is_left_out(tmp_path: Path) -> None:
    """The recorder writes which steps a mark ended; the rest (teardown) is no step."""
    sc = scenarios.clean(steps=3)
    sc.b.metadata(sc.host, {"steps_completed": [0, 1]}, ts=1)
    s = _load(sc, tmp_path, "unfinished").summary()
    assert s["steps_analysed"] == [0, 1]
    assert "step 2 is the code after the last step mark" in s["steps_analysed_text"]


def test_diff_compares_steady_state_steps(tmp_path: Path) -> None:
    """Eager (no compile) against compiled: idle per step is not the compile time."""
    eager = _load(scenarios.clean(steps=3), tmp_path, "eager")
    compiled = _load(_compiled(), tmp_path, "compiled_d")
    d = neuron_explorer.diff(eager, compiled)
    bd = d.breakdown.set_index(["side", "category"])
    assert bd.loc[("device", "idle"), "b_ns"] == 1000
    assert bd.loc[("host", "compile"), "b_ns"] == 0
    summary = d.summary.set_index("metric")
    assert summary.loc["compile_ns", "b"] == COMPILE_NS
    assert summary.loc["step_time_ns", "b"] == scenarios.STEP
    assert "steps 1–3" in d.steps[1] and "steps analysed" in d.to_text()


def test_framework_level_says_not_recorded_instead_of_zero(tmp_path: Path) -> None:
    sc = scenarios.Scenario()
    sc.b.metadata(sc.host, {"level": "framework"}, ts=1)
    for n in range(2):
        t = sc.step(n)
        sc.b.slice(sc.host, t + 100, 5000, "model", "module", {"module": "model", "step": n})
    t = _load(sc, tmp_path, "framework")
    s = t.summary()
    assert s["mfu"] is None and s["device_busy_share"] is None
    assert set(t.breakdown()["side"]) == {"host"}
    text = render_report(t, "text")
    assert "not recorded at --level framework" in text
    assert not any(line.split()[:2] == ["device", "idle"] for line in text.splitlines() if line)
    assert "MFU                 0.0%" not in text


def test_a_windows_first_step_holds_its_ops_dated_before_it(tmp_path: Path) -> None:
    """--steps 2:4: an op recorded as step 2 before step 2's slice began is step 2's."""
    sc = scenarios.Scenario()
    sc.b.metadata(sc.host, {"steps": [2, 4]}, ts=1)
    for n in (2, 3):
        sc.step(n)
    sc.op(19_000, 500, "aten::mm", 1, 2, kernel=(19_600, 300), busy={"tensor": 300})
    sc.op(21_000, 500, "aten::mm", 2, 2, kernel=(21_600, 300), busy={"tensor": 300})
    t = _load(sc, tmp_path, "window_early")
    assert t.steps["ts"].tolist() == [19_000, 30_000]
    assert t.steps["dur"].tolist() == [11_000, scenarios.STEP]
    assert t.ops["step"].tolist() == [2, 2]


def test_a_small_mfu_is_not_shown_as_zero(tmp_path: Path) -> None:
    """A small inference model's MFU (0.0009%) reads as such, not as 0.0%."""
    sc = scenarios.Scenario()
    for n in range(2):
        t = sc.step(n)
        sc.op(t, 500, "aten::mm", n + 1, n, kernel=(t + 600, 300), busy={"tensor": 300},
              flops=9_000)
    text = render_report(_load(sc, tmp_path, "tiny"), "text")
    mfu = next(line for line in text.splitlines() if line.startswith("MFU"))
    assert mfu.split()[-1] == "0.0009%"


def _eager(first_dur: int, steps: int = 5) -> scenarios.Scenario:
    """An eager run (nothing compiles) whose step 0 lasts `first_dur`, the others STEP."""
    sc = scenarios.Scenario()
    sc.b.slice(sc.host, 0, first_dur, "step 0", "step", {"step": 0})
    for n in range(1, steps):
        t = first_dur + (n - 1) * scenarios.STEP
        sc.b.slice(sc.host, t, scenarios.STEP, f"step {n}", "step", {"step": n})
        sc.op(t + 100, 500, "aten::mm", n, n, kernel=(t + 700, 900),
              busy={"tensor": 900}, flops=1000, nbytes=10_000, instructions=False)
    return sc


def test_an_eager_warm_up_step_is_left_out_and_named(tmp_path: Path) -> None:
    """The first step of an eager GPT took 55 ms against 30 ms for the others and was
    averaged into every per-step figure."""
    t = _load(_eager(first_dur=3 * scenarios.STEP), tmp_path, "warm")
    s = t.summary()
    assert s["steps_analysed"] == [1, 2, 3, 4]
    assert "after the warm-up, step 0" in s["steps_analysed_text"]
    assert s["step_time_ns"] == scenarios.STEP
    assert "steps 1–4 of 0–4 (after the warm-up, step 0)" in render_report(t, "text")


def test_a_first_step_as_long_as_the_others_is_analysed(tmp_path: Path) -> None:
    s = _load(_eager(first_dur=int(1.4 * scenarios.STEP)), tmp_path, "even").summary()
    assert s["steps_analysed"] == [0, 1, 2, 3, 4] and "warm-up" not in s["steps_analysed_text"]


def test_two_steps_are_too_few_to_call_one_a_warm_up(tmp_path: Path) -> None:
    s = _load(_eager(first_dur=5 * scenarios.STEP, steps=2), tmp_path, "short").summary()
    assert s["steps_analysed"] == [0, 1]


def test_engines_per_step_leave_out_the_code_after_the_last_step_mark(tmp_path: Path) -> None:
    """The Engines page's per-step bars had a bar for the teardown after the last step."""
    from neuron_explorer.plot.engines import engine_use, per_step_utilisation

    sc = scenarios.clean(steps=3)
    sc.b.metadata(sc.host, {"steps_completed": [0, 1]}, ts=1)
    use = engine_use(_load(sc, tmp_path, "unfinished_engines"))
    assert use is not None
    assert sorted(set(per_step_utilisation(use)["step"])) == [0, 1]
    every = engine_use(_load(scenarios.clean(steps=3), tmp_path, "finished_engines"))
    assert every is not None and sorted(set(per_step_utilisation(every)["step"])) == [0, 1, 2]


def _streamed_then_cut(tmp: Path, steps: int, keep_steps: int) -> Path:
    """A JSON trace written as the recorder streams it (the step marks first, the ops and
    kernels after), cut short inside the ops of step `keep_steps`."""
    sc = scenarios.Scenario()
    starts = [sc.step(n) for n in range(steps)]
    for n, t in enumerate(starts):
        sc.op(t, 500, "aten::mm", n + 1, n, kernel=(t + 600, 8000), busy={"tensor": 8000})
    path = sc.write(tmp, "streamed", "json")
    text = path.read_text()
    cut = text.index('"aten::mm"', text.index(f'"op_id": {keep_steps + 1}') - 400)
    path.write_text(text[:cut - 40])
    return path


def test_a_cut_short_recording_analyses_only_the_steps_with_device_events(
        tmp_path: Path) -> None:
    """Steps whose kernels were lost to the cut are not a device idle the whole step."""
    with pytest.warns(TruncatedTraceWarning):
        t = neuron_explorer.load(_streamed_then_cut(tmp_path, steps=6, keep_steps=3))
    assert len(t.steps) == 6 and set(t.kernels["step"]) == {0, 1, 2}
    selection = analysed_steps(t)
    assert selection.steps == (0, 1)  # step 2 may have lost some: its kernels stop in it
    assert "cut short: its device events stop in step 2" in selection.describe()
    bd = t.breakdown()
    idle = bd[(bd["side"] == "device") & (bd["category"] == "idle")]
    assert idle["ns"].max() < scenarios.STEP / 2


def test_diff_leaves_the_same_warm_up_out_of_both_sides(tmp_path: Path) -> None:
    """Two runs of one script, their first steps 1.4x and 1.6x the others: the warm-up
    rule (over 1.5x) analysed step 0 in one and not the other, and `diff` compared them
    over different steps (one side's per-step breakdown averaged its warm-up in). Both
    now leave it out, and each trace alone is analysed as before."""
    from neuron_explorer import diff

    a = _load(_eager(first_dur=int(1.4 * scenarios.STEP)), tmp_path, "a")
    b = _load(_eager(first_dur=int(1.6 * scenarios.STEP)), tmp_path, "b")
    d = diff(a, b)
    assert d.steps == ("steps 1–4 of 0–4 (after the warm-up, step 0)",) * 2
    bd = d.breakdown
    assert (bd["a_ns"] == bd["b_ns"]).all(), bd
    assert analysed_steps(a).steps == (0, 1, 2, 3, 4)  # the trace itself is unchanged


def test_a_profilers_last_step_stopped_just_into_is_left_out(real_traces_dir) -> None:
    """An MI250 trace (ROCm's Kineto): ProfilerStep#1 of 9.3 ms, then ProfilerStep#2 of
    49 us, which `prof.step()` opened as the profile stopped: a median step of 4.7 ms."""
    t = neuron_explorer.load(
        real_traces_dir / "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz")
    assert list(t.steps["step"]) == [1, 2]
    assert analysed_steps(t).steps == (1,)
    assert "step 2 is a fragment, 49 us" in t.summary()["steps_analysed_text"]
    assert t.summary()["step_time_ns"] == pytest.approx(9_288_000, rel=0.001)


def test_the_runs_first_step_analysed_alone_leaves_its_first_launches_out(real_traces_dir) -> None:
    """That MI250 trace's only full step is the run's first (ProfilerStep#1): its 6.6 ms
    first launch of AccumulateGrad's add (the runtime loading the kernel) is start-up,
    said once, not a host launching slowly every step (8.76 ms, 94% of the step, before).
    A trace that opens mid-run (ProfilerStep#551) has no first calls to leave out."""
    from neuron_explorer.analyses.startup import startup_gaps
    from neuron_explorer.report import render_report

    t = neuron_explorer.load(
        real_traces_dir / "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz")
    (gap,) = startup_gaps(t).itertuples()
    assert gap.dur == pytest.approx(6_633_000, rel=0.001) and "AccumulateGrad" in gap.op
    (host,) = [f for f in t.bottlenecks() if f.rule_id == "host_bound"]
    assert host.time_lost_ns == pytest.approx(8_763_000 - gap.dur, rel=0.01)
    assert "6.633 ms of device idle before 1 first launch (not in the findings), in autograd" \
        in render_report(t, "text")
    mid_run = neuron_explorer.load(
        real_traces_dir / "cpu_only__rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")
    assert list(mid_run.steps["step"]) == [551]
    from neuron_explorer.analyses.startup import analyses_the_start

    assert analyses_the_start(t) and not analyses_the_start(mid_run)


MARKS_AT_THE_TOP = '''
import sys
import neuron_explorer
import torch
from torch import nn

model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)).to("neuron").eval()
x = torch.randn(16, 64).to("neuron")
with torch.no_grad():
    for _ in range(6):
        if "--top" in sys.argv:
            neuron_explorer.step()
        y = model(x)
        if "--top" not in sys.argv:
            neuron_explorer.step()
print(float(y.sum()))
'''


def test_a_step_of_set_up_before_the_first_mark_is_left_out(tmp_path: Path) -> None:
    """`neuron_explorer.step()` called at the top of each iteration ends a step of the set-up
    (`model.to`, the input's upload) with its first call: a decoding loop's 3.3 ms of copies
    was analysed as its first step. Called at the end of each iteration, the first step is
    the first iteration's, and stays."""
    from cli_runner import record_variants

    program = tmp_path / "marks.py"
    program.write_text(MARKS_AT_THE_TOP)
    paths = record_variants(tmp_path, program, {"top": ["--top"], "end": []}, modelled=True)
    top, end = neuron_explorer.load(paths["top"]), neuron_explorer.load(paths["end"])
    chosen = analysed_steps(top)
    assert chosen.steps[0] == 1 and 0 in chosen.recorded
    assert "step 0 is the set-up before the first step mark" in chosen.describe()
    assert "set-up" not in analysed_steps(end).describe()
