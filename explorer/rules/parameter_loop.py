"""A Python loop over the parameters: clipping, an average of the weights, a decay written
as `for p in model.parameters()`, an op per parameter and term where one `torch._foreach_*`
op (or `clip_grad_norm_`, which uses them) does the whole list in a launch.

A user's gradient clipping written by hand (`total += p.grad.norm() ** 2` per parameter,
then `p.grad.mul_(coef)`) cost 43% of the step, and no finding named it: python_loop looks
for loops over a batch's slices, and the host-bound finding's fix (compiling the model)
leaves the loop as it was. `clip_grad_norm_` saved 4.1 ms of a 9.5 ms step.

A line's ops belong to such a loop when, outside the model's calls, the backward, the
optimizer and compiled graphs, they launch kernels at least `MIN_PARAMETERS` times in every
analysed step, and the first tensors one of its op names reads are the parameters' shapes
in the optimizer's order (its `_foreach_*` and fused ops list them; with several parameter
groups, whose order is not the model's, as a multiset). What the foreach form saves is the
run replayed with each line's ops of one name that has a foreach form run once a step,
doing all of their device work; ops without one (`randn_like`) stay as they ran.

A loop whose every op has a foreach form (an average of the weights, a decay) can also be
compiled: one launch, and each parameter's ops one pass over its memory, where the foreach
ops pass over every tensor once per op. Replayed as one program per run of the loop's ops,
fused along their recorded data flow, that saves more on a run the device paces: an
average of the weights on a compiled model cost 7.5% of the step, its foreach form saved
1.3% (under the threshold: no finding) and compiling it 4.8%, 3.8% claimed. The finding
claims and advises whichever saves more; a clipping keeps `clip_grad_norm_` (compiled,
trial 5's clipping ran slower than its foreach ops).
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer import tables
from neuron_explorer.analyses.phases import in_analysed_work
from neuron_explorer.common import trace_format as tf
from neuron_explorer.common.op_key_codec import parse_shapes
from neuron_explorer.memo import memoised
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make, step_time, top
from neuron_explorer.rules.python_loop import collapsed_runs, lines_text
from neuron_explorer.what_if.counterfactual import removal_saving_ns

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "parameter_loop"
MIN_PARAMETERS = 4  # a loop over fewer tensors is no loop worth a launch's name
# ops a norm of a gradient runs as: the loop is a clipping, `clip_grad_norm_` its fix
NORMS = frozenset({"aten::linalg_vector_norm", "aten::norm", "aten::frobenius_norm"})
# a gradient's finiteness check: `torch.isfinite(g)` runs as abs, eq and ne
FINITE_CHECKS = frozenset({"aten::isfinite", "aten::isinf", "aten::isnan"})
FINITE_PARTS = frozenset({"aten::abs", "aten::eq", "aten::ne"})
# in-place and plain ops torch has a `_foreach_` form of (torch._foreach_<name>)
FOREACH = frozenset({"add", "sub", "mul", "div", "lerp", "addcmul", "addcdiv", "copy", "zero",
                     "sqrt", "pow", "abs", "neg", "exp", "sign", "clamp_min", "clamp_max",
                     "maximum", "minimum", "norm"})

Shape = tuple[int, ...]


def parameter_groups(trace: Trace) -> list[list[Shape]]:
    """The optimizer's parameter groups, as each group's parameters' shapes in its order,
    read from the tensor lists its ops take in one analysed step: a `_foreach_*` op takes a
    group's parameters once (sqrt, div) or with their state beside them (lerp: parameters
    and averages), so a group's list is a list no shorter list repeats into; a fused op
    takes parameters, gradients and state, then a step count per parameter. [] where no
    optimizer step lists them (one looping per parameter, no optimizer)."""
    ops = in_analysed_work(trace, trace.ops)
    names = ops["name"].astype(str)
    listed = ops[(names.str.startswith("aten::_foreach_") | names.str.startswith("aten::_fused_"))
                 .to_numpy()]
    if not len(listed):
        return []
    listed = listed[tables.ancestor_of_kind(trace, listed["id"].to_numpy(np.int64),
                                            (tf.CAT_OPTIMIZER,)) >= 0]
    if not len(listed):
        return []
    one_step = listed[listed["step"] == listed["step"].min()].sort_values("ts", kind="stable")
    lists: list[list[Shape]] = []
    for name, text in zip(one_step["name"].astype(str), one_step["shapes"].astype(str),
                          strict=True):
        shapes = _shapes(text)
        if name.startswith("aten::_fused_"):  # params, grads, state..., a step count each
            counts = sum(1 for _ in itertools.takewhile(lambda shape: shape == (),
                                                        reversed(shapes)))
            shapes = shapes[:counts]
        if any(shapes) and shapes not in lists:  # a list of scalars is the step counts'
            lists.append(shapes)
    return [mine for mine in lists
            if not any(len(other) < len(mine) and len(mine) % len(other) == 0
                       and mine == other * (len(mine) // len(other)) for other in lists)]


def _shapes(text: str) -> list[Shape]:
    try:
        parsed = parse_shapes(text)
    except ValueError:
        return []
    return [tuple(s) if isinstance(s, list) else () for s in parsed]


def _runs_through(seen: list[Shape], groups: list[list[Shape]]) -> bool:
    """Whether `seen` runs through the parameters (a subset of them, or all of them several
    times over): in their order where the optimizer has one group; with several, whose
    order is the groups' and not the model's, as a multiset."""
    parameters = [shape for group in groups for shape in group]
    rounds = -(-len(seen) // len(parameters))
    if len(groups) > 1:
        return not Counter(seen) - Counter(parameters * rounds)
    it = iter(parameters * rounds)
    return all(any(shape == p for p in it) for shape in seen)


def loop_body(trace: Trace) -> pd.DataFrame:
    """The analysed ops of the lines looping over the parameters (empty where none)."""
    return memoised(trace, "parameter_loop_body", lambda: _loop_body(trace))


def _loop_body(trace: Trace) -> pd.DataFrame:
    groups = parameter_groups(trace)
    parameters = sum(len(group) for group in groups)
    ops = in_analysed_work(trace, trace.ops)
    if parameters < MIN_PARAMETERS or not len(ops):
        return ops.iloc[:0]
    outside = tables.ancestor_of_kind(
        trace, ops["id"].to_numpy(np.int64),
        (tf.CAT_MODULE, tf.CAT_BACKWARD, tf.CAT_OPTIMIZER)) < 0
    eager = ops["graph_id"].to_numpy() < 0 if "graph_id" in ops else np.ones(len(ops), bool)
    ops = ops[outside & eager & (ops["kernel_count"].to_numpy() > 0)
              & (ops["source"].astype(str) != "").to_numpy()]
    ops = ops.assign(source=ops["source"].astype(str), name=ops["name"].astype(str))
    counts = ops.groupby(["source", "name", "step"]).size().unstack(fill_value=0)
    # a loop after the optimizer's step (an average of the weights) runs in the step after:
    # the first recorded step lacks it
    first = int(trace.steps["step"].min()) if len(trace.steps) else -1
    required = counts.drop(columns=[first]) if first in counts and counts.shape[1] > 2 \
        else counts
    repeated = required[required.min(axis=1) >= MIN_PARAMETERS].index
    if not len(repeated):
        return ops.iloc[:0]
    lines: dict[str, int] = {}
    for source, name in repeated:
        step = required.loc[(source, name)].idxmin()  # a step it ran in
        one = ops[(ops["source"] == source) & (ops["name"] == name)
                  & (ops["step"] == step)].sort_values("ts", kind="stable")
        seen = [shapes[0] if shapes else () for shapes in
                (_shapes(text) for text in one["shapes"].astype(str).tolist())]
        # one shape over and over is a loop over something else, unless it is every one
        if (len(set(seen)) > 1 or len(seen) == parameters) and _runs_through(seen, groups):
            lines[source] = max(lines.get(source, 0), len(seen))
    keys = [key for key in repeated if key[0] in lines]
    if not keys:
        return ops.iloc[:0]
    index = pd.MultiIndex.from_frame(ops[["source", "name"]])
    # how many parameters the loop runs over: its lines' most a name ran on one of them
    return ops[index.isin(keys)].assign(looped=max(lines.values()))


def _checks_finite(names: set[str]) -> bool:
    return bool(names & FINITE_CHECKS) or names >= FINITE_PARTS


def _base(name: str) -> str:
    return name.removeprefix("aten::").rstrip("_")


def _has_foreach_form(name: str) -> bool:
    """Whether one op over the list does this op's work for every tensor."""
    return _base(name) in FOREACH or name in NORMS or _base(name) == "clamp"


