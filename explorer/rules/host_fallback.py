"""Host fallback ops: ops with no device lowering that run on the host.

The recommendation names what the user called (the op's module path and source line,
and the PyTorch API that emits the op) and a replacement the device runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer import tables
from neuron_explorer.analyses.phases import in_analysed_work
from neuron_explorer.common import trace_format as tf
from neuron_explorer.device_terms import device_terms
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make, top, us

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "host_fallback"

# aten ops whose name is not the API the user called: (what called it, what to do instead)
KNOWN_SOURCES = {
    "aten::_native_multi_head_attention": (
        "nn.MultiheadAttention's inference fast path (eval mode under no_grad)",
        ("compute attention with F.scaled_dot_product_attention (the device runs it), or call "
        "the module on its training path (the fast path is skipped while gradients are "
        "enabled, e.g. outside torch.no_grad / inference_mode)")),
    "aten::_transformer_encoder_layer_fwd": (
        "nn.TransformerEncoderLayer's inference fast path (eval mode under no_grad)",
        ("build the layer from F.scaled_dot_product_attention and nn.Linear, or run it with "
        "gradients enabled so it takes the training path")),
}


def _api(op: str) -> str:
    """The PyTorch function behind an aten op name: 'aten::topk' -> 'torch.topk'."""
    base = op.split("::")[-1].split(".")[0]
    return f"torch.{base}" if not base.startswith("_") else op


def _where(rows: pd.DataFrame) -> str:
    """'in model.attn at infer.py:17' for the op's most common module and source line."""
    parts = []
    modules = rows["module"][rows["module"] != ""]
    if len(modules):
        parts.append(f"in {modules.mode().iloc[0]}")
    sources = rows["source"][rows["source"] != ""]
    if len(sources):
        parts.append(f"at {sources.mode().iloc[0]}")
    return " ".join(parts)


def _advice(name: str, rows: pd.DataFrame) -> str:
    where = _where(rows)
    where = f" ({where})" if where else ""
    if name in KNOWN_SOURCES:
        caller, fix = KNOWN_SOURCES[name]
        return f"{name} comes from {caller}{where}: {fix}."
    in_model = bool((rows["module"] != "").any())
    move = ("" if in_model else ", or compute it before the loop if its inputs do not change")
    return (f"{_api(name)}{where} has no device lowering: express it with ops the device "
            f"supports{move}.")


def graph_fallbacks(trace: Trace) -> dict[int, list[str]]:
    """Per compiled graph id, the ops in it with no device lowering, each as often as the
    graph runs it (from its compile spans' `fallback_ops`: the longest, where a graph
    compiled for several sizes); graphs without any are absent."""
    import json

    spans = trace.table("slices")
    spans = spans[spans["kind"] == tf.CAT_COMPILE]
    ids = spans["id"].to_numpy()
    graph = tables.number(trace, tf.ARG_GRAPH_ID, ids, default=-1)
    found: dict[int, list[str]] = {}
    for g, text in zip(graph.tolist(), tables.text(trace.slice_args.column("fallback_ops", ids)),
                       strict=True):
        try:
            names = json.loads(text) if text else []
        except ValueError:
            continue
        if g >= 0 and isinstance(names, list) and len(names) > len(found.get(int(g), [])):
            # a trial's router ran `nonzero` 72 times in 9 calls: named "(9x)" when each
            # graph's ops were listed once
            found[int(g)] = [str(n) for n in names]
    return found


def _in_graphs(fb: pd.DataFrame, graphs: dict[int, list[str]]) -> pd.DataFrame:
    """Fallback rows with each compiled graph's launch replaced by the ops that fell back
    inside it (named `aten::x in graph:N`); their time is part of the graph's, not theirs."""
    is_graph = fb["graph_id"].to_numpy() >= 0
    rows = [fb[~is_graph]]
    for r in fb[is_graph].itertuples():
        for name in graphs.get(int(r.graph_id), []):
            rows.append(pd.DataFrame([{**r._asdict(), "name": name, "dur": 0,
                                       "device_dur": 0, "graph": r.name}]).drop(
                columns="Index", errors="ignore"))
    return pd.concat(rows, ignore_index=True) if rows else fb


