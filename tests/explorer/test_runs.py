"""Multi-rank runs: loading a folder or a list as a Run, its tables, cross-rank analyses,
rules, and `report`/`diff` on run folders."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import neuron_explorer
import numpy as np
import pytest
import run_scenarios as rs
from neuron_explorer.analyses.ranks import rank_lateness
from neuron_explorer.cli import main
from neuron_explorer.common.errors import NeuronExplorerError
from neuron_explorer.render import fmt_ns


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return rs.two_ranks(tmp_path_factory.mktemp("runs") / "train.run")


@pytest.fixture(scope="module")
def run(run_dir: Path) -> neuron_explorer.Run:
    return neuron_explorer.load(run_dir)


def test_a_folder_loads_as_a_run_with_sorted_ranks(run, run_dir):
    assert isinstance(run, neuron_explorer.Run)
    assert run.ranks == [0, 1] and len(run) == 2
    assert run.manifest["world_size"] == 2
    assert isinstance(run[1], neuron_explorer.Trace)
    assert run[1].path.endswith("rank1.pftrace")
    with pytest.raises(KeyError, match="no rank 5"):
        run[5]


def test_a_list_of_paths_loads_in_one_process_the_same(run, run_dir):
    listed = neuron_explorer.load_run([run_dir / "rank1.pftrace", run_dir / "rank0.pftrace"],
                                      processes=1)
    assert listed.ranks == [0, 1]  # ranks from the traces' metadata, not the list order
    assert listed.communication().equals(run.communication())


def test_tables_carry_the_rank(run):
    assert list(run.steps.groupby("rank").size()) == [4, 4]
    assert set(run.kernels["rank"]) == {0, 1}
    assert run.ops.columns[0] == "rank"
    coll = run.collectives
    assert len(coll) == 8
    assert set(coll["collective"]) == {"all_reduce"}
    assert coll["bytes"].eq(rs.MIB64).all()
    assert coll["group_size"].eq(2).all()
    assert sorted(coll[coll["rank"] == 0]["wait_ns"]) == [100_000] * 4
    assert sorted(coll[coll["rank"] == 1]["wait_ns"]) == [0] * 4
    assert coll["transfer_ns"].eq(400_000).all()


def test_step_times_are_rank_by_step(run):
    st = run.step_times()
    assert list(st.index) == [0, 1] and list(st.columns) == [0, 1, 2, 3]
    assert (st.to_numpy() == rs.STEP).all()


def test_the_runs_step_time_is_a_step_as_a_traces_is_and_its_total_has_its_own_key(run):
    """`step_time_ns` once held the analysed total per rank (four steps here) under the name
    a trace's summary gives its median step."""
    summary = run.summary()
    assert summary["step_time_ns"] == run[0].summary()["step_time_ns"] == rs.STEP
    assert summary["analysed_time_ns"] == pytest.approx(4 * rs.STEP)
    assert run.analysed_time_ns() == summary["analysed_time_ns"]


def test_communication_overlap_is_exact(run):
    comm = run.communication().set_index("rank")
    assert comm.loc[0, "compute_ns"] == 4 * 600_000
    assert comm.loc[0, "communication_ns"] == 4 * 500_000
    assert comm.loc[0, "overlap_ns"] == 4 * 200_000
    assert comm.loc[0, "overlap_pct"] == pytest.approx(40.0)
    assert comm.loc[0, "exposed_ns"] == 4 * 300_000
    assert comm.loc[1, "overlap_pct"] == pytest.approx(50.0)
    assert comm.loc[1, "exposed_ns"] == 4 * 200_000
    # waiting is not moving data: rank 0's exposed transfer is [600k, 900k) only
    assert comm.loc[0, "exposed_transfer_ns"] == 4 * 300_000


def test_single_trace_communication_matches_the_run(run):
    one = run[0].communication()
    assert one.iloc[0]["overlap_pct"] == pytest.approx(40.0)
    assert one.iloc[0]["exposed_ns"] == 4 * 300_000


