"""Small DMA transfers: the fixed cost of each transfer (generating its descriptors, then
trigger to first byte) dominates its time.

Small in what it carries, not slow in what it took: a transfer sharing its engine's
bandwidth with others in flight takes longer than it would alone, yet a larger one would
share it all the same. And small because its tensors are: an op that moves many bytes in
small pieces has them cut so by the compiler's tiling, which no change to the program's
tensors alters (an NKI kernel's author chooses its tiles: `kernel_small_dma`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.analyses.phases import in_analysed_work
from neuron_explorer.common.dtypes import dtype_bytes
from neuron_explorer.common.intervals import Union
from neuron_explorer.common.op_key_codec import parse_dtypes, parse_shapes
from neuron_explorer.peaks import dma_bandwidth, dma_fixed_ns, dma_fixed_text, partitions
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make, step_time, top, us
from neuron_explorer.rules.host_bound import compiled_saving_ns, device_saving, is_host_bound
from neuron_explorer.tables import map_unique

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "small_dma"


def _engine_bandwidth(trace: Trace) -> float | None:
    """Bytes/ns of one DMA engine: transfers are spread over the engines."""
    figures = trace.hardware_figures or {}
    bw = dma_bandwidth(figures)
    return bw / 1e9 / int(figures.get("dma_engines") or 16) if bw else None


def _small(dma: pd.DataFrame, per_engine: float | None, fixed: float | None,
           parts: int) -> np.ndarray:
    """Transfers whose bytes take less time at an engine's bandwidth than the fixed cost of
    a transfer. A trace whose figures lack the fixed cost: those that ran below half an
    engine's bandwidth; with no figures, those under 4 KiB per partition."""
    nbytes = dma["bytes"].to_numpy(np.float64)
    if per_engine and fixed:
        return nbytes / per_engine < fixed
    if per_engine:
        ideal = nbytes / per_engine
        return dma["dur"].to_numpy(np.float64) > th.SMALL_DMA_SLOWDOWN * ideal
    return nbytes / parts < th.SMALL_DMA_BYTES_PER_PARTITION


def _largest_tensor(shapes: str, dtypes: str) -> int:
    """Bytes of an op's largest tensor, from its `shapes` and `dtypes` args (0: unknown)."""
    try:
        dims = parse_shapes(shapes)
    except ValueError:
        return 0
    sizes = [dtype_bytes(d) for d in parse_dtypes(dtypes)]
    return max((int(np.prod(d, dtype=np.float64)) * (sizes[i] if i < len(sizes) else 4)
                for i, d in enumerate(dims) if isinstance(d, list)), default=0)


def _tiled(trace: Trace, dma: pd.DataFrame, small_bytes: float, engines: int) -> np.ndarray:
    """Transfers of kernels whose op has a tensor large enough to give every DMA engine a
    transfer past `small_bytes`: their small pieces are the compiler's tiles of it. (An op
    over many small tensors, a foreach optimizer step, moves many bytes in small transfers
    because its tensors are small.)"""
    ops = trace.ops
    # once per distinct (shapes, dtypes): ops repeat them every step
    codes, pairs = pd.factorize(pd.MultiIndex.from_arrays([ops["shapes"], ops["dtypes"]]))
    sizes = np.array([_largest_tensor(str(a), str(b)) for a, b in pairs], np.float64)
    largest = pd.Series(sizes[codes], index=ops["op_id"])
    largest = largest[~largest.index.duplicated()]
    k = trace.kernels
    by_kernel = pd.Series(largest.reindex(k["op_id"]).fillna(0).to_numpy(),
                          index=pd.MultiIndex.from_arrays([k["device"], k["kernel_id"]]))
    by_kernel = by_kernel[~by_kernel.index.duplicated()]
    at = pd.MultiIndex.from_arrays([dma["device"], dma["kernel_id"]])
    return by_kernel.reindex(at).fillna(0).to_numpy() >= engines * small_bytes


