"""Low Tensor Engine utilisation from matmul dims that are not multiples of 128."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np
from neuron_explorer.analyses.compiled_sections import graph_matmul_shapes
from neuron_explorer.analyses.engine_utilisation import shortened_by_tensor_cut
from neuron_explorer.analyses.phases import in_analysed_work
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make, step_time
from neuron_explorer.rules.host_bound import device_saving

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "tensor_engine_padding"
_INT = re.compile(r"\d+")


def odd_dims(shapes: str) -> list[int]:
    """Dims of a shapes string that are larger than 1 and not multiples of the 128 tile."""
    return sorted({int(d) for d in _INT.findall(shapes or "")
                   if int(d) > 1 and int(d) % th.TE_TILE})


def check(trace: Trace) -> list[Finding]:
    k = in_analysed_work(trace, trace.kernels)
    if not len(k):
        return []
    flops = k["flops"].to_numpy(np.float64)
    hw = k["hw_flops"].to_numpy(np.float64)
    waste = np.divide(hw - flops, hw, out=np.zeros(len(k)), where=hw > 0)
    padded = (flops > 0) & (waste >= th.TE_PADDING_MIN_WASTE)
    if not padded.any():
        return []
    pk = k[padded]
    w = waste[padded]
    busy = np.where(pk["busy_tensor"].to_numpy() > 0, pk["busy_tensor"].to_numpy(),
                    pk["dur"].to_numpy())
    lost = float((busy * w).sum())
    if lost < th.TE_PADDING_MIN_SHARE * step_time(trace):
        return []
    cut = shortened_by_tensor_cut(pk, busy * w)
    ops = trace.ops.set_index("id") if len(trace.ops) else None
    # a compiled graph's op lists the graph's inputs (an embedding's table among them):
    # its matmuls' own shapes are what the Tensor Engine tiles
    graph_shapes = graph_matmul_shapes(trace)
    items, shapes_seen = [], []
    recoverable = 0.0
    order = np.argsort(-(busy * w))
    for i in order.tolist():
        r = pk.iloc[i]
        shapes = graph_shapes.get(int(r["kernel_id"]), "")
        if int(r["kernel_id"]) not in graph_shapes and ops is not None \
                and r["op_slice_id"] in ops.index:
            shapes = str(ops.at[r["op_slice_id"], "shapes"])
        if shapes and shapes not in shapes_seen:
            shapes_seen.append(shapes)
        if _past_a_multiple(odd_dims(shapes)):
            recoverable += float(cut[i])
        items.append(evidence(r["ts"], r["dur"], [r["id"]],
                              f"{r['name']}: {w[i]:.0%} of executed FLOPs are padding"
                              + (f" (shapes {shapes}, odd dims {odd_dims(shapes)})" if shapes
                                 else "")))
    if not recoverable:
        # every odd dim is under 128 or fills most of its last tile: no change to it saves
        # time (padding up does more work in the same time), so nothing here is a
        # bottleneck, however many padded FLOPs the kernels execute
        return []
    dims = sorted({d for s in shapes_seen for d in odd_dims(s)})
    saving = device_saving(trace, recoverable)
    return [make(
        trace, RULE_ID, "Tensor Engine runs padded tiles (dims not multiples of 128)",
        saving.time_lost_ns,
        items,
        f"{int(padded.sum())} matmul kernels execute at least {th.TE_PADDING_MIN_WASTE:.0%} more "
        "FLOPs than the model needs: the 128x128 array pads partial tiles"
        + (f"; dims {dims[:8]} are not multiples of 128" if dims else "") + ". A partial "
        "tile takes as long as a full one: only a dim just past a multiple of 128 (130, 160: "
        "a last tile at most half full) costs time it could save, at the multiple below; a "
        "dim under 128 is one tile at any size, so filling it up is work for free, not time "
        "saved." + saving.note,
        "Where a dim is just past a multiple of 128, the multiple below (128 rather than 130) "
        "saves its extra tiles. Dims under 128 cost a whole tile anyway: a batch x sequence, "
        "hidden size or head dim raised to 128 does more work in the same time (padding a "
        "vocabulary or feature count up to a multiple of 128 costs nothing).",
        symptom_ns=lost, saving_basis=saving.basis
        + ("; only the kernels with a dim past a multiple of 128 count: padding up "
           "saves no time" if recoverable < lost else ""),
        after=saving.after)]


def _past_a_multiple(dims: list[int]) -> bool:
    """Whether a dim is just past a multiple of 128 (above 128, its last tile at most half
    full): that tile is time a slightly smaller dim would save. A dim under 128 is one tile
    at any size; one whose last tile is mostly full (a vocabulary of 1000: 7 tiles and
    104 of 128) would have to shrink by most of a tile, which is no tuning but another
    model."""
    return any(d > th.TE_TILE and d % th.TE_TILE <= th.TE_TILE // 2 for d in dims)