def test_collective_bandwidth(run):
    stats = run.collective_stats().set_index("rank")
    # 64 MiB moved in 400 us per call: algbw = bytes / transfer time; bus = 2(n-1)/n x algbw
    algbw = rs.MIB64 / 400_000
    assert stats.loc[0, "algbw_gbps"] == pytest.approx(algbw)
    assert stats.loc[0, "busbw_gbps"] == pytest.approx(algbw * 2 * (2 - 1) / 2)


def test_the_straggler_is_the_late_rank(run):
    late = run.stragglers()
    assert list(late["rank"]) == [1]
    row = late.iloc[0]
    assert row["last_arrivals"] == 4
    assert row["wait_caused_ns"] == 4 * 100_000
    assert row["arrival_delay_ns"] == 50_000  # against the median of the two arrivals
    assert row["late_share"] == pytest.approx(0.1)
    # the ranks share one step time (1 ms: rank 0 waits for rank 1): the slowest rank is
    # the one the other waits for, by its own work, where a tie named rank 0
    assert run.rank_summary()["step_time_ns"].nunique() == 1
    assert run.summary()["slowest_rank"] == 1


def test_a_rank_late_on_the_host_is_the_late_rank(tmp_path):
    """The early rank's host waits inside the call for the late one's (`host_wait_ns`),
    and the two devices then arrive together: the late rank is the one the other host
    waited for, by that wait (a balanced run's finding read "arrived last at 6
    collectives, on average 0 ns after the median rank; the other rank spent 0 ns
    waiting" for a saving of the host's waits)."""
    run = neuron_explorer.load(rs.two_ranks(tmp_path / "t.run"))
    coll = run.collectives.copy()
    early = coll["rank"] == 0
    coll.loc[early, "host_wait_ns"] = coll.loc[early, "wait_ns"]
    coll.loc[early, "arrival"] += coll.loc[early, "wait_ns"]
    coll.loc[early, "wait_ns"] = 0
    run.__dict__["collectives"] = coll  # as a recording of host-side lateness gives it
    late = rank_lateness(run).set_index("rank")
    assert late.loc[1, "last_arrivals"] == 4 and late.loc[0, "last_arrivals"] == 0
    assert late.loc[1, "wait_caused_ns"] == 4 * 100_000
    assert late.loc[1, "arrival_delay_ns"] == 50_000


def test_slices_of_the_transfer_alone_give_the_same_arrivals(tmp_path):
    run = neuron_explorer.load(rs.two_ranks(tmp_path / "t.run", transfer_slices=True))
    coll = run.collectives
    assert coll["ts"].nunique() == 4  # both ranks' slices start when the last one arrived
    assert list(run.stragglers()["rank"]) == [1]
    assert run.stragglers().iloc[0]["wait_caused_ns"] == 4 * 100_000
    assert run.communication().set_index("rank").loc[0, "exposed_transfer_ns"] == 4 * 300_000


def test_setup_before_the_first_step_is_left_out(tmp_path):
    run = neuron_explorer.load(rs.two_ranks(tmp_path / "skew.run", setup_skew=True))
    assert len(run.collectives) == 10  # the setup all-gathers are in the table
    late = run.stragglers()
    assert list(late["rank"]) == [1] and late.iloc[0]["wait_caused_ns"] == 4 * 100_000
    comm = run.communication().set_index("rank")
    assert comm.loc[0, "communication_ns"] == 4 * 500_000  # inside the steps only
    assert comm.loc[1, "collectives"] == 4
    assert set(run.collective_stats()["collective"]) == {"all_reduce"}


def test_a_collective_belongs_to_the_step_that_launched_it(tmp_path):
    """A rank's host runs ahead of its device (nothing waits for it): the all-reduce its
    step 2 launched runs after the last step ends. It is step 2's: by its own time it was
    in no step, and a user's rank 0 counted 14 all-reduces where rank 1 counted 23."""
    from neuron_explorer.analyses.communication import collectives
    from synthetic import TraceBuilder

    b = TraceBuilder()
    host = b.thread()
    queue = b.device_track(0, "Collectives")
    b.metadata(host, {"hardware": "trn2", "rank": 0, "world_size": 2})
    for s in range(3):
        b.slice(host, s * 100_000, 100_000, f"step {s}", "step", {"step": s})
        b.slice(host, s * 100_000 + 10_000, 5_000, "c10d::allreduce_", "op",
                {"op_id": s, "step": s}, flow_out=[s])
        b.slice(queue, 400_000 + s * 200_000, 50_000, "all_reduce", "collective",
                {"collective": "all_reduce", "bytes": 64, "group": "[0, 1]", "seq": s,
                 "wait_ns": 0, "transfer_ns": 50_000, "device": 0}, flow_in=[s])
    trace = neuron_explorer.load(b.write_pftrace(tmp_path / "ahead.pftrace"))
    assert collectives(trace)["step"].tolist() == [0, 1, 2]


