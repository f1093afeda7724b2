"""A compiled function that recompiles for each new size of one input dimension: the KV
cache of a decoder growing by a token a call, or prompts of many lengths.

Dynamo guards on every size of a graph it traced with static sizes; a call with a new
size fails the guard ("tensor 'cache[0][0]' size mismatch at index 2. expected 26,
actual 27") and compiles the function again. Once is normal: by default Dynamo then
traces that dimension as symbolic. Many times means the sizes are kept static
(`dynamic=False`, `mark_static`, automatic dynamic shapes turned off), and every new
length pays a whole compile.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.analyses.compilation import compile_spans, compiling_alone
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make, us
from neuron_explorer.rules.graph_break_cost import UNCOMPILED_BASIS, uncompiled_calls_saving_ns

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "shape_recompiles"
# what its share of time is of: its time lies outside the analysed steps
SHARE_BASE = "the recorded steps"

# Dynamo's failed size guard, after the compile id ("0/3: ") of the entry that failed
_SIZE_GUARD = re.compile(r"^(\d+)/\d+: tensor '([^']+)' size mismatch at index (\d+)\. "
                         r"expected (\d+), actual (\d+)")
# Dynamo's own span of a frame's compile: "dynamo 0/3" (frame 0, its 4th compile)
_FRAME_COMPILE = re.compile(r"^dynamo (\d+)/(\d+)$")
# Dynamo's default torch._dynamo.config.recompile_limit: it runs a frame uncompiled after
RECOMPILE_LIMIT = 8


def repeated_size_recompiles(trace: Trace) -> pd.DataFrame:
    """The recompiles whose failed guard is the size of one dimension of a tensor input,
    for dimensions that recompiled at least `SHAPE_RECOMPILES_MIN` times: the
    recompiles' columns with frame, input, dim, expected and actual (sizes)."""
    rec = trace.compile_summary()["recompiles"]
    parsed = rec["reason"].str.extract(_SIZE_GUARD)
    parsed.columns = ["frame", "input", "dim", "expected", "actual"]
    rec = pd.concat([rec, parsed], axis=1).dropna(subset=["input"])
    rec = rec.astype({"frame": int, "dim": int, "expected": int, "actual": int})
    counts = rec.groupby(["frame", "input", "dim"])["id"].transform("size")
    return rec[counts >= th.SHAPE_RECOMPILES_MIN].reset_index(drop=True)


def check(trace: Trace) -> list[Finding]:
    rec = repeated_size_recompiles(trace)
    if not len(rec):
        return []
    spans = compile_spans(trace)
    return [_finding(trace, group, spans)
            for _, group in rec.groupby(["frame", "input", "dim"], sort=False)]


def _finding(trace: Trace, rec: pd.DataFrame, spans: pd.DataFrame) -> Finding:
    name, dim, n = str(rec["input"].iloc[0]), int(rec["dim"].iloc[0]), len(rec)
    # each recompile's own compile time: the spans it opened (Dynamo's, AOTAutograd's, the
    # backend's), which start where the recompile is recorded
    starts, ends = spans["ts"].to_numpy(np.int64), (spans["ts"] + spans["dur"]).to_numpy(np.int64)
    at = rec["ts"].to_numpy(np.int64)
    opened = (starts[:, None] <= at) & (at < ends[:, None])  # span x recompile
    # compiling alone: the program's own ops run inside the spans are not compile time
    each = np.array([compiling_alone(trace, spans[opened[:, i]]).total for i in range(n)])
    mine = opened.any(axis=1)
    total = float(each.sum())
    steps = sorted({int(s) for s in rec["step"] if s >= 0})
    on_path = 0.0
    if steps and mine.any():
        from neuron_explorer.analyses.path_share import time_on_path

        compiling = compiling_alone(trace, spans[mine])
        on_path = time_on_path(trace, compiling.starts, compiling.ends, "host", steps=steps)
    # the fix still compiles the graph once (for any size, or the one fixed size): it
    # saves all but one of these compiles, the mean of theirs
    saving = on_path * (n - 1) / n
    basis = ("critical path: the recompiles' compile time on the critical path of their "
             "steps, less one compile (the fixed program still compiles once: the mean of "
             "these)")
    eager_note, uncompiled = ran_uncompiled_after(trace, int(rec["frame"].iloc[0]),
                                                  int(rec["step"].max()))
    eager_saving = uncompiled_calls_saving_ns(trace, uncompiled) if uncompiled else None
    if eager_saving:
        saving += eager_saving
        basis += "; " + UNCOMPILED_BASIS
        eager_note += (f" Compiled, those steps' calls save {us(eager_saving)} (counted in "
                       "the saving).")
    elif uncompiled:
        eager_note += " The saving leaves out what compiling those steps would save."
    sizes = sorted(set(rec["expected"]) | set(rec["actual"]))
    grows = bool(((rec["actual"] - rec["expected"]) == 1).all())
    decoding = grows or _in_decode(trace, steps)
    source = next((s for s in rec["source"] if s), "")
    where = f"The function at {source}" if source else "A compiled function"
    what = ("the sequence length of a KV cache, one longer every decode step" if decoding
            else "a length that differs between calls")
    explanation = (
        f"{where} recompiled {n} times because dim {dim} of its input {name} changed: "
        f"{_sizes(sizes)} ({what}). Dynamo guards on every size of a graph traced with "
        f"static sizes, so each new size fails the guard and compiles the function again: "
        f"{us(total / n)} of host time each, {us(total)} in all"
        + (f", in {_steps(steps)}" if steps else "") + "." + eager_note)
    items = [evidence(r.ts, int(cost), [r.id],
                      f"recompile for {name} dim {dim} = {r.actual} (was {r.expected}): "
                      f"{us(cost)}") for r, cost in zip(rec.itertuples(), each, strict=True)]
    steps_ns = float(trace.steps["dur"].sum()) if len(trace.steps) else 0.0
    return make(trace, RULE_ID, f"{n} recompiles, one per new size of {name} dim {dim}",
                saving, items, explanation, _recommendation(name, dim, decoding),
                share_of=steps_ns or None, symptom_ns=total, saving_basis=basis)


