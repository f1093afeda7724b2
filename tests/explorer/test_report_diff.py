"""report and diff: the API and the two commands through the CLI's entry point."""

from __future__ import annotations

import json
from pathlib import Path

import neuron_explorer
import numpy as np
import pytest
import scenarios
from neuron_explorer import cli
from neuron_explorer.rules.finding import Findings

ALEXNET = "critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz"


@pytest.fixture()
def explorer_cli(monkeypatch: pytest.MonkeyPatch):
    """The real `main`, routing only the explorer's subcommands (the others have their own
    tests and may pull in heavy imports)."""
    monkeypatch.setattr(cli, "SUBCOMMANDS", {k: v for k, v in cli.SUBCOMMANDS.items()
                                             if k in ("report", "diff")})
    return cli.main


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("diff")
    before = scenarios.basic().write(tmp, "before")
    after = scenarios.clean().write(tmp, "after")
    return before, after


def test_diff_api(pair: tuple[Path, Path]) -> None:
    d = neuron_explorer.diff(*pair)
    s = d.summary.set_index("metric")
    assert s.loc["step_time_ns", "a"] == 10_000 and s.loc["step_time_ns", "ratio"] == 1.0
    ops = d.ops.set_index("name")
    assert ops.loc["aten::mm", "status"] == "changed"
    # device time per step: 2000 ns before, 9300 ns after
    assert ops.loc["aten::mm", "delta_ns"] == 7300
    assert sorted(d.removed_ops) == ["aten::add", "aten::relu"] and d.added_ops == []
    eng = d.engines.set_index("engine")
    assert eng.loc["tensor", "a_busy_ns"] == 1500 and eng.loc["tensor", "b_busy_ns"] == 9300
    assert eng.loc["scalar", "status"] == "added"
    bd = d.breakdown.set_index(["side", "category"])
    assert bd.loc[("host", "sync"), "delta_ns"] == -2000
    mods = d.modules.set_index("module")
    assert mods.loc["model.fc", "status"] == "removed"
    as_dict = d.to_dict()
    json.dumps(as_dict)
    assert as_dict["removed_ops"] == d.removed_ops
    text = d.to_text()
    assert "aten::relu" in text and "step time" in text


def test_diff_of_two_files_of_one_name_names_their_folders(tmp_path: Path) -> None:
    """rank1.pftrace of two runs: the header says which run each side is."""
    for run in ("slow.run", "even.run"):
        (tmp_path / run).mkdir()
    before = scenarios.basic().write(tmp_path / "slow.run", "rank1")
    after = scenarios.clean().write(tmp_path / "even.run", "rank1")
    d = neuron_explorer.diff(before, after)
    assert (d.a, d.b) == (f"slow.run/{before.name}", f"even.run/{after.name}")
    assert neuron_explorer.diff(*(scenarios.basic().write(tmp_path, n) for n in ("x", "y"))).a \
        == "x.pftrace"


def test_diff_of_kineto_traces(load_real) -> None:
    a = load_real("amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz")
    b = load_real("trace_filter__sampled_rank-0.json.gz")
    d = neuron_explorer.diff(a, b)
    assert len(d.ops) > 0 and (d.ops["status"] == "added").any()
    assert set(d.engines["engine"]) == {"device"}


@pytest.mark.parametrize("fmt", ["text", "json", "md", "html"])
def test_report_command(explorer_cli, pair, fmt: str, tmp_path: Path, capsys) -> None:
    out = tmp_path / f"report.{fmt}"
    assert explorer_cli(["report", str(pair[0]), "--format", fmt, "-o", str(out)]) == 0
    text = out.read_text()
    if fmt == "json":
        data = json.loads(text)
        assert data["summary"]["n_steps"] == 2 and data["summary"]["hardware"] == "trn2"
        ids = [f["rule_id"] for f in data["findings"]]
        assert "sync_in_step" in ids and "fp32_matmul" in ids
        assert data["top_ops"][0]["name"] == "aten::mm"
    else:
        for needle in ("trn2", "aten::mm", "model.fc", "train.py:42", "sync"):
            assert needle in text
    if fmt == "html":
        assert text.startswith("<!DOCTYPE html>")
    if fmt == "md":
        assert "## Findings" in text


def test_report_to_stdout(explorer_cli, pair, capsys) -> None:
    assert explorer_cli(["report", str(pair[1])]) == 0
    out = capsys.readouterr().out
    assert "Summary" in out and "no bottleneck found" in out


@pytest.mark.parametrize("fmt", ["text", "json", "md", "html"])
def test_diff_command(explorer_cli, pair, fmt: str, capsys) -> None:
    assert explorer_cli(["diff", str(pair[0]), str(pair[1]), "--format", fmt]) == 0
    out = capsys.readouterr().out
    assert "aten::relu" in out
    if fmt == "json":
        assert json.loads(out)["removed_ops"] == ["aten::add", "aten::relu"]


