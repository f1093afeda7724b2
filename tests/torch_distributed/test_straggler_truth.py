"""A straggler finding's time lost is what removing the straggler's extra work saves,
on runs recorded under torchrun (`imbalance.py`): a balanced FSDP2 run has none, whatever
offset its ranks' host clocks keep; a rank that sleeps on the host or does 3x the device
work is named, with a saving close to the step time the balanced run measures.

"Balanced" is the script's work, not the machine's: on a loaded machine one rank's CPU can
run the same code slower (a memory-bound process beside it: 14% in one recording, seen in
plain PyTorch as much as in the recording), and then that rank really is a straggler. So
the balanced run also times its step's model in plain PyTorch on each rank's CPU, in the
same run (`--cpu-probe`), and what the machine slowed a rank by is allowed for."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import neuron_explorer
import numpy as np
import pytest
from neuron_explorer.analyses.ranks import own_work, step_collectives, straggler_savings

pytestmark = pytest.mark.slow  # four recorded runs of two ranks each

HERE = Path(__file__).parent
STEPS = 10
# The share by which a busy machine runs one rank of a balanced run slower than the other
# in a way the plain-PyTorch twin cannot see: beside a busy process the two ranks' own work
# differed by up to 7.2% in 35 recordings here and by 6.8% in one CI run, each time
# consistently over the steps, while the twin's per-step ratio of the ranks correlated with
# the recording's from -0.67 to +0.88 (14 runs): it sees a lasting slowdown of one rank
# (14% once), not which rank a few percent fall on. Quiet, the ranks were within 1.1%.
MACHINE_NOISE = 0.10
# The share of a step a rank's device may wait at collectives for the ranks' clock noise
# alone, with this suite's other worker beside them on two cores.
CLOCK_NOISE = 0.10
# glibc hands each freed tensor of the device-bound model back to the OS and faults the
# next one in page by page (at 64 MiB tensors: 4M page faults, 17-19 s of CPU for the
# 3x-work run; 0.6M and 8-15 s when glibc keeps them; the tensors are 16 MiB now). Kept,
# in the modelled runs only: their times do not depend on the machine (their traces are
# the same bytes either way).
KEEP_FREED_MEMORY = {"MALLOC_MMAP_THRESHOLD_": str(1 << 32),
                     "MALLOC_TRIM_THRESHOLD_": str(1 << 32)}


def _record(folder: Path, name: str, *script_args: str, modelled: bool = False,
            script: Path = HERE / "imbalance.py"):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NEURON_EXPLORER_CACHE": "off"}
    if modelled:
        env["NEURON_HOST_CLOCK"] = "modelled"
        env.update(KEEP_FREED_MEMORY)
    out = folder / f"{name}.run"
    done = subprocess.run(
        [sys.executable, "-m", "neuron_explorer.cli", "record", "-o", str(out), "--",
         sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
         str(script), "--steps", str(STEPS), *script_args],
        cwd=folder, capture_output=True, text=True, timeout=300, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return neuron_explorer.load(out)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stragglers")
    probe, host_probe = folder / "balanced.probe", folder / "host.probe"
    return {
        "balanced": _record(folder, "balanced", "--model", "fsdp", "--cpu-probe", str(probe)),
        "balanced_slowdown": _machine_slowdown(probe),
        "host": _record(folder, "host", "--model", "fsdp", "--sleep-ms", "15",
                        "--cpu-probe", str(host_probe)),
        "host_slowdown": _machine_slowdown(host_probe),
        "device_balanced": _record(folder, "device_balanced", "--model", "stream",
                                   modelled=True),
        "device": _record(folder, "device", "--model", "stream", "--work", "3",
                          modelled=True),
    }


def _machine_slowdown(probe: Path) -> dict[int, float]:
    """Per rank: how much slower than the fastest rank the machine ran the step's model in
    plain PyTorch (median CPU time per step, the first step left out as warm-up)."""
    medians = {}
    for part in sorted(probe.parent.glob(probe.name + ".*")):
        times = [int(line) for line in part.read_text().split()][1:]
        medians[int(part.suffix[1:])] = float(np.median(times))
    assert len(medians) == 2, medians
    fastest = min(medians.values())
    return {rank: t / fastest - 1 for rank, t in medians.items()}


def _findings(run) -> dict:
    return {f.rule_id: f for f in run.bottlenecks()}


def test_a_balanced_fsdp_run_has_no_straggler_and_no_wait_finding(runs):
    run, slowdown = runs["balanced"], runs["balanced_slowdown"]
    found = _findings(run)
    for rule in ("collective_wait", "load_imbalance"):
        assert rule not in found, found[rule].title
    # the ranks' clocks may keep an offset, and its waits stay as evidence, but removing
    # either rank's work saves no more than the machine's noise between the ranks on top
    # of what the twin says the machine slowed that rank by
    own = own_work(run).sum(axis=1)
    savings = straggler_savings(run)
    for rank, saving in savings.items():
        allowed = (1 + MACHINE_NOISE) * (1 + slowdown[rank]) - 1
        assert saving < allowed * own.min(), (rank, saving, own.to_dict(), slowdown)
    if "straggler_rank" in found:
        # a rank the machine slowed: the finding claims what dropping its extra work
        # saves, within that noise, never the waits it caused
        assert found["straggler_rank"].time_lost_ns == pytest.approx(savings.max(), abs=1)


def test_a_balanced_fsdp_run_waits_only_for_the_other_ranks_lag_in_each_step(runs):
    """The ranks' host clocks meet at the communicator's set-up and where they drift by no
    more than their noise: neither rank's device waits a whole run for a clock offset
    (93% of each step on one rank before). A device waits at a collective only for the
    other rank's lag: in a step where the machine ran the other rank slower, and the run
    is host-bound, that rank's host never waits at a collective and falls behind through
    the step; the faster rank's device waits at each of the step's n collectives for the
    whole lag so far, about lag x step x k/n at the k-th, (n+1)/2 x lag x step in all.

    So per step, the share of the step a device waited less what the other rank's extra
    own work that step explains stays within the clocks' noise (1-4% idle,
    docs/distributed.md; up to 10% with this suite's other worker beside the two ranks on
    two cores): the median over the steps, on each rank. 30 recordings, quiet and beside a
    busy process, left at most 3.8% unexplained, with up to 18% of a step waited. The
    bound this replaced, the amplified slowdown of the plain-PyTorch twin (`--cpu-probe`),
    failed once at 12.2% against 11.9%: the twin does not track which rank a busy machine
    slows in a step (`MACHINE_NOISE`)."""
    run = runs["balanced"]
    coll = step_collectives(run)
    per_step = coll.groupby(["rank", "step"]).size().median()
    coll = coll.assign(waits=coll["wait_ns"].clip(lower=0) + coll["host_wait_ns"])
    waits = coll.pivot_table(index="rank", columns="step", values="waits", aggfunc="sum")
    steps = run.steps.pivot_table(index="rank", columns="step", values="dur", aggfunc="sum")
    work = own_work(run)
    share = (waits / steps)[work.columns]
    lag = (work.max() - work) / work  # how much longer the slowest rank's own work ran
    unexplained = (share - (per_step + 1) / 2 * lag).median(axis=1)
    assert set(unexplained.index) == set(run.ranks)
    assert (unexplained < CLOCK_NOISE).all(), (unexplained.to_dict(), share.median(axis=1))


def test_a_rank_sleeping_on_the_host_is_named_with_its_sleep(runs):
    """The saving is rank 1's own work less rank 0's: its 15 ms of sleep a step, plus
    whatever the machine slowed rank 1 by, less what it slowed rank 0 by. On a loaded
    machine the waiting rank's CPU goes to other processes while it waits, and its own
    work measures longer (one run beside a busy process: 34 ms a step against 22 in the
    balanced run, a saving of 9.7 ms where removing the sleep measured 22). Its
    plain-PyTorch twin, timed each step in the same run before the sleep (`--cpu-probe`),
    measures what the machine slowed each rank by, and that is allowed for, as in the
    balanced run's tests: 13.4-15.1 ms beside a busy process (11.3-14.8 unadjusted),
    15.2-18.9 quiet (14.7-17.3)."""
    run, slowdown = runs["host"], runs["host_slowdown"]
    straggler = _findings(run)["straggler_rank"]
    assert "Rank 1" in straggler.title
    own = own_work(run)
    per_step = straggler.time_lost_ns / own.shape[1]  # steps both ranks analysed
    # the ranks' work without the sleep, at the speed the machine gave rank 0
    work = float(own.loc[0].mean()) / (1 + slowdown[0])
    machine = work * (slowdown[1] - slowdown[0])
    # 15 ms of sleep a step on rank 1, seen through two measured host clocks. The probe is
    # a measurement too: in one suite run it read rank 0 15% slowed and rank 1 not at all
    # while the finding read 17.2 ms a step, and its correction took that to 23.8. The
    # finding is right where either its own figure or the corrected one is
    assert any(10e6 < figure < 20e6 for figure in (per_step, per_step - machine)), (
        per_step, machine, slowdown)
    assert straggler.symptom_ns > 0 and straggler.saving_basis
    # where its steps are longer: the host's Python, running the same ops as the other
    assert "Per step, rank 1 spends" in straggler.explanation
    assert "more than the others in its own Python between ops" in straggler.explanation
    assert "running the same" in straggler.explanation


def test_a_device_bound_rank_with_more_work_saves_what_the_balanced_run_measures(runs):
    slow, balanced = runs["device"], runs["device_balanced"]
    straggler = _findings(slow)["straggler_rank"]
    assert "Rank 1" in straggler.title
    # the fix applied: the same script with equal work, recorded on the same clock
    measured = slow.analysed_time_ns() - balanced.analysed_time_ns()
    assert measured > 0
    assert straggler.time_lost_ns == pytest.approx(measured, rel=0.25)
    assert "more than the others in device work (its kernels)" in straggler.explanation
    assert "split evenly" not in straggler.recommendation  # more ops, not more data
    found = _findings(slow)
    # the same cause once: no load-imbalance or per-rank wait finding beside it
    assert "load_imbalance" not in found and "dependency_idle" not in found


def test_the_runs_critical_path_runs_through_the_rank_that_arrived_last(runs):
    """Rank 0's own chain stops at the all-reduce it waited for; the run's chain goes on
    through rank 1's extra device work, and adds up to the step."""
    run = runs["device"]
    own = run[0].critical_path()
    assert own.loc[own["category"] == "collective_wait", "dur"].sum() > 0
    path = run.critical_path()
    assert len(path) and not (path["category"] == "collective_wait").any()
    kernels = path[path["category"] == "kernel"].groupby("rank")["dur"].sum()
    assert kernels.get(1, 0) > 10 * kernels.get(0, 0)
    longest = run.steps.groupby("step")["dur"].max()
    summed = path.groupby("step")["dur"].sum()
    assert (abs(summed - longest.reindex(summed.index)) <= 0.01 * summed).all()


