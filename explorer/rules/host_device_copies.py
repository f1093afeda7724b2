"""Host<->device copies in every step (inputs re-uploaded, results pulled back)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.analyses.phases import in_analysed_work
from neuron_explorer.analyses.steady_state import in_analysed_steps
from neuron_explorer.common import trace_format as tf
from neuron_explorer.device_terms import device_terms
from neuron_explorer.memo import memoised
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import (
    Finding,
    evidence,
    make,
    step_name,
    step_time,
    top,
    us,
)
from neuron_explorer.tables import (
    ancestor_in,
    assign_steps,
    flag,
    kernel_launches,
    map_unique,
    op_named,
    text,
)

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "host_device_copies"
# copies of one dtype a step from which the advice is to batch them into one: the fix's
# split costs an op, so two or three save little
MANY_PER_STEP = 4
COPY_OPS = {"aten::_copy_from", "aten::_to_copy", "aten::copy_", "aten::to"}
TO_HOST_COPY = re.compile(r"dtoh|d2h|device_to_host", re.IGNORECASE)
CROSSING = re.compile(r"htod|dtoh|h2d|d2h|host_to_device|device_to_host|to_host|to_device",
                      re.IGNORECASE)


def copies(trace: Trace) -> pd.DataFrame:
    """Copies between host and device: ts, dur, id, step, name."""
    parts = []
    k = trace.kernels
    if len(k):
        crossing = map_unique(k["name"], lambda n: bool(CROSSING.search(str(n))), bool)
        dtod = map_unique(k["name"], lambda n: "dtod" in str(n).lower(), bool)
        kc = k[((k["kind"].to_numpy() == "memcpy") | crossing) & ~dtod]
        parts.append(kc[["ts", "dur", "id", "step", "name"]].assign(step=_issued_in(trace, kc)))
    ops = trace.ops
    if len(ops) and not trace.metadata.get(tf.META_HOST_OPS):
        # An op that launched a kernel is judged by its kernel above (a dtype cast on the
        # device is an aten::_to_copy too); only copies with no kernel are judged by name,
        # where every op is one dispatched to the device (where ops include the host's, as
        # a PyTorch profiler's do, a copy that launched nothing copied on the host).
        oc = ops[ops["name"].isin(COPY_OPS) & (ops["kernel_id"].to_numpy() < 0)]
        direction = text(trace.slice_args.column("direction", oc["id"].to_numpy()))
        oc = oc[direction != "device_to_device"]
        dur = np.maximum(oc["dur"].to_numpy(), oc["device_dur"].to_numpy())
        parts.append(pd.DataFrame({"ts": oc["ts"].to_numpy(), "dur": dur, "id": oc["id"].to_numpy(),
                                   "step": oc["step"].to_numpy(), "name": oc["name"].to_numpy()}))
    if not parts:
        return pd.DataFrame(columns=["ts", "dur", "id", "step", "name"])
    return pd.concat(parts, ignore_index=True)


def _issued_in(trace: Trace, kc: pd.DataFrame) -> np.ndarray:
    """The step of each transfer kernel: the one recorded, but none where the op that
    issued it ran outside every step. Device work issued before the first step began
    carries step 0: the setup before the loop (model.to(device), the first batch's upload)
    would count as the first step's copies, where the host's ops (`trace.ops`) are in no
    step, and a run with eval passes left it out (step 0's training part starts after it)."""
    step = kc["step"].to_numpy(np.int64).copy()
    op = kc["op_slice_id"].to_numpy(np.int64)
    if not len(trace.steps) or not (op >= 0).any():
        return step
    issued = trace.table("slices")["ts"].to_numpy(np.int64)[op[op >= 0]]
    outside = np.zeros(len(step), bool)
    outside[op >= 0] = assign_steps(issued, trace.steps) < 0
    step[outside] = -1
    return step


def copy_ops(trace: Trace, c: pd.DataFrame) -> np.ndarray:
    """The slices that issued the copies `c` (rows of `copies`), those with none left out
    (`issuers`)."""
    ops = issuers(trace, c)
    return ops[ops >= 0]


def issuers(trace: Trace, c: pd.DataFrame) -> np.ndarray:
    """Per row of `c` (rows of `copies`), the slice that issued the copy (-1: none known):
    a transfer kernel's launching op in our recordings; in other traces the outermost copy
    op around the runtime call that launched it (aten::to around aten::copy_ around
    cudaMemcpyAsync), else the call itself, and never the module op around them all; a
    copy op that launched nothing is its own."""
    k = trace.kernels
    out = c["id"].to_numpy(np.int64).copy()
    if not len(k):
        return out
    on_device = c["id"].isin(k["id"]).to_numpy()
    row = pd.Series(np.arange(len(k)), index=k["id"]).reindex(c.loc[on_device, "id"]).to_numpy()
    launcher = kernel_launches(trace)[row]
    if not device_terms(trace.metadata).recorded_here:
        around = ancestor_in(trace, np.maximum(launcher, 0), op_named(trace, COPY_OPS),
                             outermost=True)
        launcher = np.where((launcher >= 0) & (around >= 0), around, launcher)
    out[on_device] = launcher
    return out


def check(trace: Trace) -> list[Finding]:
    """The finding, once per trace (`host_bound` leads with it where the copies are most
    of what the host launches)."""
    return memoised(trace, RULE_ID, lambda: _check(trace))


def analysed_copies(trace: Trace) -> pd.DataFrame:
    """The copies (`copies`) of the analysed steps' work that a fix of the copies removes:
    in our recordings every read to the host is a sync, and sync_in_step's (whose fix
    removes it: here, batched with the uploads into one `.to(device)`, four uploads and a
    loss's `.item()` a step were promised 35% more than batching saved)."""
    c = copies(trace)
    if not len(c) or not len(trace.steps):
        return c.iloc[:0]
    c = in_analysed_work(trace, c[c["step"] >= 0])
    if device_terms(trace.metadata).recorded_here:
        c = c[~c["name"].astype(str).str.contains(TO_HOST_COPY)]
    return c


def _check(trace: Trace) -> list[Finding]:
    c = analysed_copies(trace)
    if not len(c):
        return []
    steps = in_analysed_steps(trace, trace.steps)
    steps_with = c["step"].nunique()
    lost = float(c["dur"].sum())
    if steps_with < th.COPY_MIN_STEP_FRACTION * len(steps) or not len(c):
        return []
    issued = issuers(trace, c)
    constant = _constant(trace, issued)
    cycling = _cycling_sites(trace)
    # the copies of a pool kept on the device: their data is a constant, indexed there
    pooled = np.isin(_sources(trace, issued), list(cycling))
    constant &= ~pooled
    per_step = batched_per_step(trace, c, issued, constant | pooled)
    batched = per_step >= MANY_PER_STEP
    # tiny transfers can cost their host far more than the link: the saving is the share
    # (copies of data new every step that the device waits on little save nothing)
    saving, basis = _saving(trace, c, issued, constant, pooled, batched)
    if saving < th.COPY_MIN_SHARE * step_time(trace):
        return []
    items = [evidence(r.ts, r.dur, [r.id], f"{r.name}: {us(r.dur)}")
             for r in top(c, "dur").itertuples()]
    terms = device_terms(trace.metadata)
    first = "".join(
        f"The data uploaded at {site} cycles through {n} host tensors ({size / 2**20:.1f} "
        "MiB), each uploaded again unchanged once the cycle comes round: keep them on the "
        "device, uploaded once before the loop, and index them there. "
        for site, (n, size) in cycling.items())
    if constant.any():
        sites = pd.Series(_sources(trace, issued)[constant])
        sites = [str(x) for x in sites[sites != ""].value_counts().index[:3]]
        first += (f"Move the host tensors uploaded again unchanged ({constant.sum()} of the "
                  f"{len(c)} copies{', at ' + ', '.join(sites) if sites else ''}) to the "
                  "device once, before the loop. ")
    if batched and not (constant | pooled).all():
        first += (f"Move each step's small tensors of one dtype in one copy ({per_step:.0f} "
                  "copies of one dtype a step here: torch.cat or torch.stack them on the "
                  "host, one .to(device), then one split or unbind on the device). ")
    return [make(
        trace, RULE_ID,
        f"Host<->device copies in {steps_with} of {len(steps)} steps ({len(c)} copies)", saving,
        items,
        f"Data crosses between host and device in the {_steps_named(trace)}"
        + _copy_sites(_sources(trace, issued)) + ". Each copy costs "
        "transfer time over the host link, an op the host dispatches, and usually a sync that "
        "stalls the host.",
        f"{first}Create tensors directly on the device (torch.zeros(..., device='{terms.name}')), "
        "move the model and constant tensors to the device once before the loop, prefetch "
        "batches to the device asynchronously"
        + (" (DataLoader pin_memory=True, then .to(device, non_blocking=True))"
           if terms.pinned_memory else "")
        + ", and keep metrics on the device instead of calling .cpu().",
        symptom_ns=lost, saving_basis=basis)]


def _steps_named(trace: Trace) -> str:
    """What the copies happen in: an inference loop's step is the code from one forward
    call's return to the next's, the copy before the call included ("inside the forward
    call" named a place the copy was not)."""
    name = step_name(trace)
    return "loop's iterations" if name == "forward call" else f"{name}s"


def _copy_sites(sources: np.ndarray) -> str:
    """The lines issuing the copies, most copies first (" at a.py:3 (9x), b.py:5 (2x)")."""
    named = pd.Series(sources[sources != ""]).value_counts()
    if not len(named):
        return ""
    return " at " + ", ".join(f"{site} ({n}x)" for site, n in named.iloc[:3].items())


# a pool of host tensors a site cycles through is advised onto the device up to this
# share of its memory
CYCLE_MAX_MEMORY_SHARE = 0.25


def _sources(trace: Trace, issued: np.ndarray) -> np.ndarray:
    """Each copy's issuing op's `source` line ("" where unknown)."""
    out = np.full(len(issued), "", dtype=object)
    known = issued >= 0
    out[known] = text(trace.slice_args.column(tf.ARG_SOURCE, issued[known]))
    return out


def _cycling_sites(trace: Trace) -> dict[str, tuple[int, int]]:
    """Sites whose uploads cycle through a pool of host tensors: after its first upload of
    a tensor uploaded before, every later one is too (`X[step % 8].to(device)`), and the
    pool (two or more uploads before it) fits in a quarter of the device's memory. Per
    site, the pool's tensors and bytes. Counted as uploaded again only where the cycle came
    round, the 4 of 22 copies claimed 205 us where keeping the pool on the device saved
    443. The cycle is read over every recorded step: a second epoch's batches, all analysed
    steps, read as constants, and the indexing op each still costs was left out (1.24x)."""
    from neuron_explorer.rules.memory_near_capacity import capacity

    c = copies(trace)
    c = c[c["step"].to_numpy() >= 0] if len(c) else c
    if device_terms(trace.metadata).recorded_here and len(c):
        c = c[~c["name"].astype(str).str.contains(TO_HOST_COPY)]
    if not len(c):
        return {}
    issued = issuers(trace, c)
    constant = _constant(trace, issued)
    k = trace.kernels
    nbytes = (k.set_index("id")["bytes"].reindex(c["id"].to_numpy()).fillna(0).to_numpy()
              if len(k) else np.zeros(len(c)))
    room = (capacity(trace) or 0) * CYCLE_MAX_MEMORY_SHARE
    sources = _sources(trace, issued)
    out: dict[str, tuple[int, int]] = {}
    for site in {s for s, same in zip(sources, constant, strict=True) if s and same}:
        rows = np.flatnonzero(sources == site)  # in time order
        again = constant[rows]
        first = int(np.argmax(again))
        pool = float(nbytes[rows[:first]].sum())
        if first >= 2 and again[first:].all() and 0 < pool <= room:
            out[site] = (first, int(pool))
    return out


def _constant(trace: Trace, issued: np.ndarray) -> np.ndarray:
    """Per copy, whether it uploads a host tensor uploaded before unchanged (our
    recordings say so on the copy's op), at a line whose every upload is so once one is
    (a constant, or a pool come round): a DataLoader's small label batches that repeat by
    chance, 11 of 32, were told to move to the device before the loop."""
    out = np.zeros(len(issued), bool)
    known = issued >= 0
    out[known] = flag(trace.slice_args.column(tf.ARG_SAME_HOST_TENSOR, issued[known]))
    sources = _sources(trace, issued)
    for site in {s for s, same in zip(sources, out, strict=True) if s and same}:
        rows = np.flatnonzero(sources == site)
        again = out[rows]
        if not again[int(np.argmax(again)):].all():
            out[rows] = False
    return out


def _removed(trace: Trace, c: pd.DataFrame, issued: np.ndarray, constant: np.ndarray,
             pooled: np.ndarray, batched: bool
             ) -> tuple[np.ndarray, dict[int, int], tuple[np.ndarray, np.ndarray], str, float]:
    """The slices the advised fixes remove, and how the replay's basis says so. A constant
    is uploaded once before the loop: its copy goes. Data new every step still crosses:
    batched into one copy a step, all but one copy's op go; otherwise (created on the
    device, prefetched) the transfer goes and the op that issues it stays. Traces from
    elsewhere: the copies' ops go (a PyTorch profiler's blocking copy holds the host).
    Also the kernels (rows of `trace.kernels`) that run longer: a batched copy's transfer
    moves the bytes of all of its pieces. A pool's copy becomes an op indexing the pool
    on the device: its transfer and its op's own host time go, the Python calling it stays
    (the host time cut, as (starts, ends)). Last, the host time the splits add beyond the
    kept copies' own (a cut cannot add it)."""
    none = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    if not device_terms(trace.metadata).recorded_here:
        # whether a copy's data is a constant the trace does not say: the most, moving
        # every one to the device once, is what the replay states
        return issued[issued >= 0], {}, none, (
            "the run replayed without these copies' ops (what uploading them once before "
            "the loop saves; data new every step, pinned and copied asynchronously, "
            "saves less: its op stays)"), 0.0
    fresh = ~constant & ~pooled & (issued >= 0)
    parts, says = [issued[constant]], []
    lengths: dict[int, int] = {}
    added = 0.0
    if constant.any():
        says.append("the host tensors uploaded again unchanged uploaded once before the loop")
    k = trace.kernels
    transfer = c["id"].isin(k["id"]).to_numpy() if len(k) else np.zeros(len(c), bool)
    cut = none
    if pooled.any():
        parts.append(c["id"].to_numpy(np.int64)[pooled & transfer])
        ops = issued[pooled & (issued >= 0)]
        s = trace.table("slices")
        start = s["ts"].to_numpy(np.int64)[ops]
        cut = (start, start + s["dur"].to_numpy(np.int64)[ops])
        says.append("the pools of host tensors cycled through kept on the device (each copy "
                    "an op indexing the pool there: its transfer and the copy's own host "
                    "time gone, the Python calling it kept)")
    if fresh.any() and batched:
        # per step and dtype, one copy moves them all and one op (a split or unbind on the
        # device) hands out the pieces: the third copy's op on is gone, the second's stays
        # for the split, its transfer gone
        rows = np.flatnonzero(fresh)
        group = pd.Series(list(zip(c["step"].to_numpy()[rows].tolist(),
                                   _issued_as(trace, issued[rows], "dtypes"), strict=True)))
        nth = group.groupby(group).cumcount().to_numpy()  # rows are in time order
        parts += [issued[rows[nth >= 2]], c["id"].to_numpy(np.int64)[rows[(nth == 1)
                                                                         & transfer[rows]]]]
        lengths = _batched_transfers(trace, c, rows[transfer[rows]],
                                     group[transfer[rows]].to_numpy())
        splits = _split_ops(group, _issued_as(trace, issued[rows], "shapes"))
        cut, added = _split_cut(trace, issued[rows[nth == 1]], splits[nth == 1], cut)
        says.append("each step's copies of one dtype batched into one (the others' ops gone, "
                    "one kept as the split that hands out the pieces: a select each, and a "
                    "slice and a view for each shape where they differ)")
    elif fresh.any():
        parts += [c["id"].to_numpy(np.int64)[fresh & transfer], issued[fresh & ~transfer]]
        says.append("the data new every step no longer crossing the link (the ops that "
                    "issue it stay: created on the device or prefetched, it still costs "
                    "an op)")
    return (np.concatenate(parts).astype(np.int64), lengths, cut,
            "the run replayed with " + "; ".join(says), added)


def _split_ops(group: pd.Series, shapes: list[str]) -> np.ndarray:
    """Per copy, the view ops that split its batch (step and dtype) into its pieces: a
    select per piece (`torch.stack(pieces).to(device).unbind(0)`: the unbind records its
    selects); pieces of several shapes share a flat buffer, so each shape also takes a
    slice and a view of it (`buffer[a:b].view(n, *shape).unbind(0)`). A view a piece (8
    for 8 pieces) was counted where two trials' inputs and labels batched took 12 (claimed
    372 us a step where batching saved 290, twice)."""
    frame = pd.DataFrame({"group": group.to_numpy(), "shape": shapes})
    per_group = frame.groupby("group", sort=False).agg(pieces=("shape", "size"),
                                                       kinds=("shape", "nunique"))
    kinds = per_group["kinds"].to_numpy()
    ops = per_group["pieces"] + np.where(kinds > 1, 2 * kinds, 0)
    return ops.reindex(frame["group"]).to_numpy()


def _split_cut(trace: Trace, kept: np.ndarray, pieces: np.ndarray,
               cut: tuple[np.ndarray, np.ndarray]
               ) -> tuple[tuple[np.ndarray, np.ndarray], float]:
    """`cut` with the host time of each kept copy op (it stands for the split) cut down to
    what a split into its group's pieces costs: `pieces` view ops, at what the recording's
    ops that launch nothing took on the host (kept whole, a trial's six copies batched
    into two were claimed 0.63x what batching saved); and the host time the views take
    beyond the kept op's own."""
    from neuron_explorer.what_if.counterfactual import op_host_ns

    ops = trace.ops
    views = ops.loc[ops["kernel_count"] == 0, "id"].to_numpy(np.int64)
    if not len(kept) or not len(views):
        return cut, 0.0
    view_ns = float(np.median(op_host_ns(trace, views)))
    s = trace.table("slices")
    ts, dur = s["ts"].to_numpy(np.int64)[kept], s["dur"].to_numpy(np.int64)[kept]
    before = op_host_ns(trace, kept) - dur  # the host's time since the op before it
    split = pieces * view_ns - before
    own = np.clip(split, 0, dur).astype(np.int64)
    return ((np.r_[cut[0], ts + own].astype(np.int64), np.r_[cut[1], ts + dur].astype(np.int64)),
            float(np.maximum(split - dur, 0).sum()))


def _batched_transfers(trace: Trace, c: pd.DataFrame, rows: np.ndarray,
                       group: np.ndarray) -> dict[int, int]:
    """Each batch's first transfer (a row of `trace.kernels`) as long as all of its
    pieces' transfers together, the rows of `c` in `rows` grouped by `group`."""
    k = trace.kernels
    row_of = pd.Series(np.arange(len(k)), index=k["id"].to_numpy(np.int64))
    kernel_rows = row_of.reindex(c["id"].to_numpy(np.int64)[rows]).to_numpy()
    dur = c["dur"].to_numpy(np.int64)[rows]
    frame = pd.DataFrame({"group": list(group), "row": kernel_rows, "dur": dur})
    batches = frame.groupby("group", sort=False).agg(row=("row", "first"), dur=("dur", "sum"))
    return {int(r): int(d) for r, d in zip(batches["row"], batches["dur"], strict=True)}


def _issued_as(trace: Trace, issued: np.ndarray, column: str) -> list[str]:
    """Each copy's `column` of its issuing op (its `dtypes`, its `shapes`; "" where
    unknown)."""
    ops = trace.ops
    known = ops.set_index("id")[column] if column in ops else pd.Series(dtype=object)
    return [str(d) if isinstance(d, str) else "" for d in known.reindex(issued).tolist()]


def batched_per_step(trace: Trace, c: pd.DataFrame, issued: np.ndarray,
                     constant: np.ndarray) -> float:
    """The copies of data new every step that one copy a step could move: the median over
    steps of the largest group of one dtype (copies of other dtypes need a cast on the
    device besides the split)."""
    fresh = ~constant & (issued >= 0)
    if not fresh.any():
        return 0.0
    groups = pd.DataFrame({"step": c["step"].to_numpy()[fresh],
                           "dtype": _issued_as(trace, issued[fresh], "dtypes")})
    return float(groups.groupby(["step", "dtype"]).size().groupby(level=0).max().median())


def _saving(trace: Trace, c: pd.DataFrame, issued: np.ndarray, constant: np.ndarray,
            pooled: np.ndarray, batched: bool) -> tuple[float, str]:
    """What the steps would save with the advised fixes (`_removed`): by replay where the
    trace allows, else the copies' time on the critical path."""
    from neuron_explorer.analyses.path_share import time_on_path
    from neuron_explorer.what_if.counterfactual import removal_saving_ns

    k = trace.kernels
    on_device = c["id"].isin(k["id"]) if len(k) else np.zeros(len(c), bool)
    op_ids = np.r_[k.set_index("id").loc[c.loc[on_device, "id"], "op_slice_id"].to_numpy(),
                   c.loc[~on_device, "id"].to_numpy()] if len(k) else c["id"].to_numpy()
    removed, lengths, cut, says, added = _removed(trace, c, issued, constant, pooled, batched)
    replayed = removal_saving_ns(trace, removed, f"{RULE_ID}:{says}", lengths,
                                 cut if len(cut[0]) else None)
    if replayed is not None:
        # the splits' host time past the kept ops': a host-bound step pays it in full
        from neuron_explorer.rules.host_bound import is_host_bound

        if added and is_host_bound(trace):
            replayed = max(replayed - added, 0.0)
        return replayed, f"replay: {says}"
    end = (c["ts"] + c["dur"]).to_numpy()
    device = c[on_device]
    s = trace.table("slices")
    tracks = s["track_id"].to_numpy()[device["id"].to_numpy(np.int64)]
    # in our recordings a copy that launched a transfer costs its host its op too (the
    # dispatch, a compiled run's eager upload between graphs): where a host-bound step
    # spends it (a PyTorch profiler's copy op holds its sync's wait as well: not counted)
    launched = op_ids[:int(on_device.sum())]
    if not device_terms(trace.metadata).recorded_here:
        launched = launched[:0]
    launched = launched[launched >= 0].astype(np.int64)
    host_ts = np.r_[s["ts"].to_numpy(np.int64)[launched], c.loc[~on_device, "ts"].to_numpy()]
    host_end = np.r_[host_ts[:len(launched)] + s["dur"].to_numpy(np.int64)[launched],
                     end[~on_device]]
    saved = (time_on_path(trace, device["ts"].to_numpy(), end[on_device], "device",
                          set(tracks.tolist()))
             + time_on_path(trace, host_ts, host_end, "host"))
    return saved, ("critical path: the copies' time where they set the steps' length (on "
                   "the device, and on the host the ops that issue them)")
