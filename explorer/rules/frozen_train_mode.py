"""A frozen model in training mode: in a run that trains, a top-level model that is only
ever called without grad (a distillation teacher, a target network, a copy that averages
the weights) and runs dropout or batch norm with batch statistics in its calls, because
`.eval()` was never called on it. Its outputs are not the model's (dropout zeroes values
at random; batch norm uses each batch's statistics and updates its running ones), and the
ops cost time in every step.

What `.eval()` saves is the run replayed without those ops (dropout, batch norm's step
count), as `train_mode_inference` counts them for a run that serves. A student's steps
lost 5% to its teacher's dropout, and no finding said so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from neuron_explorer.analyses.phases import in_analysed_work, training_steps
from neuron_explorer.common import trace_format as tf
from neuron_explorer.rules.finding import Finding, evidence, make, top, us
from neuron_explorer.rules.train_mode_inference import (
    DROPOUT_OPS,
    batch_norms_training,
    norm_step_counts,
)
from neuron_explorer.what_if.counterfactual import removal_saving_ns

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "frozen_train_mode"


def frozen_in_train_mode(trace: Trace) -> list[str]:
    """The top-level models of a run that trains whose every call ran without grad and in
    training mode (the recorder writes both on such calls)."""
    m = trace.modules
    if not len(m) or not training_steps(trace):
        return []
    calls = m[(m["depth"] == 0) & (m["phase"] == "forward")]
    ids = calls["id"].to_numpy(np.int64)
    grad = trace.slice_args.numbers(tf.ARG_GRAD, ids, 1, "int64")
    mode = trace.slice_args.numbers(tf.ARG_TRAINING, ids, -1, "int64")
    frozen = calls.assign(frozen=(grad == 0) & (mode == 1)).groupby("module")["frozen"].all()
    return [str(name) for name, all_frozen in frozen.items() if all_frozen]


def check(trace: Trace) -> list[Finding]:
    models = frozen_in_train_mode(trace)
    if not models:
        return []
    ops = in_analysed_work(trace, trace.ops)
    module = ops["module"].astype(str)
    inside = np.zeros(len(ops), bool)
    for name in models:
        inside |= (module == name).to_numpy() | module.str.startswith(name + ".").to_numpy()
    ops = ops[inside]
    dropouts = ops[ops["name"].astype(str).isin(DROPOUT_OPS)]
    norms = batch_norms_training(trace, ops)
    if not len(dropouts) and not len(norms):
        return []
    counts = norm_step_counts(ops, norms)
    removed = np.concatenate([dropouts["id"].to_numpy(np.int64),
                              counts["id"].to_numpy(np.int64)])
    saving = removal_saving_ns(trace, removed, RULE_ID)
    if saving is None:
        return []
    steps = max(int(ops["step"].nunique()), 1)
    parts = []
    if len(dropouts):
        parts.append(f"dropout zeroes values at random ({len(dropouts) // steps} a step)")
    if len(norms):
        parts.append("batch norm normalises each batch by its own statistics and updates its "
                     f"running ones ({len(norms) // steps} a step)")
    shown = dropouts if len(dropouts) else norms
    called = shown.sort_values("ts")["source"].astype(str).iloc[0]
    what = f"the model called at {called}" if called else "a model"
    names = ", ".join(f"`{n}`" for n in models)
    items = [evidence(r.ts, r.dur, [r.id], f"{r.name} in {r.module}: {us(r.dur)} on the host, "
                      f"{us(r.device_dur)} on the device")
             for r in top(shown, "dur").itertuples()]
    # fired at any size: the outputs are not the model's
    return [make(
        trace, RULE_ID, f"A frozen model runs in training mode ({what})", saving, items,
        f"{what.capitalize()} ({names} in the trace) is only ever called without grad, so "
        "nothing trains it (a teacher, a target network), yet it runs in training mode: "
        + "; ".join(parts) + ". Its outputs are not the trained model's, and the host issues "
        "and the device runs ops that eval mode leaves out.",
        "Call .eval() on it once, after loading it (model.train() on the model being trained "
        "does not reach it unless it is a submodule of that one): dropout then passes values "
        "through and batch norm uses the statistics it learned.",
        symptom_ns=float(shown["dur"].sum()) + float(counts["dur"].sum()),
        saving_basis="replay: the run replayed without dropout and batch norm's step count; "
                     "batch norm's kernels keep their recorded length")]