def _foreach_forms(names: set[str]) -> list[str]:
    forms = set()
    for name in names:
        op = name.removeprefix("aten::")
        if _base(name) == "clamp":  # no _foreach_clamp_: its bounds are two ops
            forms |= {"torch._foreach_clamp_min_", "torch._foreach_clamp_max_"}
        elif _base(name) in FOREACH:
            forms.add(f"torch._foreach_{op}")
    return sorted(forms)


def _advice(names: set[str], others: set[str]) -> str:
    forms = _foreach_forms(names)
    foreach = ("the `torch._foreach_*` ops over the list of tensors"
               + (f" ({', '.join(forms)})" if forms else "") + ", one launch each for all of them")
    left = (f" {', '.join(sorted(others))} {'has' if len(others) == 1 else 'have'} no foreach "
            "form and stay one launch a parameter (not counted in the saving), unless one "
            "op makes the values for all (torch.randn(total).split(sizes) for noise)."
            if others else "")
    if names & NORMS:
        return ("Clip with torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm) "
                f"instead of the loop: it computes every norm with one _foreach_norm and "
                f"scales every gradient with one _foreach_mul_; for another loop, {foreach}."
                + left)
    if _checks_finite(names):
        return ("Check the gradients with one torch._amp_foreach_non_finite_check_and_unscale_"
                "(grads, found_inf, inv_scale) (what torch.amp.GradScaler does; it unscales "
                "them in the same pass) instead of a check per gradient; under bf16 autocast "
                "the gradients need no loss scaling, and no check, at all.")
    return f"Replace the loop with {foreach}." + left