def check(trace: Trace) -> list[Finding]:
    ops = in_analysed_work(trace, trace.ops)
    if not len(ops):
        return []
    fb = ops[ops["fallback"].astype(bool)]
    if len(fb) < th.FALLBACK_MIN_OPS:
        return []
    fb = _in_graphs(fb, graph_fallbacks(trace))
    if not len(fb):
        return []
    lost = float(fb["dur"].sum() + fb["device_dur"].sum())
    saving, basis = _saving(trace, fb)
    per_name = fb.groupby("name")["dur"].agg(["sum", "size"]).sort_values("sum", ascending=False)
    names = ", ".join(f"{n} ({c}x)" for n, (_, c) in per_name.iterrows())
    inside = fb["graph"].fillna("") if "graph" in fb else pd.Series("", index=fb.index)
    items = [evidence(r.ts, r.dur, [r.id], (f"{r.name} ran on the host for {us(r.dur)}"
                                            if not g else f"{r.name} ran on the host inside {g}")
                      + (f" ({r.module})" if r.module else "")
                      + (f" at {r.source}" if r.source else ""))
             for r, g in zip(top(fb, "dur").itertuples(), inside[top(fb, "dur").index],
                             strict=True)]
    advice = " ".join(_advice(str(n), fb[fb["name"] == n]) for n in per_name.index[:3])
    return [make(
        trace, RULE_ID, f"{len(fb)} ops fell back to the host", saving, items,
        f"These ops have no device lowering: {names}. Each one holds up the device's queue: "
        "its inputs are copied to the host, the device waits while the CPU computes, and "
        "the result is copied back."
        + (" Inside a compiled graph that round trip is part of the graph's device time "
           "(not counted here)." if inside.astype(bool).any() else "")
        + (" A device version costs the host an op's dispatch too, about as long as this "
           "round trip's host time: while the host sets the steps' pace, it saves nothing."
           if saving <= 0 and "one op on the device" in basis else ""), advice,
        symptom_ns=lost, saving_basis=basis)]


def _device_op_ns(trace: Trace) -> int:
    """The run's typical host time of an op that launched device work (the median)."""
    ops = trace.ops
    ran = ops[(ops["kernel_id"].to_numpy() >= 0) & ~ops["fallback"].astype(bool).to_numpy()
              & (ops["graph_id"].to_numpy() < 0)]
    return int(ran["dur"].median()) if len(ran) else 0


def _saving(trace: Trace, fb: pd.DataFrame) -> tuple[float, str]:
    """What the steps would save if each eager fallback op were one op on the device (its
    dispatch the run's typical op's, its kernel's own time left out: a device version
    costs that too): by replay where the trace allows, else their host time and round
    trips on the critical path. Replayed as gone altogether, a fallback whose host time
    is an op's was promised its whole dispatch, where the device version a user wrote
    (nn.Embedding and a mean for an nn.EmbeddingBag) ran 136 us a step slower."""
    from neuron_explorer.analyses.path_share import time_on_path
    from neuron_explorer.what_if.counterfactual import removal_saving_ns

    eager = fb[fb["graph_id"].to_numpy() < 0]
    ids = eager["id"].to_numpy()
    k = trace.kernels
    k = k[k["op_slice_id"].isin(ids)] if len(k) else k
    if device_terms(trace.metadata).recorded_here and len(k):
        # the round trip's kernels go; the op's host time down to a device op's dispatch
        ts, dur = eager["ts"].to_numpy(np.int64), eager["dur"].to_numpy(np.int64)
        cut = np.minimum(dur, _device_op_ns(trace))
        replayed = removal_saving_ns(trace, k["id"].to_numpy(np.int64), RULE_ID,
                                     host_cut=(ts + cut, ts + dur))
        if replayed is not None:
            return replayed, ("replay: the run replayed with each of these ops one op on "
                              "the device (no host round trip; its dispatch the run's "
                              "typical op's, its kernel's time left out)")
    replayed = removal_saving_ns(trace, ids, RULE_ID)
    if replayed is not None:
        return replayed, ("replay: the run replayed without these ops' host round trips "
                          "(as if the device ran them at no cost)")
    ts = eager["ts"].to_numpy()
    on_host = time_on_path(trace, ts, ts + eager["dur"].to_numpy(), "host")
    on_device = time_on_path(trace, k["ts"].to_numpy(), (k["ts"] + k["dur"]).to_numpy(),
                             "device")
    return on_host + on_device, ("critical path: these ops' host time and round trips where "
                                 "they set the steps' length")
