"""Sync points inside the step: the host waits for the device (`.item()`, `.cpu()`, print)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.analyses.phases import in_analysed_work
from neuron_explorer.analyses.step_breakdown import counted_steps, host_slices
from neuron_explorer.common import trace_format as tf
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make, step_time, trains, us
from neuron_explorer.rules.host_device_copies import COPY_OPS
from neuron_explorer.tables import (
    ancestor_in,
    ancestor_of_kind,
    assign_steps,
    map_unique,
    op_named,
    slice_names,
    text,
)
from neuron_explorer.what_if.counterfactual import first_step_extra_ns, removal_saving_ns

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "sync_in_step"
# the ops that read a device value on the host (a PyTorch profiler's ops around a sync)
READ_OPS = COPY_OPS | {"aten::item", "aten::_local_scalar_dense", "aten::cpu",
                      "aten::tolist", "aten::is_nonzero"}
# copies to the host (Kineto's Memcpy DtoH, our copy_device_to_host)
TO_HOST = re.compile(r"dtoh|d2h|device_to_host", re.IGNORECASE)
# what torch's distributed wrappers name their own code (record_function): a sync in it
# with no module of the script's between is the wrapper's, as DDP's bucket rebuild in its
# first steps, and no line of the script removes it
WRAPPER_CODE = ("DistributedDataParallel.", "FullyShardedDataParallel.")


def check(trace: Trace) -> list[Finding]:
    hs = host_slices(trace)
    syncs = hs[hs["kind"] == "sync"]
    if len(trace.steps):  # the analysed steps' training work, as every finding counts
        syncs = syncs.assign(step=assign_steps(syncs["ts"].to_numpy(), trace.steps))
        syncs = in_analysed_work(trace, syncs[syncs["step"] >= 0])
    wrappers = _wrappers_own(trace, syncs["id"].to_numpy(np.int64))
    syncs = syncs[~wrappers]
    if not len(syncs):
        return []
    # What removing the syncs saves in the run as recorded: a host-bound run's host
    # reaches each sync about when the device finishes and waits little. (Once the host
    # launches faster, the device idle after each sync shrinks with it: the idle after
    # the syncs is no saving to promise for after that fix.)
    critical, symptom = _saving(trace, syncs)
    read = reads(trace, syncs)
    removed = np.r_[syncs["id"].to_numpy(np.int64), read, made_only_for(trace, read)]
    replayed = removal_saving_ns(trace, removed, RULE_ID)
    lost = critical if replayed is None else replayed
    if lost < th.SYNC_MIN_SHARE * step_time(trace):
        return []
    ids = syncs["id"].to_numpy()
    source = text(trace.slice_args.column(tf.ARG_SOURCE, ids))
    kind = text(trace.slice_args.column(tf.ARG_SYNC_KIND, ids))
    op = ancestor_of_kind(trace, ids, ("op",), outermost=True)
    names = slice_names(trace)
    where = np.array([s or (names[o] if o >= 0 else n)
                      for s, o, n in zip(source, op, syncs["name"].to_numpy(), strict=True)],
                     dtype=object)
    per_site = syncs.assign(site=where, what=[k or n for k, n in zip(
        kind, syncs["name"].to_numpy(), strict=True)]).groupby(["site", "what"])["dur"].agg(
        ["sum", "size"]).sort_values("sum", ascending=False, kind="stable")
    # the time beside each site is the host's wait, not the device idle counted as lost
    sites = [f"{what}{'' if site == what else f' at {site}'} ({n}x, the host waited "
             f"{us(total)})" for (site, what), (total, n) in per_site.iterrows()]
    # the longest waits, ties in time order (a stable sort, as sorting every item would give)
    longest = np.argsort(-syncs["dur"].to_numpy(), kind="stable")[: th.MAX_EVIDENCE]
    items = [evidence(r.ts, r.dur, [r.id], f"host waited {us(r.dur)} on the device: {w}")
             for r, w in zip(syncs.iloc[longest].itertuples(), where[longest], strict=True)]
    top_site = per_site.index[0][0]
    waited = float(syncs["dur"].sum())
    checks = _argument_checks(trace, ids, where)
    # every site the saving counts (the first few, by time): one named alone read as if
    # removing it saved the whole figure
    at = _sites_named([site for site in dict.fromkeys(s for s, _ in per_site.index)
                       if site not in checks] or list(checks))
    kept = "losses and metrics" if trains(trace) else "results"
    inside = "inside the step" if len(trace.steps) else "during the trace"
    looped = _in_a_loop(trace, source)
    if len(kind) and set(kind.tolist()) == {"synchronize"}:
        # nothing is read: the program waits for the device, to time its steps
        recommendation = (
            f"Remove {at}: a synchronize() each step reads nothing and only waits for the "
            "device, as code timing its steps does. This recording times every step and "
            "op already; where the script must time itself, synchronize once around N "
            "steps, not in each.")
    elif looped:
        recommendation = (
            f"These reads are a Python loop's ({looped}), each iteration reading a value "
            "on the host (a tensor used as an index or in a condition: `x[t[i]]`, "
            "`if t[i] > 0`): vectorise the loop (python_loop's finding; its saving holds "
            "these reads), indexing with tensors on the device (gather, masks, "
            "torch.where). Reading less often in the loop as it stands adds ops for each "
            "read it removes.")
    elif _inside_the_forward(trace, syncs):
        recommendation = (
            f"The reads at {', '.join(sorted(set(where.tolist()))[:SITES_NAMED])} happen "
            "inside the model's forward: control flow (an `if` on a tensor, a value in a "
            "condition) or logging on a device value. Make a branch branchless on the "
            "device (torch.where, torch.clamp: computed always, chosen on the device) and "
            "move logging out of the forward; under torch.compile each such read is also "
            "a graph break.")
    elif _one_read_per_request(trace, syncs):
        recommendation = (
            f"Each request's result is read once, as it completes ({top_site}): a server "
            "must answer, so keep that read"
            + ("; " + _nothing_to_hide(waited) + " serve requests in batches, one read per "
               "batch." if _no_wait(waited, lost) else
               ", and hide it instead: launch the next request's work before reading this one's "
               "result (the device then runs while the host reads), or serve requests in "
               "batches, one read per batch."))
    elif _one_read_per_step(trace, syncs):
        recommendation = (
            f"Each step reads its result ({top_site}). Where the results are used "
            f"later (offline inference), remove {at} from the step: keep them on the device "
            "and read them every N steps or after the loop. Where each must be returned as "
            "it completes (a server), keep that read"
            + ("; " + _nothing_to_hide(waited) + " batch requests, one read per batch"
               if _no_wait(waited, lost) else
               " and hide it: launch the next step's work before reading this one's result, or "
               "batch requests, one read per batch")
            + " (mark requests with neuron_explorer.request for their latency).")
    else:
        recommendation = (
            f"Remove {at}"
            # reading less often is the fix: kept on the device but read every step, a
            # loop's metric math saved nothing (-12 us a step of 174 claimed; read every
            # 8th step, 217-248 us)
            + (f" from the step: read {kept} (.item(), .cpu(), print) every N steps or "
               "after the loop, and keep them on the device in between "
               + _kept_how(trace) if len(trace.steps)
               else ": keep results on the device and read them once, after the work")
            + "; avoid data-dependent Python control flow on device values."
            + _deferred_math(trace, read, removed, replayed))
    if checks:
        others = set(where.tolist()) - set(checks)
        recommendation = (
            f"The reads at {', '.join(list(checks)[:SITES_NAMED])} are torch.distributions' "
            f"checks of their arguments ({', '.join(sorted(set(checks.values()))[:3])}), "
            "each a device value read on the host: construct the distributions with "
            "validate_args=False, or call torch.distributions.Distribution."
            "set_default_validate_args(False) once before the loop (torch.compile turns the "
            "checks off for the whole process)."
            + (" For the other reads: " + recommendation if others else ""))
    # the device had finished: the reads cost, not the waits (a title of waits beside sites
    # that waited 0 ns read as a contradiction)
    reads_cost = replayed is not None and float(syncs["dur"].sum()) < 0.5 * lost
    title = (f"Host reads device values {inside} ({len(syncs)} reads)" if reads_cost else
             f"Host waits on the device {inside} ({len(syncs)} syncs)")
    return [make(
        trace, RULE_ID, title, lost, items,
        "Each sync makes the host wait until the device has finished everything queued, then "
        "leaves the device idle while the host queues the next work. Sync sites: "
        + "; ".join(sites[:5]) + "."
        + (f" Left out: {_syncs(int(wrappers.sum()))} inside torch's distributed "
           "wrapper's own code (DistributedDataParallel's bucket rebuild in its first "
           "steps), which no line of the script removes." if wrappers.any() else "")
        + (" Most of the saving is the reads themselves (the copy to the host, and the ops "
           "that made what it read for it alone), not the waits: the device had finished."
           if reads_cost else ""),
        recommendation, symptom_ns=symptom,
        once_ns=0.0 if replayed is None else first_step_extra_ns(trace, RULE_ID),
        saving_basis=(
            "critical path: without a sync the host would have queued its next work as "
            "much earlier as it waited, so each sync costs the device idle after it or the "
            "host's wait at it, whichever is less" if replayed is None else
            "replay: the run replayed without the syncs and the reads that make them (the "
            "host's wait, the copy it waited for, and the ops that made what it read for "
            "that read only)"))]


def _argument_checks(trace: Trace, ids: np.ndarray, where: np.ndarray) -> dict[str, str]:
    """Sync sites whose reads torch.distributions makes, validating its arguments (a
    `Categorical(logits=...)`, a `log_prob`): site -> the torch function
    ("Categorical.__init__"). A policy's rollout was told to read its metrics every N
    steps at the lines that built its distribution."""
    within = text(trace.slice_args.column(tf.ARG_WITHIN, ids))
    found: dict[str, str] = {}
    for site, inside in zip(where.tolist(), within.tolist(), strict=True):
        if inside.startswith(_DISTRIBUTIONS) and site not in found:
            found[site] = inside.partition(" in ")[2]
    return found


_DISTRIBUTIONS = "torch/distributions/"


def _syncs(n: int) -> str:
    return f"{n} sync" + ("s" if n != 1 else "")


def _wrappers_own(trace: Trace, ids: np.ndarray) -> np.ndarray:
    """Which syncs a distributed wrapper makes in its own code: the nearest annotation or
    module around them is the wrapper's (`WRAPPER_CODE`), not a module of the script's.
    DDP's first-step syncs were named "at" the line calling the model, and after the
    script's own reads were gone still claimed 102 us a step."""
    holder = ancestor_of_kind(trace, ids, ("annotation", "module"))
    names = slice_names(trace)
    return np.array([h >= 0 and str(names[h]).startswith(WRAPPER_CODE) for h in holder.tolist()],
                    dtype=bool)


