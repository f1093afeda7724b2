"""Data-loader stalls: the step waits for its next batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.analyses.steady_state import in_analysed_steps
from neuron_explorer.analyses.step_breakdown import host_slices
from neuron_explorer.common.trace_format import (
    ARG_WORKER,
    CAT_DATALOADER_WORKER,
    META_HOST_CPUS,
)
from neuron_explorer.device_terms import device_terms
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import (
    Finding,
    evidence,
    loop_name,
    make,
    step_time,
    top,
    us,
)
from neuron_explorer.tables import assign_steps

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "dataloader_stall"
ONE_WORKER_SHARE = 0.6  # a worker behind this much of the wait is named as the slow one


SLOW_WORKER_RATIO = 1.25  # a worker whose batches take this much longer is the slow one


def _worker_share(trace: Trace, waits: pd.DataFrame) -> str:
    """Which worker the waits were on, when the recording followed the workers."""
    known = waits[waits["worker"] >= 0]
    if not len(known):
        return ""
    by_worker = known.groupby("worker")["dur"].sum().sort_values(ascending=False)
    worst, share = int(by_worker.index[0]), float(by_worker.iloc[0] / by_worker.sum())
    if len(by_worker) > 1 and share >= ONE_WORKER_SHARE:
        slower = _batch_ratio(trace, worst)
        if slower is not None and slower < SLOW_WORKER_RATIO:
            # workers that start together finish together: the first of each round is
            # the one waited on (a trial's 2 and 4 workers of equal batches all named
            # worker 0 as the slow one)
            return (f" The waits fall on worker {worst} ({share:.0%} of them), whose batches "
                    "take no longer than the others': the workers fetch in step, worker "
                    f"{worst} first in each round, and together fetch batches slower than "
                    "the step uses them.")
        return (f" Worker {worst} is behind {share:.0%} of the wait: its batches take longer "
                "than the others' (its row in the timeline shows each batch).")
    return (f" The waits are spread over {len(by_worker)} worker"
            f"{'s' if len(by_worker) != 1 else ''}: together they fetch batches slower than "
            "the step uses them.")


def _worker_batches(trace: Trace) -> pd.DataFrame:
    """The `batch N` slices on the workers' tracks (none where the recording has none)."""
    sl = trace.table("slices")
    return sl[(sl["category"] == CAT_DATALOADER_WORKER)
              & sl["name"].astype(str).str.startswith("batch ")]


def _batch_ratio(trace: Trace, worker: int) -> float | None:
    """A worker's median batch over the other workers' (their tracks' `batch N` slices);
    None where the recording has no worker tracks."""
    batches = _worker_batches(trace)
    if not len(batches):
        return None
    owner = trace.slice_args.numbers(ARG_WORKER, batches["id"].to_numpy(), default=-1)
    dur = batches["dur"].to_numpy(np.float64)
    own, others = dur[owner == worker], dur[(owner >= 0) & (owner != worker)]
    if not len(own) or not len(others):
        return None
    return float(np.median(own) / max(float(np.median(others)), 1.0))


# What the recorder names the two parts of a worker's batch, and where each comes from.
_PHASES = {"fetch samples": "fetching samples (the Dataset's __getitem__)",
           "collate": "collating them into a batch (the DataLoader's collate_fn)"}
ONE_PHASE_SHARE = 0.6  # a phase taking this much of the workers' batch time is named


def _slow_phase(trace: Trace) -> tuple[str, str]:
    """(explanation, recommendation) naming the part of the workers' batches that takes the
    time, when the recording followed the workers; ("", "") otherwise."""
    sl = trace.table("slices")
    parts = sl[(sl["category"] == CAT_DATALOADER_WORKER) & sl["name"].isin(list(_PHASES))]
    by_phase = parts.groupby("name")["dur"].sum()
    total = float(by_phase.sum())
    if total <= 0:
        return "", ""
    name = str(by_phase.idxmax())
    share = float(by_phase[name]) / total
    if share < ONE_PHASE_SHARE:
        return (" In the workers, fetching and collating take about equal parts of a batch.",
                "")
    said = f" In the workers, {_PHASES[name]} takes {share:.0%} of a batch's time."
    if name == "collate":
        return said, ("; make collating cheaper: move a custom collate_fn's work into the "
                      "Dataset, where each worker does it per sample, and when samples are "
                      "small, let the Dataset return whole batches (a __getitem__ taking a "
                      "list of indices, with DataLoader(..., batch_size=None, "
                      "sampler=BatchSampler(...))) so nothing is stacked sample by sample")
    return said, ""