EXAMPLES = HERE.parent.parent / "examples"


def test_a_wait_paid_in_the_next_step_counts_for_the_straggler(tmp_path):
    """`examples/straggler.py`: the last rank works 15 ms on the host before its forward,
    so the other's device waits for it at the all-reduce of the backward, and its host
    pays that wait at the loss read after `optimizer.step()`, in the next step's window.
    The finding predicts what the same script without the extra work measures, per step.

    Step 0 is a warm-up on both ranks (one-time costs: 4.5 ms against 2.8 without the
    straggler), but beside the straggler's 17.8 ms steps neither rank's step times show
    it: the run analyses after it all the same (the ranks' own work shows it: the
    straggler's step 0 lacks its extra work). Averaged in, the claim read 12.3 ms a step
    where removing the extra work saved 14.7. Five recordings, quiet and beside a busy
    process: claimed over measured on the same steps 0.96-1.09."""
    script = EXAMPLES / "straggler.py"
    slow = _record(tmp_path, "slow", "--extra-ms", "15", script=script)
    even = _record(tmp_path, "even", "--extra-ms", "0", script=script)
    straggler = _findings(slow)["straggler_rank"]
    assert "Rank 1" in straggler.title
    assert 0 not in slow.analysed_steps
    assert straggler.steps == len(slow.analysed_steps)
    # the same steps of the two runs (the mean rank's), each recording within MACHINE_NOISE
    steps = list(slow.analysed_steps)
    measured = float((_step_means(slow).reindex(steps) - _step_means(even).reindex(steps)).sum())
    assert measured > 10e6 * len(steps)  # most of the 15 ms a step
    assert straggler.time_lost_ns == pytest.approx(measured, rel=2 * MACHINE_NOISE)


