"""An optimizer whose state is created anew every step: constructed inside the loop.

Adam, AdamW, RMSprop and their kind create their state (zero-filled moment buffers, one
or two per parameter) lazily, in their first `step()`. A step after the first that zero-
fills buffers again, as many as the first did, belongs to a new optimizer (or one whose
state was cleared). That costs the state's ops every step, and, worse, restarts the
moments: every update is a first step's, with its bias correction. A user's loop that
built `Adam(model.parameters())` in each step lost 31% of its steps to it, and no finding
said so (`fused=True`, which one advised, made it slower).

The state's ops are the zero fills inside the optimizer's step slices (and the
allocations they fill); what constructing it once saves is the run replayed without them
in every step but the first recorded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer import tables
from neuron_explorer.analyses.phases import in_analysed_work
from neuron_explorer.analyses.steady_state import analysed_steps
from neuron_explorer.common import trace_format as tf
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make, step_time, top, us
from neuron_explorer.what_if.counterfactual import removal_saving_ns

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "optimizer_recreated"
FILL = "aten::zero_"  # how zeros_like fills a new state buffer
ALLOCATIONS = ("aten::empty_strided", "aten::empty_like", "aten::empty")


def state_ops(trace: Trace) -> pd.DataFrame:
    """The ops inside optimizer steps (`*.step` slices) that make state: the zero fills and
    the allocations beside them, with the optimizer's name (column `optimizer`)."""
    ops = trace.ops
    calls = tables.of_kind(trace, tf.CAT_OPTIMIZER)
    calls = calls[calls["name"].astype(str).str.endswith(".step")]
    if not len(ops) or not len(calls):
        return ops.iloc[:0]
    s = trace.table("slices")
    is_call = np.zeros(len(s), bool)
    is_call[calls["id"].to_numpy(np.int64)] = True
    owner = tables.ancestor_in(trace, ops["id"].to_numpy(np.int64), is_call)
    names = ops["name"].astype(str)
    making = (owner >= 0) & (names.isin([FILL, *ALLOCATIONS])).to_numpy()
    return ops[making].assign(optimizer=tables.slice_names(trace)[owner[making]].astype(str))


def remade_state(trace: Trace) -> tuple[pd.DataFrame, pd.Series]:
    """The state-making ops of the analysed steps after the first recorded one, where every
    such step fills as many new buffers as the first did (a new optimizer each step; none
    otherwise), and the fills per recorded step."""
    made = state_ops(trace)
    fills = made[made["name"].astype(str) == FILL]
    per_step = fills.groupby("step").size()
    if not len(fills) or fills["step"].nunique() < 2:
        return made.iloc[:0], per_step
    first = int(per_step.index.min())
    # the first recorded step creates the state of any optimizer; again in every analysed
    # step, as many buffers as then: a new optimizer each step
    analysed = in_analysed_work(trace, made)
    again = analysed[analysed["step"] != first]
    filled = again[again["name"].astype(str) == FILL].groupby("step").size()
    later = [s for s in analysed_steps(trace).steps if s != first]
    if not later or len(filled) < len(later) or int(filled.min()) < int(per_step[first]):
        return made.iloc[:0], per_step
    return again, per_step


def check(trace: Trace) -> list[Finding]:
    again, per_step = remade_state(trace)
    if not len(again):
        return []
    filled = again[again["name"].astype(str) == FILL].groupby("step").size()
    saving = removal_saving_ns(trace, again["id"].to_numpy(np.int64), RULE_ID)
    if saving is None or saving < th.OPTIMIZER_RECREATED_MIN_SHARE * step_time(trace):
        return []
    name = str(again["optimizer"].mode().iloc[0]).removesuffix(".step")
    buffers = int(filled.median())
    where = str(again["source"].astype(str).mode().iloc[0]) if "source" in again else ""
    host = float(again["dur"].sum())
    items = [evidence(r.ts, r.dur, [r.id], f"{r.name} in {r.optimizer} (step {r.step}): "
                      f"state made again, {us(r.dur)}") for r in top(again, "dur").itertuples()]
    return [make(
        trace, RULE_ID, f"{name}'s state is created again every step", saving, items,
        f"Every step's {name}.step fills {buffers} new state buffers with zeros, as its "
        f"first step did{f' (at {where})' if where else ''}: the optimizer is constructed "
        f"inside the loop (or its state cleared), {len(per_step)} times in this run. Its state "
        f"ops take {us(host)} of the host's op time in the analysed steps, and its moments "
        "restart every step: each update is a first step's (bias-corrected from nothing), "
        "not the optimizer you configured.",
        f"Construct {name} once, before the training loop, and keep it for the whole run "
        "(move the model to the device before constructing it, also once); change the "
        "learning rate through param_group['lr'] or a scheduler, not a new optimizer.",
        symptom_ns=host,
        saving_basis="replay: the run replayed without the state-making ops of every step "
                     "after the first")]