def _time_lost(trace: Trace, small: pd.DataFrame, per_engine: float | None,
               fixed: float | None) -> float:
    """The part of the small transfers' fixed cost the device cannot hide: their time with no
    compute engine busy, scaled by the share of that time that is fixed cost."""
    dur = small["dur"].to_numpy(np.float64)
    if fixed:
        overhead = np.minimum(dur, fixed)
    else:
        ideal = small["bytes"].to_numpy(np.float64) / per_engine if per_engine else 0.0
        overhead = np.clip(dur - ideal, 0, None)
    overhead_share = float(overhead.sum() / max(dur.sum(), 1.0))
    ins = trace.instructions
    # the compute instructions' times as arrays: a copy of their rows (most of an
    # engine-level trace's slices) was the report's largest transient
    compute = ~map_unique(ins["engine"], lambda e: str(e).startswith("dma"), bool)
    starts = ins["ts"].to_numpy()
    ends = starts + ins["dur"].to_numpy()
    devices = ins["device"].to_numpy()
    exposed = 0
    for device, s in small.groupby("device"):
        c = compute & (devices == device)
        c_starts, c_ends = starts[c], ends[c]
        s_ends = s["ts"].to_numpy() + s["dur"].to_numpy()
        busy = Union(c_starts, c_ends)
        both = Union.of((s["ts"].to_numpy(), s_ends), (c_starts, c_ends))
        exposed += both.total - busy.total
    return exposed * overhead_share


def check(trace: Trace) -> list[Finding]:
    ins = trace.instructions
    if not len(ins):
        return []
    on_dma = map_unique(ins["engine"], lambda e: str(e).startswith("dma"), bool)
    # the kinds compared as a categorical (no string per row), the rows copied once
    dma = ins[(on_dma | (ins["kind"] == "dma").to_numpy()) & (ins["bytes"].to_numpy() > 0)]
    figures = trace.hardware_figures
    per_engine, fixed = _engine_bandwidth(trace), dma_fixed_ns(figures)
    small_mask = _small(dma, per_engine, fixed, partitions(figures))
    left_out = ""
    if per_engine and fixed and small_mask.any():
        engines = int((figures or {}).get("dma_engines") or 16)
        tiled = small_mask & _tiled(trace, dma, per_engine * fixed, engines)
        if tiled.any():
            left_out = (f" Left out: {int(tiled.sum())} small transfers of ops with a tensor "
                      f"of {engines * per_engine * fixed / 1024:.0f} KiB or more (the "
                      "compiler's tiles of it, which no change to the program's tensors "
                      "would make larger).")
        small_mask &= ~tiled
    small = dma[small_mask & _in_analysed_kernels(trace, dma)]
    names, kind = _issuers(trace, small)
    optimizer = kind == OPTIMIZER
    if optimizer.any():
        left_out += _optimizers_own(trace, int(optimizer.sum()))
        # fused=True's replay states what fusing saves them (memory_bound_ops, host_bound),
        # and a fused step's transfers are its parameters' sizes: counted here too, a
        # compiled model's two findings claimed 1.5x what fused=True saved
        small, names, kind = small[~optimizer], names[~optimizer], kind[~optimizer]
    eager = kind == EAGER
    if eager.any() and is_host_bound(trace) and compiled_saving_ns(trace) is not None:
        # compiling is host_bound's fix there, and its replayed saving holds the transfers
        # that fusing removes: an eager transformer's were claimed again here
        left_out += (f" Left out: {int(eager.sum())} small transfers of eager ops, which "
                   "compiling (the host-bound finding's fix) fuses: its replayed saving "
                   "holds what that removes.")
        small, names, kind = small[~eager], names[~eager], kind[~eager]
    if len(small) < th.SMALL_DMA_MIN_TRANSFERS:
        return []
    lost = _time_lost(trace, small, per_engine, fixed)
    if lost < th.SMALL_DMA_MIN_SHARE * step_time(trace):
        return []
    items = [evidence(r.ts, r.dur, [r.id], f"{int(r.bytes)} B transfer took {us(r.dur)}")
             for r in top(small, "dur").itertuples()]
    median = int(small["bytes"].median())
    saving = device_saving(trace, lost)
    return [make(
        trace, RULE_ID, f"{len(small)} small DMA transfers", saving.time_lost_ns, items,
        f"{len(small)} of {len(dma)} DMA transfers (median {median} B) spend most of their "
        f"time on the fixed cost of a transfer{dma_fixed_text(figures)} rather "
        "than moving data: they are too "
        f"small, or their rows are shorter than {th.SMALL_DMA_BYTES_PER_PARTITION} B per "
        "partition. The time counted is when the device does nothing but these transfers."
        + left_out + saving.note,
        _recommendation(names, kind),
        symptom_ns=lost, saving_basis=saving.basis, after=saving.after)]


