"""Cross-rank analyses of a run: step times per rank, collectives matched across ranks,
stragglers.

A collective call is the same call on every rank of its group when it has the same
group, kind and sequence number. Its last arrival is when the slowest rank reached
it; every other rank waits from its own arrival until then. Our traces record that
wait (`wait_ns`, measured on the simulated interconnect); for PyTorch-profiler
traces it is derived here from the arrival times, which assumes the ranks' clocks
agree (true on one host; across hosts only as well as their clocks are synchronised).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.analyses.communication import COLLECTIVE_COLUMNS
from neuron_explorer.analyses.critical_path import CATCH_UP_FACTOR

if TYPE_CHECKING:
    from neuron_explorer.runs.run import Run

MATCH_KEYS = ["group", "collective", "seq"]
# The same call on every rank moves about the same bytes: past this ratio, not one call.
SIZE_MISMATCH = 4
# A straggler's own work per step exceeds the others' beyond their noise (a t statistic).
SLOWER_T = 3.0
MIN_STEPS_TESTED = 4
STRAGGLER_COLUMNS = ["rank", "arrival_delay_ns", "last_arrivals", "wait_caused_ns",
                     "step_time_ns", "step_excess_ns", "saving_ns", "late_share"]
# A rank is a straggler when removing its extra work would save at least this share of
# the run's step time.
LATE_SHARE = 0.05
# a normal distribution's standard deviation is this many times its median absolute
# deviation (the jitter floor's robust spread)
MAD_TO_SD = 1.4826


def step_times(run: Run) -> pd.DataFrame:
    """Each rank's host step windows in ns, one row per rank, one column per step (a rank
    whose device waits at collectives keeps short windows while its steps last as long as
    the slowest rank's: `Run.rank_summary()`'s `step_time_ns` is the step as paced)."""
    steps = run.steps
    if not len(steps):
        return pd.DataFrame(index=pd.Index(run.ranks, name="rank"))
    frame = steps.pivot_table(index="rank", columns="step", values="dur", aggfunc="sum")
    return frame.reindex(run.ranks)


def matched_collectives(coll: pd.DataFrame, complete: bool = True) -> pd.DataFrame:
    """Every rank's collective calls (a `rank` column beside the collectives table) with the
    group's last arrival (`last_arrival`), and `wait_ns`/`transfer_ns` (derived from the
    arrivals where the trace did not record them; not when the run is not `complete`,
    whose missing ranks may have arrived later than every rank here)."""
    extra = [c for c in ("analysed", "idle_after_ns", "slack_after_ns") if c in coll]
    columns = ["rank", *COLLECTIVE_COLUMNS, *extra, "last_arrival", "ranks_arrived"]
    if not len(coll):
        return pd.DataFrame(columns=columns)
    coll = coll.copy()
    grouped = coll.groupby(MATCH_KEYS, sort=False)
    coll["last_arrival"] = grouped["arrival"].transform("max")
    coll["ranks_arrived"] = grouped["rank"].transform("nunique")
    # Calls numbered by their order on each rank (a PyTorch-profiler trace records no
    # sequence number) pair up wrongly when the ranks' calls differ: sizes far apart are
    # not one call (an all_to_all of 3 KB against one of 340 MB), so neither waits.
    low, high = grouped["bytes"].transform("min"), grouped["bytes"].transform("max")
    unmatched = (high > SIZE_MISMATCH * low.clip(lower=1)).to_numpy()
    coll.loc[unmatched, "last_arrival"] = coll.loc[unmatched, "arrival"]
    coll.loc[unmatched, "ranks_arrived"] = 1
    derived = np.clip(coll["last_arrival"] - coll["arrival"], 0, coll["dur"]) if complete else 0
    unknown = coll["wait_ns"].to_numpy() < 0
    coll.loc[unknown, "wait_ns"] = np.where(coll["ranks_arrived"] > 1, derived, 0)[unknown]
    unknown_transfer = coll["transfer_ns"].to_numpy() < 0
    coll.loc[unknown_transfer, "transfer_ns"] = (coll["dur"] - coll["wait_ns"])[unknown_transfer]
    return coll[columns]


def stragglers(run: Run) -> pd.DataFrame:
    """Ranks whose lateness costs the run time: what the run would save if the rank did
    no more work than the others (`saving_ns`, see `straggler_savings`) is at least
    `LATE_SHARE` of its step time. Columns: arrival delay (mean, against the median rank's
    arrival at the same call), how often it arrived last, the wait it caused each other
    rank (total over the run: the symptom), its step time and excess over the median,
    the saving, and `late_share` (the saving as a share of the run's step time)."""
    table = rank_lateness(run)
    if run.missing_ranks:  # who is late against ranks that are not here is unknown
        return table.iloc[:0]
    return table[table["late_share"] >= LATE_SHARE].sort_values(
        "late_share", ascending=False, ignore_index=True)


def step_collectives(run: Run) -> pd.DataFrame:
    """The collectives inside the run's analysed steps (`Run.analysed_steps`; all of them
    when the run has no steps): the calls of setup (creating groups, the first
    broadcasts, while ranks start at different times) and of compile steps are not
    steady training."""
    coll = _rank_window_collectives(run)
    if not len(coll) or not run.analysed_steps:
        return coll
    left_out = set(run.steps["step"].tolist()) - set(run.analysed_steps)
    return coll[~coll["step"].isin(left_out)]  # the step whose host launched the call


def _rank_window_collectives(run: Run) -> pd.DataFrame:
    """The collectives inside the steps each rank analysed on its own."""
    coll = run.collectives
    if len(coll) and "analysed" in coll:
        return coll[coll["analysed"].astype(bool)]
    return coll


def rank_lateness(run: Run) -> pd.DataFrame:
    """`stragglers`' figures for every rank, late or not."""
    coll = step_collectives(run)
    ranks = pd.Index(run.ranks, name="rank")
    out = pd.DataFrame(index=ranks)
    if len(coll):
        multi = coll[coll["ranks_arrived"] > 1].copy()
        # a host that waited inside the call for another rank's host (`host_wait_ns`)
        # reached it that much before the device's arrival, which comes after that wait:
        # lateness on the host shows there, the devices arriving together
        host_wait = multi.get("host_wait_ns", 0)
        multi["arrival"] = multi["arrival"] - host_wait
        multi["waited"] = multi["wait_ns"] + host_wait
        median = multi.groupby(MATCH_KEYS)["arrival"].transform("median")
        multi["delay"] = multi["arrival"] - median
        out["arrival_delay_ns"] = multi.groupby("rank")["delay"].mean()
        last = multi[multi["arrival"] == multi.groupby(MATCH_KEYS)["arrival"].transform("max")]
        # a call that one rank reached last: every other rank's wait is that rank's doing
        waits = multi.groupby(MATCH_KEYS)["waited"].sum().rename("others_wait")
        last = last.join(waits, on=MATCH_KEYS)
        n_others = np.maximum(last["ranks_arrived"] - 1, 1)
        last = last.assign(caused=(last["others_wait"] - last["waited"]) / n_others)
        out["last_arrivals"] = last.groupby("rank").size()
        out["wait_caused_ns"] = last.groupby("rank")["caused"].sum()
    for column in ("arrival_delay_ns", "last_arrivals", "wait_caused_ns"):
        if column not in out:
            out[column] = 0
    out = out.fillna(0)
    per_rank_step = run.steps.groupby("rank")["dur"].sum() if len(run.steps) else None
    if per_rank_step is not None:
        out["step_time_ns"] = per_rank_step.reindex(ranks).fillna(0)
        median = float(out["step_time_ns"].median())
        out["step_excess_ns"] = np.maximum(out["step_time_ns"] - median, 0)
    else:
        out["step_time_ns"] = 0
        out["step_excess_ns"] = 0
    total = run.analysed_time_ns()
    out["saving_ns"] = straggler_savings(run).reindex(ranks).fillna(0)
    out["late_share"] = out["saving_ns"] / total if total > 0 else 0.0
    out = out.reset_index()
    for column in ("arrival_delay_ns", "wait_caused_ns", "step_time_ns", "step_excess_ns",
                   "saving_ns"):
        out[column] = out[column].round().astype(np.int64)
    out["last_arrivals"] = out["last_arrivals"].astype(np.int64)
    return out[STRAGGLER_COLUMNS]


def analysed_steps(run: Run) -> tuple[int, ...]:
    """The steps the run's figures compare the ranks over: those every rank analysed,
    without the leading ones that are off the steady pace in some rank's own work, longer
    (an eager warm-up) or shorter (`warmup_count`). A rank's step lengths can hide its
    warm-up: a straggler's extra work makes its later steps as long as the others' waits
    make theirs, so a first step of one-time costs reads as short beside them on every
    rank (a 15 ms straggler's first steps of 4.8 and 8.6 ms beside 17.8 ms). In own work,
    the other rank's warm-up shows (8.6 ms beside 3.3) unless a busy CPU slows its later
    steps (4.8 beside 3.7); the straggler's does not, but its first step lacks the extra
    work, done before its first step began (5.7 ms beside 17.9)."""
    from neuron_explorer.analyses.steady_state import warmup_count

    work = _own_work_in_rank_windows(run)
    if not work.shape[1]:
        return ()
    warm = max(warmup_count(work.loc[rank].tolist(), shorter_too=True) for rank in work.index)
    return tuple(int(step) for step in work.columns[warm:])


def own_work(run: Run) -> pd.DataFrame:
    """Per rank (rows) and analysed step (`Run.analysed_steps`, columns): the step's
    length less the waits for other ranks that lay on its critical path.

    A rank's device waits at a collective until the last rank arrives (`wait_ns`); that
    wait makes the step longer only when the host then waits for the device: a host-bound
    rank queues its next work meanwhile, and its step is as long without the wait. So the
    critical part of the waits is what the host's waits on the device pay of them
    (`waits_on_path`: each wait carried forward in time until device idle absorbs it or a
    sync pays it, in whichever step that sync lies). The host's waits inside collective
    calls for the others' clocks (`host_wait_ns`) are on its path as they stand."""
    work = _own_work_in_rank_windows(run)
    return work[[step for step in work.columns if step in run.analysed_steps]]


def _own_work_in_rank_windows(run: Run) -> pd.DataFrame:
    """`own_work` over the steps every rank analysed on its own."""
    steps = run.steps
    if not len(steps) or "host_sync_ns" not in steps:
        return pd.DataFrame(index=pd.Index(run.ranks, name="rank"))
    steps = steps[steps["host_sync_ns"] >= 0]
    dur = steps.pivot_table(index="rank", columns="step", values="dur", aggfunc="sum")
    coll = _rank_window_collectives(run)
    host_waits = dur * 0
    if len(coll):
        host_waits = coll.pivot_table(index="rank", columns="step", values="host_wait_ns",
                                      aggfunc="sum").reindex_like(dur).fillna(0)
    critical = _waits_paid(run, dur) + host_waits
    # steps every rank analysed: a step missing on one rank cannot be compared
    return (dur - critical).reindex(run.ranks).dropna(axis=1)


def _waits_paid(run: Run, dur: pd.DataFrame) -> pd.DataFrame:
    """Per rank and step: what the host's syncs paid of the collectives' waits."""
    from neuron_explorer.analyses.waits_on_path import delays_at_syncs

    # the waits of set-up and of steps not analysed are a catch-up, not a cost per step
    coll, syncs = _rank_window_collectives(run), run.syncs
    paid = syncs.assign(paid=np.zeros(len(syncs), np.int64))
    for rank in dur.index:
        mine = (syncs["rank"] == rank).to_numpy()
        paid.loc[mine, "paid"] = delays_at_syncs(coll[coll["rank"] == rank], syncs[mine])
    paid = paid[paid["step"] >= 0]
    return paid.pivot_table(index="rank", columns="step", values="paid",
                            aggfunc="sum").reindex_like(dur).fillna(0)


def straggler_savings(run: Run) -> pd.Series:
    """Per rank: the analysed time the run would save if that rank did no more work per
    step than the other ranks (a counterfactual on the critical path, not the sum of the
    waits it causes).

    Ranks that meet at collectives move at the pace of the slowest rank's own work
    (`own_work`, summed over the steps every rank analysed); with rank k's work set to
    the median of the others', the pace is the largest of the others' own work. So the
    saving is max(own work) less max(others' own work): the slowest rank's lead over
    the next, 0 for every other rank. A wait a rank pays once to catch up with another
    that started late (its clock offset, not its work per step) is in no rank's own work
    and saves nothing per step; about 0 for a balanced run."""
    work = own_work(run)
    ranks = pd.Index(run.ranks, name="rank")
    if len(work) < 2 or not work.shape[1]:
        return pd.Series(0, index=ranks, dtype=np.int64)
    total = work.sum(axis=1)
    pace = float(total.max())
    savings = {rank: pace - float(total.drop(index=rank).max())
               if _consistently_slower(work, rank) else 0.0 for rank in total.index}
    return pd.Series(savings, dtype=np.float64).reindex(ranks).fillna(0).round().astype(np.int64)


def _consistently_slower(work: pd.DataFrame, rank: int) -> bool:
    """Whether `rank`'s own work per step exceeds the other ranks' slowest by more than
    their step-to-step noise: a one-sided t statistic of the per-step excess of at least
    `SLOWER_T` (with `MIN_STEPS_TESTED` steps or more; fewer steps are taken as they are).
    Ranks timed on one busy machine differ by a few percent from step to step; extra
    work on one rank shows in every step. The step farthest from the median is left out
    (with more than `MIN_STEPS_TESTED`)."""
    excess = (work.loc[rank] - work.drop(index=rank).max()).to_numpy(np.float64)
    if len(excess) < MIN_STEPS_TESTED:
        return True
    if len(excess) > MIN_STEPS_TESTED:
        # one step far from the others is a rank catching up once (a clock offset from
        # set-up), not work per step: left out of the test
        excess = np.delete(excess, np.argmax(np.abs(excess - np.median(excess))))
    spread = float(excess.std(ddof=1))
    if spread == 0:
        return float(excess.mean()) > 0
    return float(excess.mean()) / (spread / np.sqrt(len(excess))) >= SLOWER_T


def critical_waits(run: Run) -> pd.DataFrame:
    """Per rank (rows) and analysed step (columns): the part of the step's collective
    waits that lay on its critical path (`own_work`'s complement)."""
    work = own_work(run)
    if not work.shape[1]:
        return work
    dur = run.steps.pivot_table(index="rank", columns="step", values="dur", aggfunc="sum")
    return dur.reindex(index=work.index, columns=work.columns) - work


def typical_wait_saving(run: Run) -> float:
    """What the analysed steps would save if no rank waited for another at collectives:
    the critical waits (`critical_waits`), the mean over ranks of each rank's total (as
    the run's step time), with each step's wait capped at `CATCH_UP_FACTOR` times the
    rank's median, less the waits the ranks' jitter causes (`jitter_wait_ns` per step).
    The cap leaves out a wait paid once (a rank catching up with one that started late,
    a clock offset rather than work per step), which no change to the work per step
    would save; jitter is no work either."""
    waits = critical_waits(run)
    if len(waits) < 2 or not waits.shape[1]:
        return 0.0
    cap = waits.median(axis=1) * CATCH_UP_FACTOR
    total = float(waits.clip(upper=cap, axis=0).sum(axis=1).mean())
    return max(0.0, total - jitter_wait_ns(run) * waits.shape[1])


def jitter_wait_ns(run: Run) -> float:
    """The wait per rank and step that ranks doing the same work would still pay: each
    step every rank waits for the slowest, so ranks whose own time varies from step to
    step by a spread s (their own work less the device's busy time: the host's share,
    which a loaded machine's scheduling moves, where device work is the same every
    step) wait about E[max of n] * s for each other even when the work is balanced.
    Variation in device work (longer sequences on some ranks) is work, and not counted
    here."""
    work = own_work(run)
    if len(work) < 2 or work.shape[1] < MIN_STEPS_TESTED:
        return 0.0
    steps = run.steps.pivot_table(index="rank", columns="step", values="device_busy_ns",
                                  aggfunc="sum") if "device_busy_ns" in run.steps else None
    host_share = work - (steps.reindex_like(work).fillna(0) if steps is not None else 0)
    # a robust spread per rank (the median absolute deviation, as a standard deviation)
    deviation = host_share.sub(host_share.median(axis=1), axis=0).abs()
    spread = float(np.sqrt(((deviation.median(axis=1) * MAD_TO_SD) ** 2).mean()))
    return spread * _expected_max_normal(len(work))


def _expected_max_normal(n: int) -> float:
    """E[max of n standard normals] less their mean (0): 0.56 for 2, 1.03 for 4."""
    import math

    x = np.linspace(-8, 8, 4001)
    cdf = np.array([0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x])
    density = np.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    return float(np.trapezoid(x * n * density * cdf ** (n - 1), x))