def test_one_ranks_waits_for_the_others_are_not_communication_to_hide(tmp_path):
    """Alone, a rank's trace records how long each all-reduce waited for the other ranks:
    of its 600 us a step with no compute beside it, 500 us are that wait, which no overlap
    hides. The finding says so and claims the 100 us moving data (a user's rank 0 was told
    overlapping would save the 24 ms it waited for a rank doing extra eval)."""
    from neuron_explorer.analyses.steady_state import analysed_steps
    from neuron_explorer.rules import exposed_communication

    path = rs.write_rank(tmp_path, 0, 2, compute=200_000, coll_start=300_000, wait=500_000)
    trace = neuron_explorer.load(path)
    (f,) = exposed_communication.check(trace)
    steps = len(analysed_steps(trace).steps)
    assert f.title == "Collectives wait for other ranks to arrive (4 collectives)"
    assert f.time_lost_ns == 100_000 * steps
    assert f.symptom_ns == 600_000 * steps
    assert f"Of that, {fmt_ns(500_000 * steps)} is waiting for other ranks" in f.explanation
    assert f.recommendation.startswith("Find the rank that arrives late")


def test_run_findings(run):
    found = {f.rule_id: f for f in run.bottlenecks()}
    straggler = found["straggler_rank"]
    assert "Rank 1" in straggler.title
    assert straggler.time_lost_ns == 400_000
    assert straggler.share_of_step == pytest.approx(0.1)
    assert straggler.evidence and straggler.evidence[0]["rank"] == 1
    assert "collective_wait" not in found  # the straggler's finding holds those waits
    exposed = found["exposed_communication"]
    assert exposed.time_lost_ns == (4 * 300_000 + 4 * 200_000) // 2
    assert "bucket_cap_mb" in exposed.recommendation
    assert straggler.symptom_ns == 400_000 and straggler.saving_basis.startswith("critical")
    # rank 1's extra compute is the straggler's cause: one finding, not a second one
    assert "load_imbalance" not in found
    assert "small_collectives" not in found
    ranked = [f.time_lost_ns for f in run.bottlenecks()]
    assert ranked == sorted(ranked, reverse=True)


def test_small_collectives_fire_and_balanced_ranks_are_no_stragglers(tmp_path):
    run = neuron_explorer.load(rs.balanced_small_messages(tmp_path / "small.run"))
    found = {f.rule_id: f for f in run.bottlenecks()}
    assert "small_collectives" in found
    small = found["small_collectives"]
    assert "160 small collectives" in small.title
    needed = 4 * 40 * (64 << 10) / (rs.MIB64 / 100_000)  # their bytes at the large calls' rate
    assert small.time_lost_ns == pytest.approx(4 * 40 * 10_000 - needed, abs=1)
    # the estimate stands: the collectives (no rank waits at them) are on the run's path
    path = run.critical_path()
    assert path.loc[path["category"] == "collective", "dur"].sum() == 4 * (40 * 10_000
                                                                          + 100_000)
    assert "within the 2 ms the run's critical path spends in collective" in small.saving_basis
    assert not len(run.stragglers())
    assert "straggler_rank" not in found and "load_imbalance" not in found
    assert "collective_wait" not in found


def test_load_imbalance_says_how_much_longer_the_busiest_rank_works(tmp_path):
    """Rank 1 computes 350 us a step, rank 0 200 us, both meeting at the collective in
    time: 75% longer (the title said 43%, the spread over the busiest rank's time)."""
    folder = tmp_path / "imbalance.run"
    folder.mkdir()
    rs.write_rank(folder, 0, 2, compute=200_000, coll_start=400_000, wait=0)
    rs.write_rank(folder, 1, 2, compute=350_000, coll_start=400_000, wait=0)
    (folder / "manifest.json").write_text(json.dumps({"world_size": 2, "preset": "trn2"}))
    found = {f.rule_id: f for f in neuron_explorer.load(folder).bottlenecks()}
    assert found["load_imbalance"].title.endswith("rank 1 works 75% longer than rank 0")