def _kept_how(trace: Trace) -> str:
    """How to keep what the step reads on the device until it is read."""
    if _math_at_read(trace):
        # a host-bound eager loop whose metrics a user accumulated on the device instead
        # ran 296 us a step slower (an op, a launch, per term); keeping the tensors and
        # reading them after the loop saved 992 us
        kept = "loss.detach(), the outputs" if trains(trace) else "the outputs"
        return (f"(the tensors themselves: {kept}, in a list; in this host-bound eager run, "
                "metric math moved onto the device costs a launch per op, more than the read "
                "it saves, so do that math when you read them)")
    return "(accumulate them into device tensors)"


def _math_at_read(trace: Trace) -> bool:
    """Whether the advice is to keep the tensors and do the metric math when reading them,
    after the loop (a host-bound eager run, where each op of that math costs a launch)."""
    from neuron_explorer.rules import host_bound

    return host_bound.is_host_bound(trace) and not host_bound.is_compiled(trace)


def _deferred_math(trace: Trace, read: np.ndarray, removed: np.ndarray,
                   replayed: float | None) -> str:
    """Where the advice defers metric math to the read after the loop (`_math_at_read`)
    and a read's own line computes on the device what only that read
    takes (`out.argmax(1).cpu() == y`: the argmax), what deferring that math too saves:
    the headline keeps it in the step, as keeping predictions on the device does, and a
    user who kept the outputs themselves and took the argmax after the loop saved 180 us
    a step against the 120 claimed."""
    if replayed is None or not _math_at_read(trace):
        return ""
    math = np.setdiff1d(made_only_for(trace, read, values_too=True), removed)
    if not len(math):
        return ""
    more = removal_saving_ns(trace, np.r_[removed, math], f"{RULE_ID}: its lines' math too")
    if more is None or more <= replayed:
        return ""
    ops = trace.ops
    names = sorted(set(ops.loc[ops["id"].isin(math), "name"].astype(str)))
    return (f" The reads' own lines also compute on the device what only they read "
            f"({', '.join(names[:3])}): keep the tensors those ops start from and run them "
            f"when you read, after the loop, and the run saves {us(more)} in all, "
            f"{us(more - replayed)} more than the headline, which keeps them in the step.")


