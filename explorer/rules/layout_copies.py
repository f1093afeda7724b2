"""Layout copies: a strided view (`x.permute(...)`, `.transpose`, a slice) made contiguous on
the device every step, by `.contiguous()`, `reshape` or an op that needs contiguous input
(`torch.matmul` on a permuted tensor). Each is an allocation and a copy the host issues
and the device runs; computed in the layout the tensor has, neither happens.

The copies are the device-to-device copies our recordings mark as reading a strided view
(`layout_copy`), with the allocation made for each just before it; one with no allocation
before it writes into memory already there (a static KV cache's slice, a buffer) and is
none. What keeping the layout saves is the run replayed without both. A trial's attention
block made five such copies a step, 6% of it, and no finding named them.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.analyses.phases import in_analysed_work
from neuron_explorer.common import op_families
from neuron_explorer.common import trace_format as tf
from neuron_explorer.rules import host_bound
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import (
    Finding,
    evidence,
    make,
    named_sites,
    step_time,
    top,
    us,
)
from neuron_explorer.tables import ancestor_of_kind, flag, map_unique, of_kind, slice_names
from neuron_explorer.what_if.counterfactual import removal_saving_ns

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "layout_copies"
# the allocation a copy into a new tensor makes just before it (`x.contiguous()`)
ALLOCATIONS = frozenset({"aten::empty", "aten::empty_strided", "aten::empty_like"})


def layout_copies(trace: Trace, own: bool = False) -> tuple[pd.DataFrame, np.ndarray]:
    """(the analysed steps' layout copies, the allocations made for them just before);
    `own`: only those outside PyTorch's composite modules (`in_library_modules`)."""
    ops = in_analysed_work(trace, trace.ops)
    copies = ops[ops["name"].astype(str) == "aten::_copy_from"]
    if not len(copies):
        return copies, np.zeros(0, np.int64)
    marked = flag(trace.slice_args.column(tf.ARG_LAYOUT_COPY, copies["id"].to_numpy(np.int64)))
    copies = copies[marked]
    if own:
        copies = copies[~in_library_modules(trace, copies)]
    if not len(copies):
        return copies, np.zeros(0, np.int64)
    by_op = ops.set_index("op_id")
    before = by_op.reindex(copies["op_id"].to_numpy(np.int64) - 1)
    made = before["name"].astype(str).isin(ALLOCATIONS).to_numpy() & (
        before["step"].to_numpy() == copies["step"].to_numpy())
    # a copy into memory that was there before (`cache[:, :, pos] = k`, `buf.copy_(x)`)
    # writes where the program keeps its data: no layout to keep instead (a decoder's
    # static KV cache was told to stop writing into itself)
    return copies[made], before["id"].to_numpy()[made].astype(np.int64)


def in_library_modules(trace: Trace, copies: pd.DataFrame) -> np.ndarray:
    """Which copies run inside a module PyTorch defines that is built of others (an
    nn.MultiheadAttention transposes its own heads): in its forward or backward, or in its
    children's."""
    modules = of_kind(trace, tf.CAT_MODULE)
    if not len(copies) or not len(modules):
        return np.zeros(len(copies), bool)
    marked = flag(trace.slice_args.column(tf.ARG_LIBRARY_MODULE,
                                          modules["id"].to_numpy(np.int64)))
    library = set(modules.loc[marked, "name"].astype(str))
    if not library:
        return np.zeros(len(copies), bool)
    at = ancestor_of_kind(trace, copies["id"].to_numpy(np.int64),
                          (tf.CAT_MODULE, tf.CAT_BACKWARD))
    names = pd.Series(slice_names(trace)[np.maximum(at, 0)].astype(str))

    def inside(path: str) -> bool:  # the module or one it is a child of ("a.b" of "a.b.c")
        parts = path.split(".")
        return any(".".join(parts[:i]) in library for i in range(1, len(parts) + 1))

    return (at >= 0) & map_unique(names, inside, bool)


# what may come between a copy and the op that reads it: views, the copy's allocation and
# the other operand's copy (`q @ k.transpose(-2, -1)` copies both)
_BEFORE_READER = frozenset({"aten::as_strided", "aten::view", "aten::_reshape_alias",
                            "aten::_unsafe_view", "aten::expand", "aten::_copy_from",
                            *ALLOCATIONS})
_READER_WITHIN = 4  # ops after the copy


def feeds_head_matmul(trace: Trace, copies: pd.DataFrame) -> np.ndarray:
    """Which copies are of a batch of per-head views (4-D) that a batched matmul reads next:
    attention's q @ k.transpose(-2, -1) and att @ v, and their gradients. PyTorch's matmul
    makes such a batch contiguous before it multiplies, so no layout written in eager code
    avoids them: a trial's hand-written attention made 10 of its 16 copies a step so, and
    the advice to keep the layout removed 2 (86 us of 1.18 ms claimed a step)."""
    if not len(copies):
        return np.zeros(0, bool)
    ops = trace.ops.sort_values("op_id")
    op_ids = ops["op_id"].to_numpy(np.int64)
    names = ops["name"].astype(str).to_numpy()
    at = np.searchsorted(op_ids, copies["op_id"].to_numpy(np.int64))
    found = np.zeros(len(copies), bool)
    open_ = np.ones(len(copies), bool)  # still among the ops that may come before the reader
    for k in range(1, _READER_WITHIN + 1):
        following = np.minimum(at + k, len(names) - 1)
        name = np.where(at + k < len(names), names[following], "")
        found |= open_ & map_unique(name, _is_batched_matmul, bool)
        open_ &= np.isin(name, list(_BEFORE_READER))
    heads = map_unique(copies["shapes"].astype(str), _four_dimensional, bool)
    return found & heads


def _is_batched_matmul(name: str) -> bool:
    return op_families.base_name(name) in op_families.BATCHED_GEMM


def _four_dimensional(shapes: str) -> bool:
    """Whether the copy's tensor ("[[8, 4, 64, 32]]") has four dims."""
    try:
        (shape,) = json.loads(shapes)
    except (ValueError, TypeError):
        return False
    return isinstance(shape, list) and len(shape) == 4


def check(trace: Trace) -> list[Finding]:
    # a library module's own copies are not the user's to remove: a trial's 44 of 46 copies
    # a step ran inside nn.MultiheadAttention, and fixing the user's two saved 4% of the claim
    copies, allocations = layout_copies(trace, own=True)
    if not len(copies):
        return []
    removed = np.concatenate([copies["id"].to_numpy(np.int64), allocations])
    saving = removal_saving_ns(trace, removed, RULE_ID)
    if saving is None or saving < th.LAYOUT_COPIES_MIN_SHARE * step_time(trace):
        return []
    steps = max(int(copies["step"].nunique()), 1)
    named = named_sites(copies["source"].astype(str), steps)
    every, _ = layout_copies(trace)
    library = every[in_library_modules(trace, every)]
    theirs = (f" {round(len(library) / steps)} more a step run inside PyTorch's own modules "
              f"({', '.join(sorted(set(library['module'].astype(str)))[:3])}), which make "
              "their own views: not counted here, as the code to change is not yours."
              if len(library) >= steps else "")
    items = [evidence(r.ts, r.dur, [r.id], f"layout copy of {r.shapes} at {r.source}: "
                      f"{us(r.dur)} on the host, {us(r.device_dur)} on the device")
             for r in top(copies, "dur").itertuples()]
    per_step = round(len(copies) / steps)
    overlap = (" Compiling the model, the host-bound finding's fix, folds these copies into "
               "its graphs too: the two savings overlap rather than add."
               if host_bound.is_host_bound(trace) and not host_bound.is_compiled(trace)
               else "")
    heads = _head_matmuls(trace, copies, allocations, steps, saving)
    recommendation = RECOMMENDATION
    if heads:
        recommendation = ("Compile the model for the copies that feed batched matmuls: "
                          "torch.compile folds them into the matmuls' reads. For the others: "
                          + RECOMMENDATION[0].lower() + RECOMMENDATION[1:])
    views = "a strided view" if per_step == 1 else f"{per_step} strided views"
    return [make(
        trace, RULE_ID, f"Layout copies: {views} made contiguous a step", saving, items,
        f"{'1 copy' if per_step == 1 else f'{per_step} copies'} a step on the device "
        f"{'reads' if per_step == 1 else 'read'} a strided view (a permute, "
        "transpose or slice) to make it contiguous, for .contiguous(), reshape or an op that "
        "needs contiguous input" + (f", at {named}" if named else "") + ": each is an "
        "allocation and a copy the host issues and the device runs "
        f"({us(copies['dur'].sum())} of host op time and {us(copies['device_dur'].sum())} of "
        "device time in all)." + heads + theirs + overlap, recommendation,
        symptom_ns=float(copies["dur"].sum() + copies["device_dur"].sum()),
        saving_basis="replay: the run replayed without the layout copies and the "
                     "allocations made for them")]


RECOMMENDATION = (
    "Compute in the layout the tensor has: contract or reduce over the dim where it is "
    "(x @ w on [batch, time, dim], then mean over dim 1, rather than permuting to "
    "[time, batch, dim] first), permute once where the data is made rather than before "
    "each op, and slice contiguous blocks (x[i] rather than x[:, i]).")


def _head_matmuls(trace: Trace, copies: pd.DataFrame, allocations: np.ndarray,
                  steps: int, saving: float) -> str:
    """The explanation's sentence on the copies that feed batched matmuls of per-head views
    (`feeds_head_matmul`), with what removing them alone saves ("" where there are none)."""
    batched = feeds_head_matmul(trace, copies)
    if not batched.any():
        return ""
    ids = np.concatenate([copies["id"].to_numpy(np.int64)[batched], allocations[batched]])
    part = removal_saving_ns(trace, ids, RULE_ID + ":head_matmuls")
    sites = named_sites(copies.loc[batched, "source"].astype(str), steps)
    n = round(int(batched.sum()) / steps)
    return (f" {n} of them a step {'is a batch' if n == 1 else 'are batches'} of per-head "
            f"views that a batched matmul reads next" + (f", at {sites}" if sites else "")
            + " (attention's q @ k.transpose(-2, -1) and att @ v, and their gradients): "
            "PyTorch's matmul makes such a batch contiguous before it multiplies, so no layout "
            "written in eager code avoids them, and compiling the model does"
            + (f"; replayed without them alone, the analysed steps save {us(part)} of the "
               f"{us(saving)}" if part else "")
            + ".")