def check(trace: Trace) -> list[Finding]:
    bd = trace.breakdown()
    lost = float(bd.loc[(bd["side"] == "host") & (bd["category"] == "dataloader"), "ns"].sum())
    if lost < th.DATALOADER_MIN_SHARE * step_time(trace) or lost <= 0:
        return []
    hs = host_slices(trace)
    dl = hs[hs["kind"] == "dataloader"].sort_values("dur", ascending=False)
    # Recorded with worker processes, each wait names the worker it waited on.
    dl = dl.assign(worker=trace.slice_args.numbers(ARG_WORKER, dl["id"].to_numpy(), default=-1))
    items = [evidence(r.ts, r.dur, [r.id], f"waited {us(r.dur)} for the next batch"
                      + (f" from DataLoader worker {r.worker}" if r.worker >= 0 else ""))
             for r in top(dl).itertuples()]
    phase, phase_advice = _slow_phase(trace)
    workers = len(set(dl["worker"].tolist()) - {-1})  # the waits name the workers they met
    pace = _loader_pace(trace, dl, workers)
    suggested = None if workers else _workers_to_suggest(trace, pace)
    saving, basis = _saving(trace, dl, pace, suggested)
    pinned = device_terms(trace.metadata).pinned_memory
    if workers:  # the loader has workers already: more of the same is no sure cure
        advice = (f"The loader's worker processes (the waits met {workers}) do not keep up"
                  + (f" (about {pace.needed()} would: {pace.said()})" if pace else "")
                  + ", and more of them help only while the machine has idle cores (each is a "
                  "process competing with the training loop): make each batch cheaper"
                  + (phase_advice or "; when the samples are already in memory (a "
                     "TensorDataset), index whole batches at once (a __getitem__ taking a list "
                     "of indices, with DataLoader(..., batch_size=None, "
                     "sampler=BatchSampler(...))) instead of fetching and stacking them one "
                     "by one") + ("; set pin_memory=True" if pinned else ""))
        basis += "; the saving assumes batches ready in time, which more workers may not give"
    else:
        advice = ("Load batches in parallel with the step: give your DataLoader "
                  + _workers_to_try(trace, pace, suggested)
                  + ", persistent_workers=True and prefetch_factor=2 or more"
                  + (", pin_memory=True" if pinned else "") + phase_advice)
    return [make(
        trace, RULE_ID, "Steps wait for the data loader", saving, items,
        f"The {loop_name(trace)} spent {us(lost)} waiting for batches; the device has nothing to "
        "do while the host prepares data." + _worker_share(trace, dl) + phase,
        advice + "; move heavy preprocessing (decoding, tokenisation, augmentation) offline or "
        "into the workers' Dataset code.", symptom_ns=lost, saving_basis=basis)]


SUGGESTED_WORKERS = 4  # at least, where the machine has the cores for them
MOST_WORKERS = 64  # no more are suggested, whatever a step's pace asks


@dataclass(frozen=True)
class LoaderPace:
    """How fast the loader must be: what one batch takes to load (the main process's wait
    for it without workers, a worker's batch with them) against a step's own time."""

    batch_ns: float
    step_ns: float  # a step's time besides its waits for batches
    batches_per_step: float

    def needed(self) -> int:
        """Workers that load a step's batches within the step's own time."""
        load = self.batches_per_step * self.batch_ns
        return int(min(max(np.ceil(load / max(self.step_ns, 1.0)), 1), MOST_WORKERS))

    def wait_with(self, workers: int) -> float:
        """A step's wait for its batches with `workers` loading them in parallel."""
        return max(self.batches_per_step * self.batch_ns / workers - self.step_ns, 0.0)

    def said(self) -> str:
        each = "a batch takes" if self.batches_per_step <= 1 else \
            f"each of a step's {self.batches_per_step:.3g} batches takes"
        return f"{each} {us(self.batch_ns)} to load, a step {us(self.step_ns)} without its waits"