def _in_a_loop(trace: Trace, sources: np.ndarray) -> str:
    """The lines of the Python loop over the batch (`python_loop`) that every sync site is
    in, as text; "" otherwise. A user told to read less often took the read out of a
    per-sample loss with `gather` and the step got 0.38 ms slower, where vectorising the
    loop saved 51 ms."""
    from neuron_explorer.rules.python_loop import loop_lines

    lines, _, _ = loop_lines(trace)
    if not lines or not len(sources) or not set(sources.tolist()) <= set(lines):
        return ""
    return ", ".join(sorted(set(sources.tolist())))


SITES_NAMED = 3  # the sync sites a recommendation names


def _sites_named(sites: list[str]) -> str:
    """'the sync at A', 'the syncs at A, B and C (and 2 more)'."""
    shown = sites[:SITES_NAMED]
    listed = shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " and " + shown[-1]
    more = len(sites) - len(shown)
    return (("the sync at " if len(sites) == 1 else "the syncs at ") + listed
            + (f" (and {more} more)" if more else ""))


def _inside_the_forward(trace: Trace, syncs: pd.DataFrame) -> bool:
    """Whether every sync is inside a module's forward call: the model's own control flow
    on a device value, which "read results every N steps or after the loop" does not
    describe (a user's `if h.std() > 2.0` per layer was told to read its results after
    the loop)."""
    ids = syncs["id"].to_numpy()
    return bool(len(ids)) and bool((ancestor_of_kind(trace, ids, (tf.CAT_MODULE,)) >= 0).all())