def test_waits_spread_over_ranks_are_collective_waits_not_a_straggler(tmp_path):
    run = neuron_explorer.load(rs.rotating_late_rank(tmp_path / "rotating.run"))
    assert not len(run.stragglers())
    lateness = run.sql("select 1")  # sql works without naming a table
    assert len(lateness) == 1
    found = {f.rule_id: f for f in run.bottlenecks()}
    assert "straggler_rank" not in found
    wait = found["collective_wait"]
    assert wait.time_lost_ns == 3 * 150_000
    assert "4 different ranks were last" in wait.explanation


def test_run_sql(run):
    got = run.sql("select rank, sum(wait_ns) as w from collectives group by rank order by rank")
    assert list(got["w"]) == [400_000, 0]


def test_kineto_rank_folder_derives_waits_from_arrivals(tmp_path):
    folder = tmp_path / "gpus"
    folder.mkdir()
    # rank 1 reaches the all-reduce 200 us later; file names give no rank, the traces do
    for name, rank, start in (("host-a.json.gz", 0, 500.0), ("host-b.json", 1, 700.0)):
        text = json.dumps(rs.kineto_rank(rank, 2, start)).encode()
        (folder / name).write_bytes(gzip.compress(text) if name.endswith(".gz") else text)
    run = neuron_explorer.load(folder)
    assert run.ranks == [0, 1]
    coll = run.collectives.set_index("rank")
    assert coll.loc[0, "collective"] == "all_reduce"
    assert coll.loc[0, "bytes"] == 4 * 1048576
    assert coll.loc[0, "wait_ns"] == 200_000 and coll.loc[1, "wait_ns"] == 0
    assert coll.loc[0, "transfer_ns"] == 200_000
    comm = run.communication().set_index("rank")
    assert comm.loc[0, "overlap_pct"] == pytest.approx(100 * 100 / 400)
    types = run.kernel_types()
    # rank 0: compute [0, 600) us, the all-reduce kernel [500, 900): HTA's rows
    zero = types[types["rank"] == 0].set_index("kernel_type")["ns"].to_dict()
    assert zero == {"computation": 500_000, "computation overlapping communication": 100_000,
                    "communication": 300_000}


def test_ranks_from_file_names_and_duplicates(tmp_path):
    folder = tmp_path / "named"
    folder.mkdir()
    for rank in (0, 1):
        events = rs.kineto_rank(rank, 2, 500.0)
        del events["distributedInfo"]
        (folder / f"trace_rank-{rank}.json").write_text(json.dumps(events))
    assert neuron_explorer.load(folder).ranks == [0, 1]
    dup = tmp_path / "dup"
    dup.mkdir()
    for name in ("a.json", "b.json"):
        (dup / name).write_text(json.dumps(rs.kineto_rank(0, 2, 500.0)))
    with pytest.raises(NeuronExplorerError, match="two traces are rank 0"):
        neuron_explorer.load(dup)


def test_a_folder_without_traces_is_a_clear_error(tmp_path):
    with pytest.raises(NeuronExplorerError, match="holds no trace files"):
        neuron_explorer.load(tmp_path)


def test_an_empty_trace_in_a_folder_is_left_out_with_a_warning(run_dir, tmp_path):
    """A process killed before it wrote anything (an older recording's DataLoader worker)
    leaves an empty file: the folder still loads, and says what it left out."""
    import shutil

    folder = tmp_path / "train.run"
    shutil.copytree(run_dir, folder)
    (folder / "train.pid4242.pftrace").write_bytes(b"")
    with pytest.warns(UserWarning, match=r"left out 1 empty trace file\(s\) \(train.pid4242"):
        loaded = neuron_explorer.load(folder, cache=False)
    assert loaded.ranks == [0, 1]
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "a.pftrace").write_bytes(b"")
    with pytest.raises(NeuronExplorerError, match="every trace file in the folder is empty"):
        neuron_explorer.load(empty)


