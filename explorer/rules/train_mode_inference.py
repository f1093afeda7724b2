"""Inference in training mode: a run that never trains (no backward, no optimizer step)
whose model runs its training-only ops, because `model.eval()` was not called: dropout
drops values at random and batch norm normalises each request by its own batch's
statistics and updates its running ones (so the outputs are not the trained model's),
each an op the host issues and the device runs.

What `model.eval()` saves is the run replayed without those ops (dropout and batch norm's
`num_batches_tracked` count); batch norm's own kernels keep their recorded length (its
eval-mode kernel skips the statistics: a little less). Autograd recording the passes
(no `torch.no_grad()` / `torch.inference_mode()`) is named beside it: its cost is inside
each op's host time, which the trace cannot split off, so it is not counted. A CNN served
in training mode lost 16% of each request to four such ops, and no finding said so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.analyses.compiled_sections import section_labels
from neuron_explorer.analyses.levels import recorded_level
from neuron_explorer.analyses.phases import (
    in_analysed_work,
    model_calls,
    model_name,
    training_steps,
)
from neuron_explorer.common import trace_format as tf
from neuron_explorer.common.op_families import GEMM, base_name
from neuron_explorer.common.op_key_codec import OpKeyError, decode, parse_shapes
from neuron_explorer.rules.finding import Finding, evidence, make, top, us
from neuron_explorer.rules.graph_break_cost import calls_as_one_launch_ns
from neuron_explorer.what_if.counterfactual import removal_saving_ns

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "train_mode_inference"
# what nn.Dropout and its kin run in training mode only (in eval mode: nothing)
DROPOUT_OPS = frozenset({"aten::dropout", "aten::native_dropout", "aten::feature_dropout",
                         "aten::alpha_dropout", "aten::feature_alpha_dropout"})
BATCH_NORM_OPS = frozenset({"aten::native_batch_norm", "aten::_native_batch_norm_legit",
                            "aten::_batch_norm_with_update", "aten::cudnn_batch_norm"})
# the same inside a compiled graph's sections (their names join their ops')
_GRAPH_TRAINING_OPS = r"native_dropout|native_batch_norm_legit_functional|batch_norm_with_update"


def batch_norms_training(trace: Trace, ops: pd.DataFrame) -> pd.DataFrame:
    """The batch-norm ops that computed batch statistics (their key says training)."""
    bn = ops[ops["name"].astype(str).isin(BATCH_NORM_OPS)]
    if not len(bn):
        return bn
    keys = trace.slice_args.texts(tf.ARG_OP_KEY, bn["id"].to_numpy(np.int64)).tolist()
    return bn[np.array([_trains(name, shapes, dtypes, key) for name, shapes, dtypes, key in zip(
        bn["name"].astype(str), bn["shapes"].astype(str), bn["dtypes"].astype(str), keys,
        strict=True)], bool)]


def _trains(name: str, shapes: str, dtypes: str, key: str) -> bool:
    """Whether a batch norm's op key says it computes batch statistics."""
    try:
        return bool(dict(decode(name, shapes, dtypes, key)[3]).get("training"))
    except OpKeyError:
        return False


def norm_step_counts(ops: pd.DataFrame, norms: pd.DataFrame) -> pd.DataFrame:
    """Each training batch norm's `num_batches_tracked += 1`: an in-place add to an int64
    scalar in the same module and step."""
    if not len(norms):
        return ops.iloc[:0]
    adds = ops[(ops["name"].astype(str) == "aten::add_")
               & (ops["dtypes"].astype(str) == "[int64]") & (ops["shapes"].astype(str) == "[[]]")]
    where = set(zip(norms["module"].astype(str), norms["step"], strict=True))
    keep = [(m, s) in where for m, s in zip(adds["module"].astype(str), adds["step"], strict=True)]
    return adds[np.array(keep, bool)]


def _graph_sections(trace: Trace) -> pd.DataFrame:
    """The sections of the analysed steps' compiled graphs that run dropout or batch norm
    with batch statistics (AOTAutograd's `_native_batch_norm_legit_functional`; eval mode
    traces `_native_batch_norm_legit_no_training`), with their graph kernel's row."""
    k = in_analysed_work(trace, trace.kernels)
    labels = section_labels(trace)
    if not len(k) or not len(labels):
        return labels.iloc[:0]
    names = labels["section"].astype(str)
    training = names.str.contains(_GRAPH_TRAINING_OPS)
    return labels[training & labels["kernel_id"].isin(k["kernel_id"])]