def test_commands_report_errors_in_one_line(explorer_cli, tmp_path: Path, capsys) -> None:
    missing = tmp_path / "missing.pftrace"
    assert explorer_cli(["report", str(missing)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "missing.pftrace" in err and "no such file" in err
    assert explorer_cli(["diff", str(missing), str(missing)]) == 2
    bad_out = tmp_path / "no" / "such" / "dir" / "r.txt"
    trace = scenarios.clean().write(tmp_path, "ok")
    assert explorer_cli(["report", str(trace), "-o", str(bad_out)]) == 2
    assert "cannot write" in capsys.readouterr().err


def test_installed_command(pair, repo_root: Path) -> None:
    """The `neuron-explorer` script itself, end to end."""
    import subprocess
    import sys

    script = Path(sys.executable).with_name("neuron-explorer")
    proc = subprocess.run([str(script), "report", str(pair[0]), "--format", "json"],
                          capture_output=True, text=True, timeout=120, cwd=repo_root,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["summary"]["n_steps"] == 2
    bad = subprocess.run([str(script), "diff", str(pair[0]), "nowhere.pftrace"],
                         capture_output=True, text=True, timeout=120, cwd=repo_root,
                         check=False)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert "nowhere.pftrace" in bad.stderr and "Traceback" not in bad.stderr


def test_report_of_truncated_trace_warns_in_one_line(explorer_cli, tmp_path: Path,
                                                      capsys) -> None:
    path = scenarios.basic().b.write_pftrace(tmp_path / "killed.pftrace", truncate=3)
    assert explorer_cli(["report", str(path)]) == 0
    captured = capsys.readouterr()
    assert "Summary" in captured.out
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "warning" in lines[0] and "killed.pftrace" in lines[0]


def test_diff_against_a_recording_cut_short_says_so_and_fails_no_guard(
        explorer_cli, tmp_path: Path, capsys) -> None:
    """A killed run's file holds part of a step: its step time is no measure of the
    program. The diff says so beside the step time, and `--fail-above` refuses to judge
    (exit 2) rather than report a regression, or pass, on it."""
    whole = scenarios.basic().b.write_pftrace(tmp_path / "whole.pftrace")
    killed = scenarios.basic().b.write_pftrace(tmp_path / "killed.pftrace", truncate=3)
    assert explorer_cli(["diff", str(whole), str(killed), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["cut_short"] == [False, True]
    assert explorer_cli(["diff", str(whole), str(killed)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("step time"))
    assert line.endswith("b is a recording cut short: not a like-for-like comparison)")
    assert explorer_cli(["diff", str(whole), str(killed), "--fail-above", "5"]) == 2
    err = capsys.readouterr().err
    assert "cannot check --fail-above: " in err and "killed.pftrace is a recording cut short" in err
    assert explorer_cli(["diff", str(whole), str(whole), "--fail-above", "5"]) == 0


def test_report_breakdown_shares_are_of_the_mean_step_they_sit_beside(repo_root: Path) -> None:
    """Each share is its mean time over the side's mean step. A mean of per-step shares does not
    add up with the times beside it when steps differ (a slow first step): 1.2 ms read 16% of
    a 22 ms step."""
    from neuron_explorer.report import mean_breakdown

    bd = mean_breakdown(neuron_explorer.load(repo_root / "sample_traces" / "odd_dims.pftrace"))
    of_side = bd["ns"] / bd.groupby("side")["ns"].transform("sum")
    assert (bd["share"] - of_side).abs().max() < 1e-9


def test_report_of_a_trace_without_steps_does_not_call_the_trace_a_step(repo_root: Path) -> None:
    """It read "Step breakdown (mean per analysed step, the whole trace (no steps))"."""
    from neuron_explorer.report import render_report

    trace = neuron_explorer.load(repo_root / "tests" / "data" / "real_traces" /
                                 "critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz")
    text = render_report(trace, "text")
    assert "Time breakdown (the whole trace: it has no step marks)" in text
    assert "mean per analysed step" not in text


def _framework_level(steps: int = 2) -> scenarios.Scenario:
    """The same module per step as `basic`, recorded at --level framework: no ops, no kernels."""
    sc = scenarios.Scenario()
    sc.b.metadata(sc.host, {"level": "framework"}, ts=1)
    for n in range(steps):
        t = sc.step(n)
        sc.b.slice(sc.host, t + 1000, 4000, "model.fc", "module",
                   {"module": "model.fc", "phase": "forward", "step": n})
    return sc


def test_diff_with_a_framework_level_trace_marks_device_figures_not_recorded(
        tmp_path: Path) -> None:
    """A --level framework trace recorded no ops or device time: against an op-level one,
    its ops are not "added" and its device idle time is not 0 ns."""
    framework = neuron_explorer.load(_framework_level().write(tmp_path, "framework"))
    op_level = neuron_explorer.load(scenarios.basic().write(tmp_path, "op"))
    d = neuron_explorer.diff(framework, op_level)
    assert d.added_ops == [] and d.removed_ops == []
    assert set(d.ops["status"]) == {"not recorded in a (--level framework)"}
    assert d.ops["a_device_ns"].isna().all() and d.ops["b_device_ns"].gt(0).any()
    bd = d.breakdown.set_index(["side", "category"])
    assert bd.loc[("device", "idle"), "status"].startswith("not recorded in a")
    assert np.isnan(bd.loc[("device", "idle"), "a_ns"])
    summary = d.summary.set_index("metric")
    assert np.isnan(summary.loc["n_ops", "a"]) and summary.loc["n_ops", "b"] > 0
    back = neuron_explorer.diff(op_level, framework)  # the other way round: b unrecorded
    assert set(back.ops["status"]) == {"not recorded in b (--level framework)"}
    text = d.to_text()
    assert "not recorded in a (--level framework)" in text and "- added: none" in text


def test_diff_of_a_trace_with_itself_says_the_step_time_is_unchanged(pair) -> None:
    before, _ = pair
    text = neuron_explorer.diff(before, before).to_text()
    step_line = next(line for line in text.splitlines() if line.startswith("step time"))
    assert step_line.endswith("(unchanged)"), step_line


def test_diff_says_the_steps_total_where_the_step_time_holds(tmp_path: Path) -> None:
    """The same work in fewer steps (a server's requests batched) keeps the step time: a
    trial's batching cut the run by 88% and the diff said "unchanged" only."""
    before = scenarios.basic(steps=4).write(tmp_path, "four")
    after = scenarios.basic(steps=2).write(tmp_path, "two")
    d = neuron_explorer.diff(before, after)
    s = d.summary.set_index("metric")
    assert s.loc["step_time_ns", "ratio"] == 1.0
    assert s.loc["total_ns", "a"] == 2 * s.loc["total_ns", "b"] > 0
    line = next(x for x in d.to_text().splitlines() if x.startswith("analysed steps' total"))
    assert line.endswith("40 us -> 20 us (2.00x faster)"), line


def test_findings_of_a_trace_without_steps_are_shares_of_the_trace(real_traces_dir: Path) -> None:
    """AlexNet's PyTorch-profiler trace has no step marks: its findings' shares are of the
    whole trace, as the dashboard says, not "of step time" (report, cards, JSON alike)."""
    trace = neuron_explorer.load(real_traces_dir / ALEXNET)
    from neuron_explorer.report import render_report

    # its 11.9 s of start-up gaps (cuDNN's first convolution: 10 s) are said once, apart
    # from the findings, which no longer call them host-bound launches
    findings = trace.bottlenecks()
    assert "host_bound" not in {f.rule_id for f in findings}
    text = render_report(trace, "text")
    assert "start-up (once)" in text and "11.9 s of device idle before 3 first launches" in text
    assert "in aten::conv2d" in text and "of step time)" not in text
    # with its start-up counted as launches, the finding is over the trace, not per step
    from neuron_explorer.rules import host_bound

    none = host_bound.startup_gaps(trace).iloc[:0]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(host_bound, "startup_gaps", lambda _trace: none)
        kept = Findings(host_bound.check(trace))
    assert kept and {f.share_base for f in kept} == {"the trace"}
    assert "of the trace" in kept._repr_html_()


def test_diff_with_a_trace_without_steps_titles_its_figures_as_whole(real_traces_dir: Path) -> None:
    """MI250 (2 steps) against AlexNet (no step marks): b's "per step" figures are its
    whole 43 s trace, and the section titles say so."""
    d = neuron_explorer.diff(
        real_traces_dir / "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz",
        real_traces_dir / ALEXNET)
    titles = [s.title for s in d.sections()]
    assert "Breakdown per step (b: the whole trace, it has no steps)" in titles
    same = neuron_explorer.diff(
        real_traces_dir / "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz",
        real_traces_dir / "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz")
    assert "Breakdown per step" in [s.title for s in same.sections()]


@pytest.mark.parametrize(("lengths", "shown"), [([2000, 2000, 9000, 2000, 9000], True),
                                                ([5000, 5200, 5100, 4900, 5000], False)])
def test_a_mean_step_far_from_the_median_is_said_beside_it(tmp_path: Path, lengths,
                                                            shown) -> None:
    """DataLoader workers fetching in step made a trial's steps alternate 3 and 38 ms: the
    median, 17 ms, is no measure of what a finding's fix saves a step (its total over the
    steps, 21 ms a step by the mean), and checked against it the claims looked wrong."""
    from neuron_explorer.report import render_report

    sc = scenarios.Scenario()
    for n, length in enumerate(lengths):
        t = sc.step(n, length)
        sc.op(t + 100, 500, "aten::mm", n + 1, n, kernel=(t + 700, 800), busy={"tensor": 800},
              flops=900_000, nbytes=100_000, instructions=False)
    trace = neuron_explorer.load(sc.write(tmp_path, "uneven"))
    text = render_report(trace, "text")
    line = [row for row in text.splitlines() if row.startswith("step time (mean)")]
    assert bool(line) == shown, text[:1200]
    if shown:
        analysed = trace.summary()
        mean = analysed["total_ns"] / len(analysed["steps_analysed"])
        assert f"{mean / 1000:.4g} us" in line[0], (line, mean)
    from neuron_explorer.webapp.pages.overview import _metrics  # the dashboard says it too

    step_metric = str(_metrics(trace.summary())[2])
    assert ("the steps vary" in step_metric) == shown, step_metric