def test_a_json_file_beside_the_traces_that_is_no_trace_is_left_out(run_dir, tmp_path):
    """Notes or a config kept in the run folder made `report FOLDER` fail on them; a
    damaged trace still fails."""
    import gzip
    import shutil

    folder = tmp_path / "train.run"
    shutil.copytree(run_dir, folder)
    (folder / "notes.json").write_text(json.dumps({"lr": 0.1, "comment": "baseline"}))
    (folder / "config.json.gz").write_bytes(gzip.compress(b'{"batch": 64}'))
    with pytest.warns(UserWarning, match=r"left out 2 JSON file\(s\) that hold no trace "
                                         r"events \(config.json.gz, notes.json\)"):
        loaded = neuron_explorer.load(folder, cache=False)
    assert loaded.ranks == [0, 1]
    assert any("notes.json" in w for w in loaded.warnings)  # the report prints these
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "rank0.json").write_text('{"traceEvents": [{"ph": "X", "na')
    (damaged / "rank1.json").write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(NeuronExplorerError):
        neuron_explorer.load(damaged, cache=False)
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "notes.json").write_text("{}")
    with pytest.raises(NeuronExplorerError, match="JSON files hold no trace events"):
        neuron_explorer.load(notes)


def run_step_medians(run_dir: Path) -> list[float]:
    loaded = neuron_explorer.load(run_dir)
    return [float(loaded[rank].steps["dur"].median()) for rank in loaded.ranks]