def _loader_pace(trace: Trace, waits: pd.DataFrame, workers: int) -> LoaderPace | None:
    """The loader's pace over the analysed steps: the main process's waits where it loads
    its own batches; the workers' batches (their tracks) where it has workers."""
    steps = in_analysed_steps(trace, trace.steps)
    if not len(steps):
        return None

    def within(frame: pd.DataFrame) -> pd.DataFrame:
        return frame[assign_steps(frame["ts"].to_numpy(np.int64), steps) >= 0]

    own = within(waits)
    if not len(own):
        return None
    if workers:
        batches = within(_worker_batches(trace))
        if not len(batches):
            return None
        batch_ns = float(batches["dur"].mean())
    else:
        batch_ns = float(own["dur"].mean())
    step_ns = float(steps["dur"].sum() - own["dur"].sum()) / len(steps)
    return LoaderPace(batch_ns, step_ns, len(own) / len(steps))


def _workers_to_suggest(trace: Trace, pace: LoaderPace | None) -> int:
    """As many workers as keep up with the steps, at least four, but no more than the
    cores of the machine the run was recorded on (each worker is a process: more of them
    than cores compete with the training loop; PyTorch's DataLoader warns past that count
    too)."""
    wanted = max(SUGGESTED_WORKERS, pace.needed() if pace else 0)
    cpus = trace.metadata.get(META_HOST_CPUS)
    if isinstance(cpus, int) and cpus > 0:
        return min(wanted, cpus)
    return wanted


def _workers_to_try(trace: Trace, pace: LoaderPace | None, suggested: int | None) -> str:
    """The suggested worker count, with why it is not more."""
    count = suggested or SUGGESTED_WORKERS
    needed = pace.needed() if pace else 0
    cpus = trace.metadata.get(META_HOST_CPUS)
    said = f"num_workers={count}"
    if isinstance(cpus, int) and 0 < cpus == count < max(SUGGESTED_WORKERS, needed):
        said += (f" (the machine it ran on has {cpus} core{'s' if cpus != 1 else ''}: more "
                 "workers than cores compete with the training loop")
        if pace is not None and needed > cpus:
            said += (f"; keeping up needs about {needed}: {pace.said()}; with {cpus}, steps "
                     f"still wait {us(pace.wait_with(cpus))} each")
        return said + ")"
    if pace is not None and needed > SUGGESTED_WORKERS:
        return said + f" (that many keep up: {pace.said()})"
    return said + " or more"


def _saving(trace: Trace, waits: pd.DataFrame, pace: LoaderPace | None,
            workers: int | None) -> tuple[float, str]:
    """What the steps would save with `workers` loading batches in parallel (each wait cut
    to what is left of it, `LoaderPace.wait_with`), or, where the loader has workers
    already (None), if no step waited for its batch: by replay where the trace allows, else
    the waits on the analysed steps' critical path."""
    from neuron_explorer.analyses.path_share import time_on_path
    from neuron_explorer.what_if.counterfactual import removal_saving_ns

    ts = waits["ts"].to_numpy(np.int64)
    ends = ts + waits["dur"].to_numpy(np.int64)
    if workers is not None and pace is not None:
        left = int(pace.wait_with(workers) / max(pace.batches_per_step, 1e-9))
        cut = ends - ts > left
        starts, ends = ts[cut] + left, ends[cut]
        said = (f"each wait cut to {us(left)}, what {workers} workers leave of it ({pace.said()};"
                " the workers' batches loaded in parallel, each as long as the main process "
                "took)" if left else f"{workers} workers keep up ({pace.said()})")
        # a trial's loader that kept up still waited about 1 ms a batch to receive it
        said += ("; not counted: the main process's own time to receive each batch from a "
                 "worker (the queue, unpickling, its tensors' shared memory), which a "
                 "recording with workers shows in each wait")
        replayed = removal_saving_ns(trace, np.zeros(0, np.int64), f"{RULE_ID}:{workers}",
                                     host_cut=(starts, ends))
        if replayed is not None:
            return replayed, (f"replay: the run replayed with {said}; a wait while the device "
                              "still runs queued work saves nothing")
        return time_on_path(trace, starts, ends, "host"), (
            f"critical path: the waits' time on the analysed steps' critical path, {said}")
    replayed = removal_saving_ns(trace, waits["id"].to_numpy(np.int64), RULE_ID)
    if replayed is not None:
        return replayed, ("replay: the run replayed without the waits for batches (workers "
                          "that keep up; a wait while the device still runs queued work "
                          "saves nothing)")
    return time_on_path(trace, ts, ends, "host"), (
        "critical path: the waits for batches where they set the steps' length (a wait "
        "while the device still runs queued work saves nothing)")