def _step_means(run):
    """Each step's length, the mean over the run's ranks."""
    return run.steps.groupby("step")["dur"].mean()


def test_fsdps_copies_around_its_collectives_stay_eager_in_the_compiled_prediction(
        runs, tmp_path) -> None:
    """FSDP2's hooks copy each layer's shards into the all-gather's buffer and the
    parameters out of it, and `cat` the gradients for the reduce-scatter, eagerly around
    the graphs of the layers compiled under them. The compiled what-if fused them into
    the graphs: four sharded blocks were predicted 5.38 ms a step where compiling each ran
    9.31 (10.36 predicted now)."""
    from neuron_explorer.what_if.replay import whatif

    rank = runs["balanced"][0]
    predicted = whatif(rank, mode="compiled", output=tmp_path / "p.pftrace")
    for name in ("aten::_foreach_copy_", "aten::cat", "aten::_copy_from"):
        recorded = int((rank.ops["name"] == name).sum())
        kept = int((predicted.ops["name"] == name).sum())
        assert recorded and kept == recorded, (name, recorded, kept)


def test_fsdps_copies_are_in_no_sequence_to_fuse(runs) -> None:
    """Sequences of short kernels holding FSDP2's copies (beside a block's matmul) fuse
    under no fix: its hooks run them eagerly whatever is compiled. They were 20 of a run's
    sequences, claimed with the rest."""
    rank = runs["balanced"][0]
    found = [f for f in rank.bottlenecks() if f.rule_id == "short_kernel_sequence"]
    assert found  # the premise: the model's and the optimizer's sequences are still listed
    for f in found:
        listed = f.explanation.split("occurrences in all")[0]
        assert "_copy_from" not in listed, listed