ISSUERS_NAMED = 3
# the share of the small transfers a kind of issuer must have for its own advice
ISSUER_MIN_SHARE = 0.25
GRAPHS, OPTIMIZER, EAGER = "compiled graphs", "the optimizer's step", "eager ops"


def _in_analysed_kernels(trace: Trace, dma: pd.DataFrame) -> np.ndarray:
    """Transfers of the kernels the findings count (the analysed steps, no eval passes): a
    tensor made before the loop once named its upload's op as a source."""
    k = in_analysed_work(trace, trace.kernels)
    counted = pd.MultiIndex.from_arrays([k["device"], k["kernel_id"]])
    return pd.MultiIndex.from_arrays([dma["device"], dma["kernel_id"]]).isin(counted)


def _issuers(trace: Trace, small: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The name of the op (or compiled graph) whose kernel issued each transfer, and its
    kind: GRAPHS, OPTIMIZER or EAGER ("" where no op is known)."""
    from neuron_explorer.common import trace_format as tf
    from neuron_explorer.tables import ancestor_of_kind

    k = trace.kernels
    op_of = pd.Series(k["op_slice_id"].to_numpy(), index=pd.MultiIndex.from_arrays(
        [k["device"], k["kernel_id"]]))
    op_of = op_of[~op_of.index.duplicated()]
    ops = op_of.reindex(pd.MultiIndex.from_arrays([small["device"], small["kernel_id"]]))
    ops = ops.fillna(-1).astype(np.int64).to_numpy()
    names = np.full(len(ops), "", object)
    kind = np.full(len(ops), "", object)
    known = ops >= 0
    if known.any():
        names[known] = np.asarray(trace.table("slices")["name"].array[ops[known]], str)
        graph = np.char.startswith(names[known].astype(str), "graph")
        optimizer = ancestor_of_kind(trace, ops[known], (tf.CAT_OPTIMIZER,)) >= 0
        kind[known] = np.where(graph, GRAPHS, np.where(optimizer, OPTIMIZER, EAGER))
    return names, kind


def _optimizers_own(trace: Trace, n: int) -> str:
    """Why the optimizer step's `n` small transfers are left out of this finding."""
    from neuron_explorer.rules.host_bound import fused_optimizer

    if fused_optimizer(trace):
        return (f" Left out: {n} small transfers of the fused optimizer step (one kernel "
                "over every parameter already: its transfers are the parameters' sizes).")
    return (f" Left out: {n} small transfers of the optimizer's step, which fused=True "
            "removes: where a replay of it applies, the finding that advises it states "
            "what it saves.")


def _recommendation(names: np.ndarray, kind: np.ndarray) -> str:
    """Where the small transfers come from (the ops whose kernels issue the most of them),
    and what a PyTorch script changes for each kind: "larger tiles" and "keep data in
    SBUF" alone named nothing a script can do."""
    known = kind != ""
    if not known.any():
        return ("Make transfers larger: give each op more data (larger batches, one op over "
                "concatenated small tensors rather than one per tensor).")
    share = pd.Series(kind[known]).value_counts() / int(known.sum())
    share = share[share >= 0.005]
    named = ", ".join(f"{what} {part:.0%}" for what, part in share.items())
    advice = []
    if share.get(EAGER, 0) >= ISSUER_MIN_SHARE:
        top_ops = pd.Series(names[kind == EAGER]).value_counts().index[:ISSUERS_NAMED]
        advice.append(f"compile the code that runs the eager ones ({', '.join(top_ops)} "
                      "most), so that they fuse and the values between them stay on chip "
                      "instead of being stored and loaded again")
    advice.append("give each op more data: larger batches, and one op over concatenated "
                  "small tensors rather than one per tensor")
    return f"The small transfers come from {named}: " + "; ".join(advice) + "."
