"""Data-loader stalls: the step waits for its next batch."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
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

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "dataloader_stall"
ONE_WORKER_SHARE = 0.6  # a worker behind this much of the wait is named as the slow one


def _worker_share(waits: pd.DataFrame) -> str:
    """Which worker the waits were on, when the recording followed the workers."""
    known = waits[waits["worker"] >= 0]
    if not len(known):
        return ""
    by_worker = known.groupby("worker")["dur"].sum().sort_values(ascending=False)
    worst, share = int(by_worker.index[0]), float(by_worker.iloc[0] / by_worker.sum())
    if len(by_worker) > 1 and share >= ONE_WORKER_SHARE:
        return (f" Worker {worst} is behind {share:.0%} of the wait: its batches take longer "
                "than the others' (its row in the timeline shows each batch).")
    return (f" The waits are spread over {len(by_worker)} worker"
            f"{'s' if len(by_worker) != 1 else ''}: together they fetch batches slower than "
            "the step uses them.")


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
    saving, basis = _saving(trace, dl)
    workers = len(set(dl["worker"].tolist()) - {-1})  # the waits name the workers they met
    pinned = device_terms(trace.metadata).pinned_memory
    if workers:  # the loader has workers already: more of the same is no sure cure
        advice = (f"The loader's worker processes (the waits met {workers}) do not keep up, and "
                  "more of them help only while the machine has idle cores (each is a process "
                  "competing with the training loop): make each batch cheaper"
                  + (phase_advice or "; when the samples are already in memory (a "
                     "TensorDataset), index whole batches at once (a __getitem__ taking a list "
                     "of indices, with DataLoader(..., batch_size=None, "
                     "sampler=BatchSampler(...))) instead of fetching and stacking them one "
                     "by one") + ("; set pin_memory=True" if pinned else ""))
        basis += "; the saving assumes batches ready in time, which more workers may not give"
    else:
        advice = ("Load batches in parallel with the step: give your DataLoader "
                  + _workers_to_try(trace) + ", persistent_workers=True and prefetch_factor=2 "
                  "or more"
                  + (", pin_memory=True" if pinned else "") + phase_advice)
    return [make(
        trace, RULE_ID, "Steps wait for the data loader", saving, items,
        f"The {loop_name(trace)} spent {us(lost)} waiting for batches; the device has nothing to "
        "do while the host prepares data." + _worker_share(dl) + phase,
        advice + "; move heavy preprocessing (decoding, tokenisation, augmentation) offline or "
        "into the workers' Dataset code.", symptom_ns=lost, saving_basis=basis)]


SUGGESTED_WORKERS = 4  # where the machine has the cores for them


def _workers_to_try(trace: Trace) -> str:
    """How many workers to start with: four, or the cores of the machine the run was recorded
    on where it has fewer (each worker is a process: more of them than cores compete with the
    training loop; PyTorch's DataLoader warns past that count too)."""
    cpus = trace.metadata.get(META_HOST_CPUS)
    if not isinstance(cpus, int) or cpus <= 0 or cpus >= SUGGESTED_WORKERS:
        return f"num_workers={SUGGESTED_WORKERS} or more"
    return (f"num_workers={cpus} (the machine it ran on has {cpus} core"
            f"{'s' if cpus != 1 else ''}: more workers than cores compete with the training "
            "loop)")


def _saving(trace: Trace, waits: pd.DataFrame) -> tuple[float, str]:
    """What the steps would save if no step waited for its batch (workers that keep up):
    by replay where the trace allows, else the waits on the analysed steps' critical
    path."""
    from neuron_explorer.analyses.path_share import time_on_path
    from neuron_explorer.what_if.counterfactual import removal_saving_ns

    replayed = removal_saving_ns(trace, waits["id"].to_numpy(np.int64), RULE_ID)
    if replayed is not None:
        return replayed, ("replay: the run replayed without the waits for batches (workers "
                          "that keep up; a wait while the device still runs queued work "
                          "saves nothing)")
    ts = waits["ts"].to_numpy()
    return time_on_path(trace, ts, ts + waits["dur"].to_numpy(), "host"), (
        "critical path: the waits for batches where they set the steps' length (a wait "
        "while the device still runs queued work saves nothing)")
