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
from neuron_explorer.analyses.levels import recorded_level
from neuron_explorer.analyses.phases import in_analysed_work, model_calls, training_steps
from neuron_explorer.common import trace_format as tf
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
_TRAINING_ATTR = '["training",true]'


def _batch_norms_training(trace: Trace, ops: pd.DataFrame) -> pd.DataFrame:
    """The batch-norm ops that computed batch statistics (their key says training)."""
    bn = ops[ops["name"].astype(str).isin(BATCH_NORM_OPS)]
    if not len(bn):
        return bn
    keys = trace.slice_args.texts(tf.ARG_OP_KEY, bn["id"].to_numpy(np.int64))
    return bn[[_TRAINING_ATTR in str(k) for k in keys]]


def _counts(ops: pd.DataFrame, norms: pd.DataFrame) -> pd.DataFrame:
    """Each training batch norm's `num_batches_tracked += 1`: an in-place add to an int64
    scalar in the same module and step."""
    adds = ops[(ops["name"].astype(str) == "aten::add_")
               & (ops["dtypes"].astype(str) == "[int64]") & (ops["shapes"].astype(str) == "[[]]")]
    where = set(zip(norms["module"].astype(str), norms["step"], strict=True))
    keep = [(m, s) in where for m, s in zip(adds["module"].astype(str), adds["step"], strict=True)]
    return adds[keep]


def check(trace: Trace) -> list[Finding]:
    if recorded_level(trace) is None or training_steps(trace):
        return []  # not our recording (no grad mode), or a run that trains
    calls = model_calls(trace)
    ops = in_analysed_work(trace, trace.ops)
    if not len(calls) or not len(ops):
        return []
    dropouts = ops[ops["name"].astype(str).isin(DROPOUT_OPS)]
    norms = _batch_norms_training(trace, ops)
    if not len(dropouts) and not len(norms):
        return []
    counts = _counts(ops, norms)
    removed = np.concatenate([dropouts["id"].to_numpy(np.int64),
                              counts["id"].to_numpy(np.int64)])
    saving = removal_saving_ns(trace, removed, RULE_ID) if len(removed) else 0.0
    if saving is None:
        return []
    shown = pd.concat([dropouts, norms, counts])
    # the model: the outermost module of the training-mode ops ("model.features.0.1")
    model = shown["module"].astype(str).str.split(".").str[0].mode().iloc[0] or "model"
    n_steps = max(int(ops["step"].nunique()), 1)
    parts = []
    if len(dropouts):
        parts.append(f"dropout zeroes values at random ({len(dropouts) // n_steps} a step)")
    if len(norms):
        parts.append("batch norm normalises each batch by its own statistics and updates its "
                     f"running ones ({len(norms) // n_steps} a step)")
    grad_on = bool((calls["grad"] == 1).any())
    items = [evidence(r.ts, r.dur, [r.id], f"{r.name} in {r.module}: {us(r.dur)} on the host, "
                      f"{us(r.device_dur)} on the device")
             for r in top(shown, "dur").itertuples()]
    # fired at any size: the outputs are not the trained model's
    return [make(
        trace, RULE_ID, "The model serves in training mode", saving, items,
        f"No step trains (no backward, no optimizer step), yet {model} runs in training mode: "
        + "; ".join(parts) + ". Its outputs are not the trained model's, and the host issues "
        "and the device runs ops that eval mode leaves out."
        + (" Autograd also records every pass (grad mode is on): its bookkeeping is in each "
           "op's host time and is not counted here." if grad_on else ""),
        f"Call {model}.eval() before serving"
        + (", and serve under torch.inference_mode() (or torch.no_grad())" if grad_on else "")
        + ": dropout then passes values through and batch norm uses the statistics it "
        "learned. (Dropout kept on at inference on purpose, Monte Carlo dropout, is the "
        "exception.)",
        symptom_ns=float(shown["dur"].sum()),
        saving_basis="replay: the run replayed without dropout and batch norm's step count; "
                     "batch norm's kernels keep their recorded length")]