# an inference step's reads of its result: its parts (a label and its score), at one line
RESULT_READS = 4


def _one_read_per_step(trace: Trace, syncs: pd.DataFrame) -> bool:
    """Whether an inference run's syncs are each step's reads of its result: at most a few
    a step, at one line. Told to read after the loop, a server would hold every answer to
    the end (a user's requests, each answered with `int(p.argmax()), float(p.max())`, were
    told so: the steps looked shorter, and the last answer came no sooner)."""
    if trains(trace) or not len(trace.steps):
        return False
    ids = syncs["id"].to_numpy()
    sources = set(text(trace.slice_args.column(tf.ARG_SOURCE, ids)))
    # a result is read after the model returns it: a read inside its forward (a branch on
    # a device value) is the model's control flow, which once read as the step's answer
    outside = bool((ancestor_of_kind(trace, ids, (tf.CAT_MODULE,)) < 0).all())
    return (outside and len(syncs) <= RESULT_READS * counted_steps(trace)
            and len(sources) <= 1)


def _one_read_per_request(trace: Trace, syncs: pd.DataFrame) -> bool:
    """Whether the syncs are requests' answers: the trace marks requests
    (`neuron_explorer.request`) and none of them holds more than one sync. Advice to read
    after the loop would hold every answer to the end."""
    from neuron_explorer.analyses.requests import request_marks

    marks = request_marks(trace)
    if not marks:
        return False
    ts = np.sort(syncs["ts"].to_numpy(np.int64))
    starts, ends = np.array([[a, b] for a, b, _ in marks], np.int64).T
    inside = np.searchsorted(ts, ends, side="left") - np.searchsorted(ts, starts, side="left")
    return bool((inside <= 1).all())


