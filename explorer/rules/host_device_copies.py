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
    kernel_launches,
    map_unique,
    op_named,
    text,
)

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "host_device_copies"
# copies a step from which the advice is to batch them into one
MANY_PER_STEP = 4
COPY_OPS = {"aten::_copy_from", "aten::_to_copy", "aten::copy_", "aten::to"}
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
    """The slices that issued the copies `c` (rows of `copies`): a transfer kernel's
    launching op in our recordings; in other traces the outermost copy op around the
    runtime call that launched it (aten::to around aten::copy_ around cudaMemcpyAsync),
    else the call itself, and never the module op around them all (those with none left
    out); a copy op that launched nothing itself."""
    k = trace.kernels
    if not len(k):
        return c["id"].to_numpy(np.int64)
    on_device = c["id"].isin(k["id"]).to_numpy()
    row = pd.Series(np.arange(len(k)), index=k["id"]).reindex(c.loc[on_device, "id"]).to_numpy()
    launcher = kernel_launches(trace)[row]
    if not device_terms(trace.metadata).recorded_here:
        around = ancestor_in(trace, np.maximum(launcher, 0), op_named(trace, COPY_OPS),
                             outermost=True)
        launcher = np.where((launcher >= 0) & (around >= 0), around, launcher)
    ops = np.r_[launcher, c.loc[~on_device, "id"].to_numpy()]
    return ops[ops >= 0].astype(np.int64)


def check(trace: Trace) -> list[Finding]:
    steps = trace.steps
    c = copies(trace)
    if not len(c) or not len(steps):
        return []
    c = in_analysed_work(trace, c[c["step"] >= 0])
    steps = in_analysed_steps(trace, steps)
    steps_with = c["step"].nunique()
    lost = float(c["dur"].sum())
    if steps_with < th.COPY_MIN_STEP_FRACTION * len(steps) or not len(c):
        return []
    # tiny transfers can cost their host far more than the link: either may be the share
    saving, basis = _saving(trace, c)
    if max(lost, saving) < th.COPY_MIN_SHARE * step_time(trace):
        return []
    items = [evidence(r.ts, r.dur, [r.id], f"{r.name}: {us(r.dur)}")
             for r in top(c, "dur").itertuples()]
    terms = device_terms(trace.metadata)
    per_step = len(c) / max(steps_with, 1)
    batch = (f"Move each step's small tensors in one copy ({per_step:.0f} copies a step here: "
             "torch.cat or torch.stack them on the host, then one .to(device)). "
             if per_step >= MANY_PER_STEP else "")
    return [make(
        trace, RULE_ID,
        f"Host<->device copies in {steps_with} of {len(steps)} steps ({len(c)} copies)", saving,
        items,
        f"Data crosses between host and device inside the {step_name(trace)}. Each copy costs "
        "transfer time over the host link, an op the host dispatches, and usually a sync that "
        "stalls the host.",
        f"{batch}Create tensors directly on the device (torch.zeros(..., device='{terms.name}')), "
        "move the model and constant tensors to the device once before the loop, prefetch "
        "batches to the device asynchronously"
        + (" (DataLoader pin_memory=True, then .to(device, non_blocking=True))"
           if terms.pinned_memory else "")
        + ", and keep metrics on the device instead of calling .cpu().",
        symptom_ns=lost, saving_basis=basis)]


def _saving(trace: Trace, c: pd.DataFrame) -> tuple[float, str]:
    """What the steps would save without these copies (tensors made on the device, or
    the copies hidden behind compute): by replay where the trace allows, else the
    copies' time on the critical path."""
    from neuron_explorer.analyses.path_share import time_on_path
    from neuron_explorer.what_if.counterfactual import removal_saving_ns

    k = trace.kernels
    on_device = c["id"].isin(k["id"]) if len(k) else np.zeros(len(c), bool)
    op_ids = np.r_[k.set_index("id").loc[c.loc[on_device, "id"], "op_slice_id"].to_numpy(),
                   c.loc[~on_device, "id"].to_numpy()] if len(k) else c["id"].to_numpy()
    replayed = removal_saving_ns(trace, copy_ops(trace, c), RULE_ID)
    if replayed is not None:
        return replayed, "replay: the run replayed without these copies"
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