def check(trace: Trace) -> list[Finding]:
    if recorded_level(trace) is None or training_steps(trace):
        return []  # not our recording (no grad mode), or a run that trains
    calls = model_calls(trace)
    ops = in_analysed_work(trace, trace.ops)
    if not len(calls) or not len(ops):
        return []
    dropouts = ops[ops["name"].astype(str).isin(DROPOUT_OPS)]
    norms = batch_norms_training(trace, ops)
    sections = _graph_sections(trace)
    if not len(dropouts) and not len(norms) and not len(sections):
        return []
    counts = norm_step_counts(ops, norms)
    removed = np.concatenate([dropouts["id"].to_numpy(np.int64),
                              counts["id"].to_numpy(np.int64)])
    # without grad, eval mode also sends each nn.TransformerEncoderLayer down torch's fast
    # path: one fused op a layer. A server told dropout's 0.5 ms a step saved 4.4 by eval
    grad_on = bool((calls["grad"] == 1).any())
    layers = pd.DataFrame() if grad_on else encoder_layer_ops(trace, ops)
    if len(layers):
        saving = calls_as_one_launch_ns(trace, layers, f"{RULE_ID}: fast path", removed)
    else:
        saving = removal_saving_ns(trace, removed, RULE_ID) if len(removed) else 0.0
    if saving is None:
        return []
    shown = pd.concat([dropouts, norms, counts])
    model = model_name(trace)
    n_steps = max(int(ops["step"].nunique()), 1)
    in_graphs = sections.drop_duplicates(["section", "module"])
    dropped = len(dropouts) // n_steps + int(in_graphs["section"].str.contains("dropout").sum())
    normed = len(norms) // n_steps + int((~in_graphs["section"].str.contains("dropout")).sum())
    parts = []
    if dropped:
        parts.append(f"dropout zeroes values at random ({dropped} a step)")
    if normed:
        parts.append("batch norm normalises each batch by its own statistics and updates its "
                     f"running ones ({normed} a step)")
    n_layers = int(layers["call"].nunique()) // n_steps if len(layers) else 0
    fast_path = (f" Without grad, eval mode also sends each nn.TransformerEncoderLayer ({n_layers} "
                 "a step) down torch's fast path: one fused op a layer "
                 "(aten::_transformer_encoder_layer_fwd) instead of its "
                 f"{len(layers) // max(n_layers * n_steps, 1)} ops (counted)." if n_layers else "")
    items = [evidence(r.ts, r.dur, [r.id], f"{r.name} in {r.module}: {us(r.dur)} on the host, "
                      f"{us(r.device_dur)} on the device")
             for r in top(shown, "dur").itertuples()]
    if not items:
        graphs = in_analysed_work(trace, trace.kernels)
        graphs = graphs[graphs["kernel_id"].isin(sections["kernel_id"])]
        items = [evidence(r.ts, r.dur, [r.id], f"{r.name} runs "
                          + ", ".join(in_graphs["section"].astype(str).tolist()[:4]))
                 for r in top(graphs, "dur").itertuples()]
    # fired at any size: the outputs are not the trained model's
    return [make(
        trace, RULE_ID, "The model serves in training mode", saving, items,
        f"No step trains (no backward, no optimizer step), yet {model} runs in training mode: "
        + "; ".join(parts) + ". Its outputs are not the trained model's, and the host issues "
        "and the device runs ops that eval mode leaves out."
        + (" In its compiled graph they are sections of one program, whose device time the "
           "recording does not split by op: not counted." if len(in_graphs) else "")
        + fast_path
        + (" Autograd also records every pass (grad mode is on): its bookkeeping is in each "
           "op's host time and is not counted here." if grad_on else ""),
        f"Call {model}.eval() before serving"
        + (", and serve under torch.inference_mode() (or torch.no_grad())" if grad_on else "")
        + ": dropout then passes values through and batch norm uses the statistics it "
        "learned. (Dropout kept on at inference on purpose, Monte Carlo dropout, is the "
        "exception.)"
        + (" Given a padding mask, the fast path packs the batch into a nested tensor, which "
           "this device does not hold: construct nn.TransformerEncoder with "
           "enable_nested_tensor=False." if n_layers else ""),
        symptom_ns=float(shown["dur"].sum()),
        saving_basis="replay: the run replayed without dropout and batch norm's step count; "
                     "batch norm's kernels keep their recorded length"
                     + ("; each encoder layer's call one launch, its device work kept "
                        "(unfused)" if n_layers else "") if len(removed) or n_layers else
                     "estimate: inside compiled graphs, not counted")]


