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
from neuron_explorer.common.op_key_codec import OpKeyError, decode
from neuron_explorer.rules.finding import Finding, evidence, make, top, us
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
    grad_on = bool((calls["grad"] == 1).any())
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
        + (" Autograd also records every pass (grad mode is on): its bookkeeping is in each "
           "op's host time and is not counted here." if grad_on else ""),
        f"Call {model}.eval() before serving"
        + (", and serve under torch.inference_mode() (or torch.no_grad())" if grad_on else "")
        + ": dropout then passes values through and batch norm uses the statistics it "
        "learned. (Dropout kept on at inference on purpose, Monte Carlo dropout, is the "
        "exception.)",
        symptom_ns=float(shown["dur"].sum()),
        saving_basis="replay: the run replayed without dropout and batch norm's step count; "
                     "batch norm's kernels keep their recorded length" if len(removed) else
                     "estimate: inside compiled graphs, not counted")]