def compiled_saving_ns(trace: Trace, body: pd.DataFrame) -> float | None:
    """What compiling the loop saves: each step's runs of its ops (those with no other
    launch between them) replayed as one program each, fused along their recorded data
    flow (each parameter's ops one pass over its memory), launched where the run's first
    op was. None where a run's program cannot be built."""
    from neuron_explorer.what_if.counterfactual import op_kernel_rows
    from neuron_explorer.what_if.into_graphs import fused_ns

    rows = op_kernel_rows(trace)
    launching = in_analysed_work(trace, trace.ops)
    launching = launching[launching["kernel_count"].to_numpy() > 0]
    removed: list[int] = []
    lengths: dict[int, int] = {}
    programs: dict[tuple, float | None] = {}
    for step, mine in body.groupby("step"):
        order = launching[launching["step"] == step].sort_values("ts", kind="stable")
        inside = order["id"].isin(mine["id"]).to_numpy()
        # a new run at each loop op that follows another launch
        run = np.cumsum(inside & ~np.concatenate([[False], inside[:-1]]))
        for number in np.unique(run[inside]):
            ops = order[inside & (run == number)]
            length = fused_ns(trace, ops, programs)
            first = rows.get(int(ops["id"].iloc[0]))
            if length is None or not first:
                return None
            lengths[first[0]] = int(length)
            lengths.update((row, 0) for row in first[1:])
            removed += ops["id"].iloc[1:].tolist()
    return removal_saving_ns(trace, np.array(removed, np.int64), f"{RULE_ID}:compiled",
                             lengths)