def _recommendation(name: str, dim: int, decoding: bool) -> str:
    fixed = ("a static KV cache: allocate it once at the maximum length, write each step's "
             "keys and values into it in place (index_copy_ at the step's positions) and "
             "mask attention to the positions filled so far" if decoding else
             "pad the inputs to one fixed size")
    return (f"Keep the sizes fixed, or let one graph take them all. Fixed: {fixed}; every "
            f"call then has the same sizes and one graph serves them. One graph for all "
            f"sizes: torch._dynamo.mark_dynamic(t, {dim}) on {name} and each tensor like it "
            "before the call, rather than keeping sizes static (dynamic=False, mark_static "
            "or automatic_dynamic_shapes=False compile each size); "
            "torch.compile(..., dynamic=True) makes every dim of every input dynamic, a "
            "compile that can cost as much as the recompiles it saves (one such compile took "
            "3.8-4.5 s where marking the dim saved 2.97 of 3.1 s). Or bucket: pad each length "
            "up to one of a few sizes (multiples of 64, say), so that only those compile.")


def _in_decode(trace: Trace, steps: list[int]) -> bool:
    """Whether the recompiles ran in decode steps (`Trace.phases()`)."""
    phases = trace.phases()
    return bool(len(phases)) and bool(
        (phases[phases["step"].isin(steps)]["phase"] == "decode").any())


_AOT_COMPILE = re.compile(r"^aot_autograd (\d+)/\d+$")


def frame_graphs(trace: Trace, frame: int) -> set[int]:
    """The graphs Dynamo's frame `frame` compiled: each graph's compile starts with its
    frame's AOTAutograd span ("aot_autograd 5/1")."""
    spans = compile_spans(trace)
    starts = {int(ts) for name, ts in zip(spans["name"], spans["ts"], strict=True)
              if (m := _AOT_COMPILE.match(str(name))) and int(m.group(1)) == frame}
    graphs = trace.compile_summary()["graphs"]
    return {int(g) for g, ts in zip(graphs["graph_id"], graphs["ts"], strict=True)
            if g >= 0 and int(ts) in starts}


def ran_uncompiled_after(trace: Trace, frame: int, last: int) -> tuple[str, list[int]]:
    """A note, and the steps, when no compiled graph ran in the steps after step `last` (that
    of frame `frame`'s last recompile) while they did before: Dynamo stopped compiling the
    function."""
    ops = trace.ops
    if not len(ops) or "graph_id" not in ops or last < 0:
        return "", []
    later = trace.steps[trace.steps["step"] > last]["step"]
    graphs = ops[ops["graph_id"].fillna(-1) >= 0]  # launches of compiled graphs
    mine = frame_graphs(trace, frame)
    if mine:  # the frame's own graphs: a compiled optimizer step past its limit runs
        # uncompiled while the model's graphs, another frame's, still run
        graphs = graphs[graphs["graph_id"].isin(mine)]
    if not len(later) or graphs["step"].isin(later).any() or not graphs["step"].le(last).any():
        return "", []
    compiles = [int(m.group(2)) + 1 for m in map(_FRAME_COMPILE.match, compile_spans(trace)["name"])
                if m and int(m.group(1)) == frame]
    limit = (f" after {max(compiles)} compiles, Dynamo's recompile limit "
             f"(torch._dynamo.config.recompile_limit, {RECOMPILE_LIMIT} by default)"
             if compiles and max(compiles) >= RECOMPILE_LIMIT else "")
    ran = "none of its graphs ran" if mine else "no compiled graph ran"
    note = f" From step {int(later.iloc[0])} {ran}: the function ran uncompiled{limit}."
    return note, [int(x) for x in later]


def _sizes(sizes: list[int]) -> str:
    if len(sizes) > 6 and sizes == list(range(sizes[0], sizes[-1] + 1)):
        return f"sizes {sizes[0]} to {sizes[-1]}"
    shown = ", ".join(map(str, sizes[:8]))
    return f"sizes {shown}" + (f" and {len(sizes) - 8} more" if len(sizes) > 8 else "")


def _steps(steps: list[int]) -> str:
    if len(steps) > 3 and steps == list(range(steps[0], steps[-1] + 1)):
        return f"steps {steps[0]}–{steps[-1]}"
    return ("step " if len(steps) == 1 else "steps ") + ", ".join(map(str, steps))
