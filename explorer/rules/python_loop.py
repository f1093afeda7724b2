"""A Python loop over the batch: lines of the step whose ops run N times a step on slices
of the data (a sample, a position), where one op over the whole tensor would do.

A user's loss looped over its 32 samples (`for i in range(logits.shape[0])`): 95% of the
step, and no finding named the loop (compiling, which host_bound advised, saved 1%: the
loop's `.item()` breaks the graph every iteration). A line's ops belong to such a loop when
the line issues at least `LOOP_MIN_ITERATIONS` ops of one name in every analysed step,
outside the backward, the optimizer and compiled graphs, each repeat in the same few
modules (a loop over a model's layers runs each in another). The loop's count of
iterations is the greatest count dividing every such count the smallest divides; one of
its ops reads a tensor with a dim of that many (the batch or sequence it slices), and no
iteration computes on the one before beyond a running sum (a recurrence, which no whole-
tensor op replaces). Its backward is per iteration too: at the line calling `backward()`,
in the modules the loop ran in, the op names run at least that many times a step.

What vectorising saves is the run replayed with each line's ops of one name run once per
iteration count: the first of each N kept, running all N's device work, the others (and
the reads to the host at those lines) gone.
"""

from __future__ import annotations

import json
from math import gcd
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer import tables
from neuron_explorer.analyses.phases import in_analysed_work
from neuron_explorer.common import trace_format as tf
from neuron_explorer.common.op_key_codec import parse_shapes
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make, step_time, top
from neuron_explorer.what_if.counterfactual import removal_saving_ns

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "python_loop"
LOOP_MIN_ITERATIONS = 16  # fewer repeats a step are not worth a loop's name


def _per_step(ops: pd.DataFrame) -> pd.DataFrame:
    """Per (source, op name): its count in each analysed step (steps as columns, 0 where
    absent)."""
    return ops.groupby(["source", "name", "step"]).size().unstack(fill_value=0)


def backward_call_lines(ops: pd.DataFrame) -> set[str]:
    """The source lines that run backward ops (`*_backward*`): the lines calling
    `backward()`, where a loss's backward runs outside any module's backward slice."""
    names = ops["name"].astype(str)
    return set(ops.loc[names.str.contains("backward", regex=False), "source"].astype(str))