def test_a_fix_that_removes_the_stragglers_time_says_it_overlaps_the_straggler(tmp_path):
    """The last rank launches ten times the others' small ops: fusing them (on every rank)
    takes that rank down to the others' pace, which is the straggler finding's time. The
    two once read as separate savings of the same 31.5 ms."""
    run = _record(tmp_path, "small", "--model", "stream", "--small", "--work", "10",
                  modelled=True)
    found = _findings(run)
    straggler = found["straggler_rank"].time_lost_ns
    overlapping = [f for f in found.values() if "overlap, not add" in f.explanation]
    assert overlapping and all(f.time_lost_ns >= 0.95 * straggler for f in overlapping)
    assert "On rank 1 alone its fix takes off" in overlapping[0].explanation
    # the waiting rank's own compiled replay saves no more than its own eager replay's
    # step: the replay keeps no wait for the straggler (4.6 ms a step of a 2.9 ms step of
    # its own work was claimed against the recording's waits)
    from neuron_explorer.analyses.steady_state import in_analysed_steps
    from neuron_explorer.rules.host_bound import compiled_saving_ns
    from neuron_explorer.what_if.replay import predicted_step_ns

    waiting = run[0]
    own = predicted_step_ns(waiting, "eager")
    steps = len(in_analysed_steps(waiting, waiting.steps))
    assert own is not None and compiled_saving_ns(waiting) / steps < own


def test_a_compiled_fsdp2_model_that_ran_no_graph_is_told_so(tmp_path):
    """torch.compile around an FSDP2 model breaks at fully_shard's hooks, which Dynamo is
    told to skip, and the model runs eagerly: a user who compiled it as the host-bound
    finding advised saved nothing and was told to compile it again."""
    run = _record(tmp_path, "compiled", "--model", "fsdp", "--compile", modelled=True)
    (host,) = [f for f in run.bottlenecks() if f.rule_id == "host_bound"]
    assert "The model is wrapped in torch.compile" in host.recommendation
    assert "no graph of it ran: Dynamo broke at FSDP2's hooks" in host.recommendation