# nn.TransformerEncoderLayer's submodules, as the recording names them
_ENCODER_LAYER_PARTS = frozenset({"self_attn", "linear1", "linear2", "norm1", "norm2"})


def encoder_layer_ops(trace: Trace, ops: pd.DataFrame) -> pd.DataFrame:
    """The eager ops of `ops` inside calls of nn.TransformerEncoderLayer modules (known by
    their submodules), with the call's slice id as `call`."""
    modules = trace.modules
    if not len(modules) or "graph_id" not in ops:
        return ops.iloc[:0]
    children: dict[str, set[str]] = {}
    for name in modules["module"].astype(str).unique().tolist():
        parent, _, leaf = name.rpartition(".")
        children.setdefault(parent, set()).add(leaf)
    layers = {name for name, parts in children.items() if parts >= _ENCODER_LAYER_PARTS}
    calls = modules[modules["module"].astype(str).isin(layers)
                    & (modules["phase"] == "forward")].sort_values("ts")
    eager = ops[ops["graph_id"].to_numpy() < 0]
    if not len(calls) or not len(eager):
        return ops.iloc[:0]
    starts = calls["ts"].to_numpy(np.int64)
    ends = starts + calls["dur"].to_numpy(np.int64)
    at = np.searchsorted(starts, eager["ts"].to_numpy(np.int64), side="right") - 1
    inside = (at >= 0) & (eager["ts"].to_numpy(np.int64) < ends[np.maximum(at, 0)])
    found = eager[inside].assign(call=calls["id"].to_numpy(np.int64)[at[inside]])
    return found[found["call"].isin(_batch_first_calls(trace, found))]


def _batch_first_calls(trace: Trace, ops: pd.DataFrame) -> set[int]:
    """The encoder layer calls whose input is batch-first (B, T, D): torch's fast path
    needs batch_first=True, and nn.TransformerEncoderLayer's default, False, takes (T, B, D)
    and never takes it. B is the model call's batch where token ids tell it; otherwise the
    layer's attention tells the layout, as batch_first=True's nn.MultiheadAttention turns
    its input (B, T, D) into (T, B, D) before the in-projection (an image model's batch is
    never known from token ids: a ViT server's eval was claimed 0.5 ms a step of the 4.1 it
    saved). A call whose layout cannot be told (B equal to T) is left out."""
    batch = model_calls(trace).groupby("step")["batch"].max().to_dict()
    kept = set()
    for call, group in ops.sort_values("ts", kind="stable").groupby("call"):
        first = group.iloc[0]
        try:
            shapes = parse_shapes(str(first["shapes"]))
        except ValueError:
            continue
        if not shapes or len(shapes[0]) != 3 or shapes[0][0] == shapes[0][1]:
            continue
        b = batch.get(int(first["step"]), -1)
        if (shapes[0][0] == b) if b > 0 else _attention_transposes(group, tuple(shapes[0])):
            kept.add(int(call))
    return kept


def _attention_transposes(layer_ops: pd.DataFrame, shape: tuple[int, ...]) -> bool:
    """Whether a layer's self-attention holds its input `shape` (a, b, D) as (b, a, D)
    before its first matmul: the transpose batch_first=True makes."""
    attention = layer_ops[layer_ops["module"].astype(str).str.endswith(".self_attn")]
    swapped = [shape[1], shape[0], shape[2]]
    for row in attention.itertuples():
        if base_name(str(row.name)) in GEMM:
            return False
        try:
            if swapped in parse_shapes(str(row.shapes)):
                return True
        except ValueError:
            continue
    return False