def test_report_on_a_run_folder(run_dir, capsys):
    assert main(["report", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "Ranks (step: the median; the other times: totals over the analysed steps)" in out
    assert "rank1.pftrace" in out
    assert "Rank 1 is a straggler" in out
    # The head gave "step time per rank (total)": the sum of every analysed step, read as
    # a step time. It now gives the ranks' median step and the slowest rank.
    assert "step time per rank (total)" not in out
    steps = run_step_medians(run_dir)
    assert f"step time (median over ranks)  {fmt_ns(float(np.median(steps)))}" in out
    # the rank the others wait for: synchronised ranks' steps last alike, and the first of
    # equal steps was named, a rank that waited
    caused = neuron_explorer.load(run_dir).rank_summary().set_index("rank")["wait_caused_ns"]
    assert caused.idxmax() == 1
    assert (f"slowest rank                   rank 1: the others waited {fmt_ns(caused[1])} "
            "for it") in out
    assert main(["report", str(run_dir), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in data["ranks"]] == [0, 1]
    assert {f["rule_id"] for f in data["findings"]} >= {"straggler_rank",
                                                         "exposed_communication"}
    assert data["communication"][0]["overlap_pct"] == pytest.approx(40.0)


def test_diff_of_two_runs(run_dir, tmp_path, capsys):
    other = rs.balanced_small_messages(tmp_path / "b.run")
    assert main(["diff", str(run_dir), str(other), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = {r["rank"]: r for r in data["ranks"]}
    assert set(rows) == {0, 1}
    assert rows[1]["compute_ns_a"] == 4 * 700_000 and rows[1]["compute_ns_b"] == 4 * 600_000
    assert main(["diff", str(run_dir), str(run_dir / "rank0.pftrace")]) == 2
    assert "both runs or both traces" in capsys.readouterr().err
    # --fail-above judges the step the table shows: the ranks' median step (it took a mean
    # over the analysed time: 90.6% grown where the table said 97.0%)
    main(["diff", str(run_dir), str(other), "--fail-above", "1000", "--format", "json"])
    captured = capsys.readouterr()
    table = json.loads(captured.out)["ranks"]
    a_ns = float(np.median([r["step_time_ns_a"] for r in table]))
    b_ns = float(np.median([r["step_time_ns_b"] for r in table]))
    assert f"step time {(b_ns / a_ns - 1) * 100:+.1f}% ({fmt_ns(a_ns)} -> {fmt_ns(b_ns)})" \
        in captured.err


def test_the_loader_uses_worker_processes_for_several_files(run_dir, monkeypatch):
    import neuron_explorer.runs.run as run_module

    seen = []
    original = run_module.ProcessPoolExecutor

    class Spy(original):  # type: ignore[misc, valid-type]
        def __init__(self, *a, **kw):
            seen.append(kw.get("max_workers"))
            super().__init__(*a, **kw)

    monkeypatch.setattr(run_module, "ProcessPoolExecutor", Spy)
    loaded = neuron_explorer.load_run(run_dir, processes=2)
    assert seen == [2]
    assert np.array_equal(loaded.communication()["overlap_ns"],
                          neuron_explorer.load_run(run_dir, processes=1).communication()
                          ["overlap_ns"])


@pytest.mark.parametrize("threads", [1, 2], ids=["forked", "from_a_fork_server"])
def test_a_script_loads_a_run_at_its_top_level(run_dir, tmp_path, threads):
    """A script loading a run at its top level, with no `if __name__ == "__main__":`,
    failed in the workers' bootstrap where they start from a fork server (a thread beside
    the script's, as tqdm's monitor or a notebook's): each worker ran the script again."""
    import subprocess
    import sys

    script = tmp_path / "top_level.py"
    script.write_text(
        "import threading\nimport neuron_explorer\n"
        + ("threading.Thread(target=threading.Event().wait, daemon=True).start()\n"
           if threads > 1 else "")
        + "threads = threading.active_count()\n"
        "from neuron_explorer.runs.run import _context\n"
        "print('workers', _context().get_start_method())\n"
        + f"run = neuron_explorer.load({str(run_dir)!r}, processes=2, cache=False)\n"
        "print('ranks', run.ranks, 'threads', threads)\n")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    method = "fork" if threads == 1 else "forkserver"
    assert done.stdout.split() == ["workers", method, "ranks", "[0,", "1]", "threads",
                                   str(threads)]


def test_one_rank_alone_reports_its_exposed_communication(run):
    found = {f.rule_id: f for f in run[0].bottlenecks()}
    assert found["exposed_communication"].time_lost_ns == 4 * 300_000
    # in the run, the cross-rank rule holds it; the per-rank copy is not repeated
    assert [f.rule_id for f in run.bottlenecks()].count("exposed_communication") == 1


@pytest.mark.slow  # 10-14 s in a CI run
def test_the_recorded_straggler_run_names_its_slow_rank(repo_root):
    """sample_traces/straggler.run: rank 2 of 3 adds host work each step (examples/)."""
    run = neuron_explorer.load(repo_root / "sample_traces" / "straggler.run")
    assert run.ranks == [0, 1, 2] and run.manifest["world_size"] == 3
    assert list(run.stragglers()["rank"])[:1] == [2]
    found = {f.rule_id: f for f in run.bottlenecks()}
    assert "Rank 2 is a straggler" in found["straggler_rank"].title
    waits = run.collectives.groupby("rank")["wait_ns"].sum()
    assert waits[2] < waits[0] / 100 and waits[2] < waits[1] / 100



HELD_LOCK_RUN = """
import functools, sys, threading
import neuron_explorer
from neuron_explorer.trace import Trace

held, release = threading.Event(), threading.Event()

def hold():  # another thread inside a Trace property as the workers start (the dashboard)
    with vars(Trace)["instructions"].lock:
        held.set()
        release.wait()

threading.Thread(target=hold, daemon=True).start()
held.wait()
run = neuron_explorer.load(sys.argv[1], cache=False, processes=2)
release.set()
print(run.ranks)
"""


def test_a_run_loads_while_another_thread_holds_a_lock(run_dir, tmp_path):
    """Rank workers forked from a process whose other thread held a lock inherited it
    locked for good: a run folder opened in the dashboard, whose findings compute in the
    background, hung in `functools.cached_property` (Python 3.11 shares its lock across
    instances). With other threads running, the workers come from a fork server."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", HELD_LOCK_RUN, str(run_dir)],
                          check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("[0, 1]")


def test_a_rank_rules_saving_is_what_its_fix_saves_the_run(run):
    """Ranks meet at collectives, so the run moves at the pace of the slowest rank's own
    work (rank 1 here: 1 ms a step against rank 0's 0.9 ms). The syncs save rank 0 1.2 ms
    and rank 1 0.9 ms: with them gone on every rank the pace falls from 4.0 to 3.1 ms,
    0.9 ms, where rank 0's 1.2 ms was claimed (a DDP run's rank waiting for a straggler
    was once told 16.9 ms; removing the sync saved 0.6 ms)."""
    per_rank = {rank: {f.rule_id: f.time_lost_ns for f in d.findings}
                for rank, d in run.digests.items()}
    assert per_rank[0]["sync_in_step"] == 1_200_000 and per_rank[1]["sync_in_step"] == 900_000
    (sync,) = [f for f in run.bottlenecks() if f.rule_id == "sync_in_step"]
    assert sync.time_lost_ns == 900_000
    assert "the run moves at the pace of the slowest rank's own work" in sync.saving_basis


def test_a_rank_finding_without_a_saving_keeps_its_own_words(run_dir):
    """A rank's finding that saves no step time (memory near capacity) says nothing of
    the run's pace; one whose time lost is its symptom's own total names where it came
    from (both read "Saving from across ranks: ..." before)."""
    from neuron_explorer.rules.finding import Finding

    fresh = neuron_explorer.load(run_dir)
    fresh.digests[1].findings.extend([
        Finding("memory_near_capacity", "Device 0 memory at 95% of capacity", "high", 0, 0.0),
        Finding("input_bound", "Steps wait for their input", "medium", 300_000, 0.1)])
    found = {f.rule_id: f for f in fresh.bottlenecks()}
    memory, data = found["memory_near_capacity"], found["input_bound"]
    assert memory.time_lost_ns == 0 and memory.saving_note() == ""
    assert data.saving_note().startswith("Saving from each rank's own finding; across ranks")
    assert data.time_lost_ns > 0


def test_a_rank_finding_takes_its_words_from_the_rank_setting_the_pace(run_dir):
    """Rank 1 sets the run's pace. A host-bound rank 0 claimed its FP32 matmuls' device time
    "after the host-bound fix"; in a user's imbalanced DDP run the run showed that rank's
    words ("the run is host-bound now"), where the run's own host_bound finding saved
    nothing. The run shows the pace rank's finding, as it is the fix that shortens the run."""
    from neuron_explorer.rules.finding import Finding

    fresh = neuron_explorer.load(run_dir)
    waits = Finding("fp32_matmul", "90 matmuls run in FP32", "low", 2_000_000, 0.2,
                    explanation="The run is host-bound now, so this is device time.",
                    after="host_bound")
    paces = Finding("fp32_matmul", "90 matmuls run in FP32", "low", 500_000, 0.05,
                    explanation="On the critical path.")
    fresh.digests[0].findings.append(waits)
    fresh.digests[1].findings.append(paces)
    (fp32,) = [f for f in fresh.bottlenecks() if f.rule_id == "fp32_matmul"]
    assert fp32.title == "90 matmuls run in FP32 on rank 1 (and 1 other rank)"
    assert fp32.after == "" and "host-bound now" not in fp32.explanation
    # the pace, rank 1's 4.0 ms, falls by its 0.5 to 3.5, under rank 0's own 3.6 (its
    # device time saves nothing before the host-bound fix): the run saves 0.4
    assert fp32.time_lost_ns == 400_000


def test_a_finding_that_waits_on_another_fix_takes_nothing_off_its_ranks_work():
    """Rank 1 sets the pace (4.0 ms of its own work a step), rank 0 is close behind (3.9)
    and host-bound: its FP32 finding's 2 ms are device time after the host-bound fix, so
    making the fix on every rank leaves rank 0 at 3.9 and saves the run 0.1 ms, not rank
    1's 0.5 (its claim, taken off rank 0's work too, made a compiled DDP run's autocast
    look like a saving where it ran slower)."""
    from types import SimpleNamespace

    import pandas as pd
    from neuron_explorer.rules.finding import Finding
    from neuron_explorer.rules.ranks import _run_saving

    waits = Finding("fp32_matmul", "FP32", "low", 2_000_000, 0.2, after="host_bound")
    paces = Finding("fp32_matmul", "FP32", "low", 500_000, 0.05)
    run = SimpleNamespace(digests={0: SimpleNamespace(findings=[waits]),
                                   1: SimpleNamespace(findings=[paces])},
                          share_in_run_steps=lambda rank: 1.0)
    own = pd.Series({0: 3_900_000.0, 1: 4_000_000.0})
    assert _run_saving(run, "fp32_matmul", own) == 100_000


def test_a_ranks_finding_counts_in_the_runs_steps_only():
    """Rank 1 analysed steps 0-3 on its own, the run steps 1-3 (a warm-up the waits hid):
    its finding's 4 ms over four steps saves the run 3 ms over the run's three."""
    from types import SimpleNamespace

    import pandas as pd
    from neuron_explorer.rules.finding import Finding
    from neuron_explorer.rules.ranks import _run_saving
    from neuron_explorer.runs.run import Run

    found = Finding("fp32_matmul", "FP32", "low", 4_000_000, 0.2)
    run = SimpleNamespace(
        digests={0: SimpleNamespace(findings=[], summary={"steps_analysed": [1, 2, 3]}),
                 1: SimpleNamespace(findings=[found], summary={"steps_analysed": [0, 1, 2, 3]})},
        analysed_steps=(1, 2, 3))
    run.share_in_run_steps = lambda rank: Run.share_in_run_steps(run, rank)
    own = pd.Series({0: 1_000_000.0, 1: 9_000_000.0})
    assert _run_saving(run, "fp32_matmul", own) == 3_000_000


def test_a_straggler_with_more_data_says_what_splitting_it_evenly_saves(monkeypatch):
    """The straggler's headline is its extra work dropped (rank 0 given the other's 512
    rows: 1.03 ms a step, matched); a user who split the 2048 rows evenly saved 0.70, and
    on a compiled run 2.18 where the mean's share gives 2.15: where the extra is the same
    ops on more data, the finding says both."""
    import pandas as pd
    from neuron_explorer.analyses import ranks
    from neuron_explorer.rules.ranks import straggler_rank

    work = pd.DataFrame({1: [3_000_000, 1_000_000], 2: [3_000_000, 1_000_000]},
                        index=pd.Index([0, 1], name="rank"))
    monkeypatch.setattr(ranks, "own_work", lambda run: work)
    monkeypatch.setattr(straggler_rank, "_where", lambda run, rank: ("device_busy", True))
    text = straggler_rank._shared_evenly(object(), 0, lost=4_000_000)
    # the pace 6 ms less the mean rank's 4: 2 ms, 1 ms a step
    assert "split evenly, every rank takes the mean share and the run saves about 2 ms " \
           "(1 ms a step)" in text
    monkeypatch.setattr(straggler_rank, "_where", lambda run, rank: ("device_busy", False))
    assert straggler_rank._shared_evenly(object(), 0, lost=4_000_000) == ""  # more ops


class _StepsOnly:
    """What the straggler finding's wording reads of a run: its steps and analysed time."""

    def __init__(self, python_ns: dict[int, int], ops: dict[int, int]) -> None:
        import pandas as pd

        rows = [{"rank": r, "step": s, "host_sync_ns": 1, "ops": ops[r], "device_busy_ns": 0,
                 "host_python_ns": python_ns[r]} for r in python_ns for s in range(4)]
        self.steps = pd.DataFrame(rows)

    def analysed_time_ns(self) -> float:
        return 4 * 3e6


@pytest.mark.parametrize("python_ns, ops, lost, said", [
    ({0: 1_300_000, 1: 1_000_000}, {0: 43, 1: 43}, 1.2e6, True),  # 10% of the run
    ({0: 1_300_000, 1: 1_000_000}, {0: 43, 1: 43}, 2.4e6, False),  # 20%: not the machine
    ({0: 1_300_000, 1: 1_000_000}, {0: 60, 1: 43}, 1.2e6, False),  # more ops: the program
])
def test_a_small_straggler_in_the_hosts_python_may_be_the_machine(python_ns, ops, lost, said):
    """Balanced runs on this 2-core machine measured one rank up to 10.5% slower in its own
    Python, consistently over the steps: the finding says so where that is all it sees."""
    from neuron_explorer.rules.ranks.straggler_rank import _maybe_the_machine

    text = _maybe_the_machine(_StepsOnly(python_ns, ops), 0, lost)
    assert ("record the run again" in text) == said, text