def reads(trace: Trace, syncs: pd.DataFrame) -> np.ndarray:
    """The op slices that made the host read the device at each sync, as removing the
    sync removes them too: the outermost read op the sync ran inside (a PyTorch
    profiler's aten::item around its copy and wait), else the device-to-host copy just
    before it on its thread (our recordings: the copy's op, then the wait)."""
    ids = syncs["id"].to_numpy(np.int64)
    # the read ops around it, never a module's op around them all (a profiler's forward)
    around = ancestor_in(trace, ids, op_named(trace, READ_OPS), outermost=True)
    k = trace.kernels
    to_host = map_unique(k["name"], lambda n: bool(TO_HOST.search(str(n))), bool)
    launched = np.unique(k["op_slice_id"].to_numpy(np.int64)[to_host])
    s = trace.table("slices")
    reading = s.iloc[launched[launched >= 0]].sort_values("ts", kind="stable")
    before = np.full(len(ids), -1, np.int64)
    for track, rows in reading.groupby("track_id"):
        mine = np.flatnonzero(syncs["track_id"].to_numpy() == track)
        ends = (rows["ts"] + rows["dur"]).to_numpy(np.int64)
        at = np.searchsorted(ends, syncs["ts"].to_numpy(np.int64)[mine], side="right") - 1
        before[mine[at >= 0]] = rows["id"].to_numpy(np.int64)[at[at >= 0]]
    same_parent = (before >= 0) & (s["parent_id"].to_numpy()[np.maximum(before, 0)]
                                   == s["parent_id"].to_numpy()[ids])
    found = np.where(around >= 0, around, np.where(same_parent, before, -1))
    return np.unique(found[found >= 0])


def made_only_for(trace: Trace, read: np.ndarray, values_too: bool = False) -> np.ndarray:
    """The op slices called on the line of a check in `read` (a read of a flag, a bool
    tensor: `if`, `while`, `bool()`), outside any module, whose results nothing recorded
    reads but that check (and the ops found so, in turn): the check removed takes them
    with it (`bool(torch.isfinite(out).all())`: `isfinite`'s ops and `all`, where the
    read alone was replayed; a decoder's end-of-text check was promised 62 us a step
    where removing it saved 136). A read of a value (a loss, a metric, predictions) is
    kept on the device by its fix, and what computes the value stays (predictions'
    argmax read by `.cpu()` each step were promised twice what keeping them on the device
    saved); only its views made on the line for the read go (`nxt.flatten().tolist()`:
    the flatten, 12 us of a decode step's 74 saved). What an earlier line or a module made
    stays too: a loss read by `.item()` is still computed for its backward, an eval's
    forward for its loss. `values_too`: a value's math on the read's line goes with it
    as a check's does (`_deferred_math`). Our recordings' data flow (`producers`) and
    sources say it; other traces: none."""
    from neuron_explorer.what_if.compiled import recorded_data_flow

    ops = trace.ops
    if not len(read) or not len(ops):
        return np.zeros(0, np.int64)
    ops = ops.reset_index(drop=True)
    flow = recorded_data_flow(trace, ops)
    if flow is None:
        return np.zeros(0, np.int64)
    producers, readers = flow
    ids = ops["id"].to_numpy(np.int64)
    module = ops["module"].fillna("").astype(str).to_numpy(object)
    # the line's own calls, not a model's it calls (an eval loss's whole forward): a
    # producer is of the read's line and module
    source = ops["source"].fillna("").astype(str).to_numpy(object)
    source = np.where(source == "", "", source + "\0" + module)
    flags = map_unique(ops["dtypes"], lambda d: str(d).strip("[]") == "bool", bool)
    # a read inside a module's forward is its control flow (an early exit's
    # `delta.norm().item() < eps`), whatever it reads: its fix takes what the line made
    # for it (the norm's op stayed, and 372 us was claimed where 744 went)
    checks = flags | (module != "") | values_too
    gone = {int(r): str(source[r]) for r in np.flatnonzero(np.isin(ids, read) & checks)}
    todo = list(gone)
    while todo:
        row = todo.pop()
        for p in producers[row]:
            if (p >= 0 and p not in gone and source[p] and source[p] == gone[row]
                    and readers.get(p, set()) <= gone.keys()):
                gone[p] = gone[row]
                todo.append(p)
    gone.update(_views_for(ops, source, np.flatnonzero(np.isin(ids, read))))
    read_ids = set(read.tolist())
    made = np.array([r for r in gone if ids[r] not in read_ids], np.int64)
    return ids[made] if len(made) else np.zeros(0, np.int64)