def loop_lines(trace: Trace) -> tuple[list[str], int, pd.DataFrame]:
    """(the loop's lines, its iterations a step, the analysed forward ops on them); ([], 0,
    empty) where no line loops."""
    from neuron_explorer.rules import parameter_loop  # which imports this module
    ops = in_analysed_work(trace, trace.ops)
    if not len(ops):
        return [], 0, ops.iloc[:0]
    ops = ops.assign(source=ops["source"].astype(str), name=ops["name"].astype(str))
    outside = tables.ancestor_of_kind(trace, ops["id"].to_numpy(np.int64),
                                      (tf.CAT_BACKWARD, tf.CAT_OPTIMIZER)) < 0
    # the line that calls backward() runs the backward's ops outside any module's slice
    backward_lines = backward_call_lines(ops)
    forward = ops[outside & (ops["source"] != "").to_numpy()
                  & ~ops["source"].isin(backward_lines).to_numpy()]
    # an iteration does device work: ops that launch nothing (views a library call makes
    # per tensor, `clip_grad_norm_`'s 29 `as_strided`) are no loop a user could vectorise
    counts = _per_step(forward[forward["kernel_count"].to_numpy() > 0])
    # the first recorded step lacks what a loop runs after its optimizer step (a metric
    # over the batch's predictions): that lands in the next step, which begins there. A
    # user's per-sample accuracy loop, 68% of the step, was named by no finding.
    first = int(trace.steps["step"].min()) if len(trace.steps) else -1
    required = counts.drop(columns=[first]) if first in counts and counts.shape[1] > 2 \
        else counts
    steady = counts[(required.min(axis=1) >= LOOP_MIN_ITERATIONS)]
    if not len(steady):
        return [], 0, ops.iloc[:0]
    # the same few modules for all of a line's repeats of an op (a model called once per
    # sample runs its layers each time): a loop over a model's layers runs each in another
    calls = tables.ancestor_of_kind(trace, forward["id"].to_numpy(np.int64), (tf.CAT_MODULE,))
    names = tables.slice_names(trace)
    module = np.where(calls >= 0, names[np.maximum(calls, 0)].astype(str), "")
    modules = forward.assign(call_module=module).groupby(["source", "name"])[
        "call_module"].nunique().groupby(level="source").max()
    # a loop over the parameters is parameter_loop's (its fix is the foreach ops)
    theirs = set(parameter_loop.loop_body(trace)["source"])
    lines = [str(s) for s in steady.index.get_level_values("source").unique()
             if modules.get(s, 0) < LOOP_MIN_ITERATIONS // 2 and str(s) not in theirs]
    if not lines:
        return [], 0, ops.iloc[:0]
    # the repeat count: the greatest dividing every count that the smallest divides (an op
    # or two outside the loop on its line, `torch.stack` of its results, add one)
    counts = [int(v) for v in
              required.loc[steady.index].loc[lines].to_numpy().ravel().tolist()]
    iterations = 0
    for value in counts:
        if value % min(counts) == 0:
            iterations = gcd(iterations, value)
    body = forward[forward["source"].isin(lines)]
    if (iterations < LOOP_MIN_ITERATIONS or not _over_a_batch(body, iterations)
            or _recurrent(trace, body, iterations)):
        return [], 0, ops.iloc[:0]
    return lines, iterations, body


# ops that may take the last iteration's result in a loop that vectorises: a running sum
ACCUMULATING = frozenset({"aten::add", "aten::add_", "aten::sub", "aten::sub_"})


def _recurrent(trace: Trace, body: pd.DataFrame, iterations: int) -> bool:
    """Whether an iteration computes on the one before beyond a running sum (a recurrence:
    `h = tanh(x[:, t] @ W + h @ U)` reads the last `h` in its matmul), which no whole-
    tensor op replaces: by the ops' producers (how many ops back each input was made)."""
    if "op_id" not in body:
        return False
    group = body.groupby(["step", "source", "name"])
    per_iteration = (group["id"].transform("size") // iterations).clip(lower=1)
    iteration = (group.cumcount() // per_iteration).to_numpy()
    op_ids = body["op_id"].to_numpy(np.int64)
    iteration_of = dict(zip(op_ids.tolist(), iteration.tolist(), strict=True))
    producers = trace.slice_args.column(tf.ARG_PRODUCERS, body["id"].to_numpy(np.int64))
    names = body["name"].astype(str).to_numpy()
    for op_id, mine, name, made in zip(op_ids.tolist(), iteration.tolist(), names,
                                       producers, strict=True):
        if name in ACCUMULATING or not made:
            continue
        backs = json.loads(made) if isinstance(made, str) else made
        if any(k > 0 and iteration_of.get(op_id - k, mine) < mine for k in backs or ()):
            return True
    return False


def _over_a_batch(body: pd.DataFrame, iterations: int) -> bool:
    """Whether the loop takes its slices of a tensor with a dim of `iterations`
    (`logits[i]` or `logits[:, t]` reads the whole `logits` first; `pred[i]` of a batch's
    predictions, one dim: a user's per-sample accuracy loop, 68% of the step, got no
    finding) and launches no compiled graph: a loop over the parameters (clipping one by
    one) or over micro-batches (their compiled forward and backward) is no loop over a
    batch's slices."""
    if "graph_id" in body and (body["graph_id"].to_numpy() >= 0).any():
        return False
    for text in body["shapes"].astype(str).unique().tolist():
        try:
            shapes = parse_shapes(text)
        except ValueError:
            continue
        if any(isinstance(shape, list) and iterations in shape for shape in shapes):
            return True
    return False


def _backward_of_loop(trace: Trace, body: pd.DataFrame, iterations: int) -> pd.DataFrame:
    """The backward's ops per iteration: at the line calling backward(), in the modules the
    loop's forward ran in (none, for a loss written as a function), the names run at least
    `iterations` times in every analysed step."""
    ops = in_analysed_work(trace, trace.ops)
    ops = ops.assign(source=ops["source"].astype(str), name=ops["name"].astype(str))
    lines = backward_call_lines(ops)
    ops = ops[ops["source"].isin(lines).to_numpy()
              & (tables.ancestor_of_kind(trace, ops["id"].to_numpy(np.int64),
                                         (tf.CAT_OPTIMIZER,)) < 0)]
    names = tables.slice_names(trace)

    def module_of(frame: pd.DataFrame, kind: str) -> np.ndarray:
        at = tables.ancestor_of_kind(trace, frame["id"].to_numpy(np.int64), (kind,))
        return np.where(at >= 0, names[np.maximum(at, 0)].astype(str), "")

    looped = set(module_of(body, tf.CAT_MODULE).tolist())
    candidates = ops[np.isin(module_of(ops, tf.CAT_BACKWARD), list(looped))]
    if not len(candidates):
        return candidates.iloc[:0]
    counts = _per_step(candidates)
    keep = counts[counts.min(axis=1) >= iterations].index
    return candidates.set_index(["source", "name"]).loc[keep].reset_index() \
        if len(keep) else candidates.iloc[:0]


def collapsed_runs(trace: Trace, ops: pd.DataFrame, iterations: int
               ) -> tuple[list[int], dict[int, int]]:
    """Ops gone and kernel lengths when each (step, line, name) group runs once per
    `iterations`: the first of each run of `iterations` kept with all of their device work
    (an op's first kernel: a slice's op launches one)."""
    k = trace.kernels
    row_of = pd.Series(np.arange(len(k)), index=k["op_slice_id"].to_numpy(np.int64))
    row_of = row_of[~row_of.index.duplicated()]
    dur = k["dur"].to_numpy(np.int64)
    removed: list[int] = []
    lengths: dict[int, int] = {}
    for _, group in ops.sort_values("ts", kind="stable").groupby(["step", "source", "name"]):
        ids = group["id"].to_numpy(np.int64)
        rows = row_of.reindex(ids).to_numpy()
        for start in range(0, len(ids), iterations):
            chunk, chunk_rows = ids[start:start + iterations], rows[start:start + iterations]
            removed += chunk[1:].tolist()
            launched = chunk_rows[~np.isnan(chunk_rows)].astype(np.int64)
            if not np.isnan(chunk_rows[0]) and len(launched):
                lengths[int(chunk_rows[0])] = int(dur[launched].sum())
    return removed, lengths


def check(trace: Trace) -> list[Finding]:
    lines, iterations, body = loop_lines(trace)
    if not lines:
        return []
    backward = _backward_of_loop(trace, body, iterations)
    removed, lengths = collapsed_runs(trace, pd.concat([body, backward], ignore_index=True),
                                  iterations)
    syncs = tables.of_kind(trace, tf.CAT_SYNC)
    source = trace.args.texts(tf.ARG_SOURCE, syncs["id"].to_numpy(np.int64)) \
        if len(syncs) else np.zeros(0, object)
    looped_syncs = syncs[np.isin(np.asarray(source, object).astype(str), lines)] \
        if len(syncs) else syncs
    removed += looped_syncs["id"].tolist()
    saving = removal_saving_ns(trace, np.array(removed, np.int64), RULE_ID, lengths)
    if saving is None or saving < th.PYTHON_LOOP_MIN_SHARE * step_time(trace):
        return []
    steps = max(int(body["step"].nunique()), 1)
    per_step = (len(body) + len(backward)) / steps
    shown = lines_text(lines)
    reads = (f" and reads a value on the host {len(looped_syncs) // steps} times"
             if len(looped_syncs) else "")
    items = [evidence(r.ts, r.dur, [r.id], f"{r.name} at {r.source}, one of "
                      f"{iterations} a step") for r in top(body, "dur").itertuples()]
    return [make(
        trace, RULE_ID, f"A Python loop runs {iterations} iterations a step ({shown})", saving,
        items,
        f"The code at {shown} launches its ops {iterations} times a step, once per iteration of "
        f"a Python loop, each on a slice of the data (one sample, or one position): "
        f"{per_step:.0f} ops a step{' with their backward' if len(backward) else ''}{reads}. "
        "Each op is a launch that does "
        "one iteration's work; over the whole batch, one op does all of them.",
        f"Vectorise the loop at {shown}: compute its body on whole tensors (index with "
        "tensors: gather, masks, torch.where; reduce with sum/mean over a dim; call the model "
        "on the whole batch) instead of looping over its slices; torch.vmap vectorises a "
        "per-sample function as written. "
        + ("Compiling does not remove it: a loop that reads a value on the host breaks the "
           "graph every iteration." if len(looped_syncs) else
           "Compiling the function that holds the loop unrolls it into one graph, which "
           "saves about as much where the loop's length is fixed."),
        symptom_ns=float(body["dur"].sum() + backward["dur"].sum()),
        saving_basis="replay: the run replayed with the loop's ops (and its backward's) run "
                     "once a step, each doing all iterations' device work, and its reads gone")]


def lines_text(lines: list[str]) -> str:
    """"train.py:14-16" for a file's consecutive lines, else each as it is."""
    by_file: dict[str, list[int]] = {}
    others = []
    for source in lines:
        path, _, number = source.rpartition(":")
        if number.isdigit():
            by_file.setdefault(path, []).append(int(number))
        else:
            others.append(source)
    parts = []
    for path, numbers in by_file.items():
        numbers.sort()
        consecutive = numbers == list(range(numbers[0], numbers[-1] + 1))
        parts.append(f"{path}:{numbers[0]}-{numbers[-1]}" if consecutive and len(numbers) > 1
                     else ", ".join(f"{path}:{n}" for n in numbers))
    return ", ".join(parts + others)