def check(trace: Trace) -> list[Finding]:
    body = loop_body(trace)
    if not len(body):
        return []
    names = set(body["name"])
    finite = _checks_finite(names)
    # what the foreach form replaces: an op per name (a finiteness check: one for the whole
    # check); ops without such a form (randn_like for noise) stay one a parameter
    foreach = body[body["name"].map(_has_foreach_form).to_numpy(bool) | finite]
    if not len(foreach):
        return []
    replayed = foreach.assign(name="check") if finite else foreach
    per_step = replayed.groupby(["step", "source", "name"]).size()
    removed, lengths = collapsed_runs(trace, replayed, int(per_step.max()))
    saving = removal_saving_ns(trace, np.array(removed, np.int64), RULE_ID, lengths)
    # a clipping's fix is clip_grad_norm_ (compiled, trial 5's clipping ran 5% slower than
    # its foreach ops), a check's the one foreach check
    # (and a loop with ops of no foreach form, as noise drawn per parameter, keeps its advice)
    fused = (None if finite or names & NORMS or len(foreach) < len(body)
             else compiled_saving_ns(trace, body))
    compile_it = fused is not None and (saving is None or fused > saving)
    if compile_it:
        saving = fused
    if saving is None or saving < th.PARAMETER_LOOP_MIN_SHARE * step_time(trace):
        return []
    shown = lines_text(sorted(set(body["source"])))
    steps = max(int(body["step"].nunique()), 1)
    # the count the loop ran, not the optimizer's lists: an SGD step's shortest list holds
    # parameters and gradients
    over = f"{int(body['looped'].iloc[0])} parameters"
    items = [evidence(r.ts, r.dur, [r.id], f"{r.name} at {r.source}, one per parameter")
             for r in top(body, "dur").itertuples()]
    return [make(
        trace, RULE_ID,
        f"A Python loop over {over} launches {len(body) / steps:.0f} ops a step ({shown})",
        saving, items,
        f"The code at {shown} runs its ops once per parameter ({over}), outside the model "
        f"and the optimizer: {len(body) / steps:.0f} launches a step, "
        + ("each a pass of its own over its tensor's memory, where compiled code passes "
           "over each parameter once for all its ops." if compile_it else
           "each one the host pays for, where one op over the list of tensors does the same "
           "work in one launch."),
        _compile_advice(names) if compile_it else
        _advice(names, {n for n in names if not _has_foreach_form(n)} if not finite else set()),
        symptom_ns=float(body["dur"].sum()),
        saving_basis=_COMPILED_BASIS if compile_it else
        ("replay: the run replayed with the whole check run as one op a step" if finite else
         "replay: the run replayed with each of the loop's op names that has a foreach form "
         "run once a step") + ", doing the device work of all its launches")]


_COMPILED_BASIS = ("replay: the run replayed with the loop compiled, each step's run of its "
                   "ops one program fused along their recorded data flow (each parameter's "
                   "ops one pass over its memory), launched where the run began; it saves "
                   "more than the foreach form here, whose ops each pass over every tensor")


def _compile_advice(names: set[str]) -> str:
    """Compile the loop: where the device paces the run, fusing each parameter's ops into
    one pass saves more than launching them once for all."""
    average = {_base(n) for n in names} <= {"mul", "add", "sub", "lerp"}
    return ("Compile the loop: put it in a function decorated with "
            "@torch.compile(backend=\"neuron\") and call that, so that one launch does every "
            "parameter and each parameter's ops fuse into one pass over its memory; the "
            "foreach ops save the launches but pass over every tensor once per op."
            + (" For an average of the weights, torch._foreach_lerp_(averages, weights, "
               "1 - decay) is one op and one pass too." if average else ""))