def _views_for(ops: pd.DataFrame, source: np.ndarray, rows: np.ndarray) -> dict[int, str]:
    """The ops of no device work (views: a `flatten`, a `view`) on each read's line just
    before it on its thread, made for the read (the recorded data flow links a read to the
    op that made its storage, not to the views of it)."""
    kernels, track = ops["kernel_count"].to_numpy(), ops["track_id"].to_numpy()
    out: dict[int, str] = {}
    for row in rows.tolist():
        before = row - 1
        while (before >= 0 and kernels[before] == 0 and track[before] == track[row]
               and source[before] and source[before] == source[row]):
            out[before] = str(source[row])
            before -= 1
    return out


def _saving(trace: Trace, syncs) -> tuple[float, float]:
    """(what removing the syncs would save, the device idle after them). After a sync
    the device idles while the host does its post-sync work and launches again (the
    symptom); without the sync the host would have been there as much earlier as it
    waited, so each sync costs min(idle after it, the host's wait at it). Traces without
    device kernels: the waits themselves."""
    idle = trace.idle_reasons()
    if not len(trace.kernels) or not len(idle):
        waits = float(syncs["dur"].sum())
        return waits, waits
    gaps = idle[idle["reason"] == "sync"]
    if len(trace.steps):
        gaps = in_analysed_work(trace, gaps[gaps["step"] >= 0])
    if not len(gaps):
        return 0.0, 0.0
    ordered = syncs.sort_values("ts")
    ends = (ordered["ts"] + ordered["dur"]).to_numpy(np.int64)
    waits = ordered["dur"].to_numpy(np.int64)
    gap_end = (gaps["ts"] + gaps["dur"]).to_numpy(np.int64)
    # the sync that caused each gap: the last one to end by the gap's end
    cause = np.searchsorted(ends, gap_end, side="right") - 1
    wait = np.where(cause >= 0, waits[np.maximum(cause, 0)], 0)
    gap = gaps["dur"].to_numpy(np.int64)
    return float(np.minimum(gap, wait).sum()), float(gap.sum())


def _no_wait(waited: float, lost: float) -> bool:
    """Whether the host hardly waited at its reads (the device had finished): the time is
    the reads themselves, which launching the next work first does not hide."""
    return waited < 0.1 * lost


def _nothing_to_hide(waited: float) -> str:
    """The advice for a read a server keeps when the host did not wait at it (a trial hid
    such a read behind the next request's launch, as told, and saved nothing)."""
    return (f"the host waited {us(waited)} on the device at it in all, so launching the next "
            "work first hides nothing (the time is the read itself: its copy and the ops "
            "that made what it reads); to read less often,")
