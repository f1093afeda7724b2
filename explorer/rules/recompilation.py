"""Graph breaks and recompilations inside the step, and recompilation storms."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.analyses.compilation import compile_spans, compiling_alone
from neuron_explorer.common.intervals import Union
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make, trains, us
from neuron_explorer.rules.graph_break_cost import (
    MERGED_BASIS,
    READS_GONE_BASIS,
    RNN_TRACED_BASIS,
    UNCOMPILED_BASIS,
    merged_graphs_saving_ns,
    reads_gone_saving_ns,
    rnn_traced_saving_ns,
    uncompiled_calls_saving_ns,
)
from neuron_explorer.rules.shape_recompiles import ran_uncompiled_after, repeated_size_recompiles

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "recompilation"
# a file of the installed package (its reference workloads are user code)
_INSTALLED = re.compile(r"[/\\](?:site|dist)-packages[/\\]neuron_explorer[/\\](?!workloads)")
# what its share of time is of: its time lies outside the analysed steps
SHARE_BASE = "the recorded steps"


def check(trace: Trace) -> list[Finding]:
    cs = trace.compile_summary()
    breaks = cs["graph_breaks"]
    # breaks in the tool's own code are none of the user's to fix (traces recorded while
    # Dynamo still compiled the device's kernels after a break of the user's)
    breaks = breaks[~breaks["source"].map(_in_the_tool).astype(bool)]
    # Dynamo reports its recompile limit as a graph break: what follows is the recompiles'
    # (calls that needed another graph ran uncompiled), not a break in the user's code
    at_limit = breaks["reason"].astype(str).str.contains(LIMIT_BREAK, regex=False)
    limit_step = int(breaks["step"][at_limit].min()) if at_limit.any() else -1
    breaks = breaks[~at_limit.to_numpy(bool)]
    recompiles = cs["recompiles"]
    # recompiles for each new size of one dimension are shape_recompiles' finding
    per_size = repeated_size_recompiles(trace)
    recompiles = recompiles[~recompiles["id"].isin(per_size["id"])]
    in_step_breaks = breaks[breaks["step"] >= 0] if len(trace.steps) else breaks
    in_step_rec = recompiles[recompiles["step"] >= 0] if len(trace.steps) else recompiles
    # graphs the run needs, each compiled once (a module each, a grad mode each): no storm
    needed = _needed_graphs(list(recompiles["reason"])) if len(recompiles) else None
    storm = len(recompiles) >= th.RECOMPILE_STORM and needed is None
    if not len(in_step_breaks) and not len(in_step_rec) and not storm:
        return []
    spans = compile_spans(trace)
    if len(in_step_rec) and not len(in_step_breaks):
        # only the recompiles' own compile time: the span each one opened, not the first
        # compile of every graph
        starts, ends = spans["ts"].to_numpy(), (spans["ts"] + spans["dur"]).to_numpy()
        at = in_step_rec["ts"].to_numpy()
        spans = spans[((starts[:, None] <= at) & (at < ends[:, None])).any(axis=1)]
    lost = saving = 0.0
    steps_ns = float(trace.steps["dur"].sum()) if len(trace.steps) else 0.0
    if len(trace.steps) and len(spans):
        u = compiling_alone(trace, spans)
        st = trace.steps
        inside = u.covered(st["ts"].to_numpy(), (st["ts"] + st["dur"]).to_numpy())
        lost = float(inside.sum())
        saving = _saving(trace, u, st["step"].to_numpy()[inside > 0])
    items = []
    for label, frame in (("graph break", in_step_breaks), ("recompile", in_step_rec)):
        for r in frame.itertuples():
            where = f" at {r.source}" if r.source else ""
            items.append(evidence(r.ts, 0, [r.id], f"{label}{where}: {r.reason or 'no reason'}"))
    reasons = sorted({r for r in list(in_step_breaks["reason"]) + list(in_step_rec["reason"]) if r})
    counted = [_plural(len(in_step_breaks), "graph break"), _plural(len(in_step_rec), "recompile")]
    title = (f"Recompilation storm: {len(recompiles)} recompiles" if storm else
             " and ".join(c for c in counted if c) + " in steps")
    # a switch of grad mode (training, then evaluation), another module through one
    # compiled wrapper, an input detached in one call: a graph the run needs, compiled once.
    # Nothing to fix, so nothing saved, and it does not rank with the ones to fix
    needed_once = not len(in_step_breaks) and len(in_step_rec) > 0 and needed is not None
    # in a generation's decode steps, each input guard failing once as decoding starts: the
    # prompt's length giving way to one token at a time (and token ids made under
    # inference_mode), a cache that grows, after which Dynamo compiles the dim as dynamic.
    # No change to the program removes them (a graph for prefill and one for decode is what
    # generating takes; dynamic=True up front compiled slower graphs and more of them)
    decoding = (not len(in_step_breaks) and not storm and len(in_step_rec) > 0
                and _each_input_guard_once(recompiles)
                and _in_decode_steps(trace, in_step_rec["step"].to_numpy()))
    basis = ("critical path: the compile time on the critical path of the steps it ran in "
             "(a compile the device hid by running queued work saves nothing)" if lost else "")
    # only torch's own breaks and recompiles (a compiled optimizer step's, DDP's buckets):
    # nothing in the script to change, so nothing its fix saves
    torchs = not storm and _torchs_own(in_step_breaks, in_step_rec)
    # what the breaks cost every step: the graphs they split, merged (not the DDP
    # optimizer's splits: they are there on purpose)
    own = ~in_step_breaks["reason"].str.contains(DDP_SPLIT, regex=False).to_numpy(bool)
    merged = merged_graphs_saving_ns(trace) if own.any() and not torchs else None
    merged_note = ""
    if merged:
        from neuron_explorer.analyses.step_breakdown import counted_steps

        saving += merged
        basis = "; ".join(b for b in (basis, MERGED_BASIS) if b)
        # a step's figure beside the total's share of the recorded steps (a trial read its
        # 1.72 ms as the recorded steps' and found no figure a step to check)
        n = counted_steps(trace)
        one = "one forward and one backward graph" if trains(trace) else "one graph"
        merged_note = (f" Merged into {one} a call, the graphs the breaks split save "
                       f"{us(merged / max(n, 1))} in each of the {n} analysed steps "
                       "(counted in the saving).") if n > 1 else ""
    # a break in a loop: Dynamo ran the whole frame eager, no graph to merge
    reads_gone = reads_gone_saving_ns(trace) if own.any() and not torchs and not merged \
        else None
    reads_note = ""
    if reads_gone:
        from neuron_explorer.what_if.compiled import looped_reads

        saving += reads_gone
        basis = "; ".join(b for b in (basis, READS_GONE_BASIS) if b)
        where = ", ".join(f"{line} in `{module}`" for module, line in
                          list(looped_reads(trace).items())[:3])
        reads_note = (f" The break is a read of a device value inside a loop ({where}): "
                      "Dynamo runs a frame whose loop breaks wholly eager, so none of it ran "
                      f"compiled; without the read it compiles whole, {us(reads_gone)} "
                      "less (counted in the saving).")
    # a break at an nn.LSTM: Dynamo ran the frame eager, allow_rnn compiles it whole
    rnn_note = ""
    rnn_traced = rnn_traced_saving_ns(trace) if own.any() and not torchs and not merged \
        and not reads_gone and _rnn_break(in_step_breaks) else None
    if rnn_traced:
        saving += rnn_traced
        basis = "; ".join(b for b in (basis, RNN_TRACED_BASIS) if b)
        from neuron_explorer.analyses.step_breakdown import counted_steps

        n = counted_steps(trace)
        rnn_note = (" Dynamo ran the model's frame eager from the break at its RNN "
                    "module; with `torch._dynamo.config.allow_rnn = True` set before "
                    f"compiling it compiles whole, {us(rnn_traced / max(n, 1))} less in "
                    f"each of the {n} analysed steps (counted in the saving; the "
                    "host-bound finding's compiled replay is the same change, so the two "
                    "savings are one).")
    uncompiled_note, uncompiled = _past_the_limit(trace, recompiles, set(per_size["frame"]))
    frames_past = bool(uncompiled)
    if limit_step >= 0 and len(recompiles):
        # ten compiled modules of other structures: the last two ran uncompiled, 2.97x the
        # step time, and the finding claimed nothing (a frame that stopped compiling has
        # its own note)
        uncompiled_note += "" if frames_past else (
            f" Dynamo's recompile limit was reached in step {limit_step}: from then on, "
            "calls that needed another graph ran uncompiled.")
        uncompiled = sorted(set(uncompiled) | {int(s) for s in trace.steps["step"]
                                               if s >= limit_step})
    uncompiled_saving = uncompiled_calls_saving_ns(trace, uncompiled) if uncompiled else None
    uncompiled_basis = UNCOMPILED_BASIS
    if frames_past and not uncompiled_saving:
        # a compiled function, no module's calls: its steps compiled against those after
        uncompiled_saving = _compiled_steps_saving(trace, in_step_rec, uncompiled)
        uncompiled_basis = COMPILED_STEPS_BASIS
    if uncompiled_saving:
        saving += uncompiled_saving
        basis = "; ".join(b for b in (basis, uncompiled_basis) if b)
        from neuron_explorer.analyses.steady_state import analysed_steps

        # a step's figure: the total beside a share of the recorded steps read as a tenth
        # of what each uncompiled step lost (a trial: 2.9x under)
        n = len(set(uncompiled) & {int(x) for x in analysed_steps(trace).steps})
        uncompiled_note += (f" Compiled, those steps' calls save {us(uncompiled_saving)}"
                            + (f", {us(uncompiled_saving / n)} in each of the {n} analysed "
                               "steps that ran uncompiled" if n > 1 else "")
                            + " (counted in the saving).")
    recommendation = _recommendation(breaks, in_step_breaks, in_step_rec, reasons,
                                     _eager_nki_lines(trace), limit_step >= 0)
    if torchs:
        saving, basis = 0.0, ("estimate: none, these graph breaks and recompiles are "
                              "torch's own (the compile time itself is compile_dominates' "
                              "finding)")
    if needed_once:
        saving, basis = uncompiled_saving or 0.0, (
            uncompiled_basis if uncompiled_saving else
            "estimate: none, each recompile builds a graph the run needs (another grad mode, "
            "module or input), once (the compile time itself is compile_dominates' finding)")
    if decoding:
        saving, basis = 0.0, ("estimate: none, each input guard fails once as decoding "
                              "starts (the compile time itself is compile_dominates' finding)")
        recommendation = ("Nothing to fix: each of these recompiles is an input of the first "
                          "decode steps differing from the prompt's (its length giving way to "
                          "one token at a time, token ids made under inference_mode, a cache "
                          "that grows), once each: the decode graph is another graph anyway, "
                          "and Dynamo then compiles a growing dim as dynamic, so later sizes "
                          "reuse it; torch.compile(..., dynamic=True) or mark_dynamic compile "
                          "dynamic graphs from the start, which run slower. Only a recompile "
                          "for every new length is worth a change (see shape_recompiles).")
    # compile time is not per step: its share is of the recorded steps, warm-up included
    return [make(trace, RULE_ID, title, saving, items,
                 _explanation(in_step_breaks, recompiles, reasons) + merged_note
                 + uncompiled_note + reads_note + rnn_note,
                 recommendation,
                 severity_override="low" if (needed_once and not uncompiled_saving) or decoding
                 or torchs else None,
                 share_of=steps_ns or None, symptom_ns=lost, saving_basis=basis)]


# the compile id Dynamo puts before a guard's reason: "0/3: " (frame 0, its 4th compile)
_COMPILE_ID = re.compile(r"^\s*(\d+)/\d+:")


def _past_the_limit(trace: Trace, recompiles: pd.DataFrame, others: set[int]
                    ) -> tuple[str, list[int]]:
    """A note, and the steps, where a frame of these recompiles ran uncompiled after its last
    one (Dynamo's recompile limit); frames in `others` are another finding's (a recompile
    per size: shape_recompiles')."""
    frames = recompiles["reason"].astype(str).str.extract(_COMPILE_ID)[0]
    notes, steps = [], set()
    for frame, group in recompiles.groupby(frames.to_numpy()):
        if int(frame) in others:
            continue
        note, later = ran_uncompiled_after(trace, int(frame), int(group["step"].max()))
        notes.append(note)
        steps.update(later)
    return "".join(dict.fromkeys(notes)), sorted(steps)


COMPILED_STEPS_BASIS = ("estimate: the steps that ran the function compiled (those of its "
                        "recompiles, their compile time left out) against the steps after "
                        "Dynamo's limit, medians")


def _compiled_steps_saving(trace: Trace, recompiles: pd.DataFrame,
                           uncompiled: list[int]) -> float | None:
    """ns the analysed steps among `uncompiled` (past Dynamo's recompile limit) save running
    as the steps of the recompiles ran, with the function compiled: the median of each, the
    compile time inside the compiled ones left out. A compiled training step whose
    optimizer recompiled on every new learning rate ran 2.09 ms a step slower once Dynamo
    gave up, and was claimed nothing."""
    from neuron_explorer.analyses.steady_state import in_analysed_steps

    steps = trace.steps
    after = in_analysed_steps(trace, steps[steps["step"].isin(uncompiled)])
    ran = steps[steps["step"].isin(set(recompiles["step"]))]
    if not len(after) or not len(ran):
        return None
    compiling = compiling_alone(trace, compile_spans(trace))
    starts = ran["ts"].to_numpy(np.int64)
    work = ran["dur"].to_numpy(np.int64) - compiling.covered(
        starts, starts + ran["dur"].to_numpy(np.int64))
    per_step = float(after["dur"].median()) - float(np.median(work))
    return per_step * len(after) if per_step > 0 else None


# a guard on an optimizer's learning rate, a Python float an LR scheduler changes every step
_LR_GUARD = re.compile(r"param_groups\[\d+\]\['lr'\] == ")
# ... and on its momentum, which OneCycleLR and CyclicLR cycle too (Adam's `betas[0]`, SGD's
# `momentum`) unless built with cycle_momentum=False
_MOMENTUM_GUARD = re.compile(r"param_groups\[\d+\]\[(?:'betas'\]\[0|'momentum')\] == ")


def _torchs_own(breaks: pd.DataFrame, recompiles: pd.DataFrame) -> bool:
    """Whether every graph break is torch's own (Optimizer.step's around its update, Dynamo's
    DDP optimizer's at the buckets) and every recompile the optimizer's (its state made on
    its first step)."""
    if not len(breaks) and not len(recompiles):
        return False
    reason, within = breaks["reason"].astype(str), breaks["within"].astype(str)
    own = reason.str.contains(DDP_SPLIT, regex=False) | within.str.contains("torch/optim/",
                                                                           regex=False)
    optimizer = recompiles["source"].astype(str).str.contains("torch/optim/", regex=False)
    reasons = recompiles["reason"].astype(str)
    scheduled = reasons.str.contains(_LR_GUARD) | reasons.str.contains(_MOMENTUM_GUARD)
    return bool(own.all()) and bool(optimizer.all()) and not bool(scheduled.any())


# guards that fail once for each graph a run needs: on which module a compiled call runs
# (torch.compile(module) calls every module through one function, whose guards name it
# `fn`: "len(fn._modules) != 7", "___check_type_id(fn._modules['1'], ...)"), on an input
# that requires grad in one call and not another, on the grad mode
_NEEDED_GRAPH_GUARDS = {
    "module": re.compile(r"(?<![\w.])fn(?:\._modules|\.|\[|,|\))"),
    "requires_grad": re.compile(r"requires_grad mismatch"),
    "grad_mode": re.compile(r"grad_mode"),
}
# a guard on an input's size at a dim: "tensor 'tok' size mismatch at index 1"
_SIZE_GUARD = re.compile(r"tensor '([^']+)' size mismatch at index (\d+)")


def _needed_graphs(reasons: list[str]) -> list[str] | None:
    """The kinds of `_NEEDED_GRAPH_GUARDS` of these recompiles' guards, in order; None when
    any guard is of another kind (or no reason was recorded)."""
    kinds = [_needed_graph_kind(r) for r in reasons]
    if not kinds or None in kinds:
        return None
    return [k for k in dict.fromkeys(kinds) if k]


def _needed_graph_kind(reason: str) -> str | None:
    guard = _guard(str(reason))
    return next((k for k, p in _NEEDED_GRAPH_GUARDS.items() if p.search(guard)), None)


_MODULES_UNDER_LIMIT = ("once per module, nothing to fix, but every compiled module counts "
                        "against that one function's recompile limit "
                        "(torch._dynamo.config.recompile_limit, 8 by default), past which "
                        "further modules run uncompiled")
_MODULES_PAST_LIMIT = ("here more modules were compiled apart than that one function's "
                       "recompile limit allows (torch._dynamo.config.recompile_limit, 8 by "
                       "default), and the modules past it ran uncompiled: raise it above the "
                       "number of modules compiled apart before their first call "
                       "(torch._dynamo.config.recompile_limit = 16, say)")
_NEEDED_GRAPH_ADVICE = {
    # two compiled nn.Sequential models (a GAN's generator and discriminator) were told to
    # keep their "guarded values" constant; 10 compiled modules of other structures ran the
    # last 2 uncompiled, Dynamo's recompile limit reached
    "module": ("the recompile{s}{where} follow{v} which module the compiled call runs (Dynamo's "
               "guard on `fn`, the module: its submodules' number or types): "
               "torch.compile(module) calls every compiled module through one function, "
               "whose cache keeps a graph for each module of another structure, made on its "
               "first call; {limit}"),
    "requires_grad": ("the recompile{s}{where} follow{v} an input that requires grad in one "
                      "call and not in another (a model called on `x` and on `x.detach()`, "
                      "as a GAN's discriminator is on its fake batch): a graph for each, "
                      "compiled once; nothing to fix"),
    "grad_mode": ("the recompile{s}{where} follow{v} a change of grad mode (the model ran "
                  "under torch.no_grad() or inference_mode() after training, or back): "
                  "Dynamo keeps both graphs, so it happens once per mode, not per step; "
                  "nothing to fix unless it repeats"),
}


def _each_size_once(guards: list[str]) -> bool:
    """Whether every guard is on an input's size at a dim, each dim once: Dynamo compiled
    the dim as dynamic after it changed, so no later size recompiles."""
    dims = [m.groups() for m in map(_SIZE_GUARD.search, guards) if m]
    return len(dims) == len(guards) > 0 and len(set(dims)) == len(dims)


# a variable-length batch was told to "pad or bucket" its shapes: bucketed, it still
# recompiled once and ran 26 us a step slower
def _size_once_advice(where: str, many: bool) -> str:
    return (f"the recompile{'s' if many else ''}{where} follow{'' if many else 's'} an "
            "input's size changing at a dim for the first "
            "time: Dynamo compiled that dim as dynamic then, so later sizes reuse the graph "
            "and nothing recompiles again; to save the one recompile, mark the dim dynamic "
            "from the first call (torch._dynamo.mark_dynamic(x, dim)) or, for a smaller last "
            "batch, drop it (DataLoader(..., drop_last=True)); padding or bucketing to fixed "
            "sizes adds work to every step")


# a guard on an input tensor: "tensor 'idx' size mismatch at index 1", "tensor 'ids'
# dispatch key set mismatch"
_INPUT_GUARD = re.compile(r"tensor '([^']+)' ([a-z ]+?) mismatch(?: at index (\d+))?")
# ... or an input that was None (a decoder's cache at the prompt): "0/0: ks is None"
_NONE_GUARD = re.compile(r"^\s*\d+/\d+: ([A-Za-z_][\w\[\]'.]*) (is None)\b")


def _in_decode_steps(trace: Trace, steps: np.ndarray) -> bool:
    """Whether every step of `steps` is a generation's decode step (`trace.phases()`)."""
    phases = trace.phases()
    if not len(phases):
        return False
    decode = set(phases.loc[phases["phase"] == "decode", "step"].tolist())
    return bool(len(steps)) and all(int(s) in decode for s in steps)


def _each_input_guard_once(recompiles: pd.DataFrame) -> bool:
    """Whether every recompile is a guard on an input failing (a tensor's size at a dim, its
    dispatch keys, ...; an input that was None), each (input, guard, dim) once."""
    found = [_INPUT_GUARD.search(str(r)) or _NONE_GUARD.search(str(r))
             for r in recompiles["reason"]]
    if not found or not all(found):
        return False
    keys = [m.groups() for m in found if m]
    return len(set(keys)) == len(keys)


@functools.cache
def _tool_folders() -> tuple[str, ...]:
    """This package's folders, the reference workloads left out (they are user code)."""
    folders = []
    for name in ("neuron_explorer", "neuron_explorer.backend", "neuron_explorer.collectors",
                 "neuron_explorer.common", "neuron_explorer.webapp"):
        spec = importlib.util.find_spec(name)
        locations = spec.submodule_search_locations if spec is not None else None
        if locations:
            folders.append(os.path.join(locations[0], ""))
    return tuple(folders)


def _in_the_tool(source: str) -> bool:
    """Whether a "file:line in function" lies in this package's code (as installed here,
    or as an installed `neuron_explorer` package on the machine that recorded it)."""
    path = source.rpartition(":")[0]
    return bool(path) and (path.startswith(_tool_folders()) or bool(_INSTALLED.search(path)))


def _saving(trace: Trace, compiling: Union, steps: np.ndarray) -> float:
    """The compile time on the critical path of the recorded steps it ran in (warm-up
    included: recompiles are counted over every recorded step)."""
    from neuron_explorer.analyses.path_share import time_on_path

    return time_on_path(trace, compiling.starts, compiling.ends, "host", steps=steps.tolist())


def _plural(n: int, what: str) -> str:
    return "" if not n else f"{n} {what}" + ("s" if n > 1 else "")


def _explanation(breaks: pd.DataFrame, recompiles: pd.DataFrame, reasons: list[str]) -> str:
    parts = []
    if len(breaks):
        parts.append("Graph breaks split the model into smaller graphs (more launches, less "
                     "fusion, host work between graphs).")
    if len(recompiles):
        parts.append("Recompiles rebuild a graph when its guards fail (new shapes, dtypes or "
                     "Python values).")
    shown = list(dict.fromkeys(_one_line(r) for r in reasons))[:5]
    return " ".join(parts) + " Reasons: " + ("; ".join(shown) or "not recorded") + "."


def _is_shape(guard: str) -> bool:
    return any(w in guard.lower() for w in ("size", "shape", "stride"))


def _guard(reason: str) -> str:
    """The failed guard of a reason, without its compile id or the source it quotes:
    "start == 17" of "0/1: start == 17   # pos = start + torch.arange(x.shape[1])"."""
    return re.sub(r"^\s*\d+/\d+:\s*", "", _one_line(reason)).split(" #")[0].strip()


# a guard on the value of a Python number the function was called with: "start == 17"
# (not Dynamo's own names for values it made, "___stack2 == 0.23": a resumed function's)
_VALUE_GUARD = re.compile(r"^([A-Za-z_][\w.]*|L\['\w+'\]) == (-?[\d.e+-]+)$")


def _python_values(guards: list[str]) -> dict[str, list[str]]:
    """The Python numbers whose value guards failed, each with its values in order."""
    values: dict[str, list[str]] = {}
    for guard in guards:
        m = _VALUE_GUARD.match(guard)
        if m and not m.group(1).startswith("___"):
            values.setdefault(m.group(1), []).append(m.group(2))
    return values


# a guard on the length of a container the compiled code changes: "len(self.log) == 3"
_LENGTH_GUARD = re.compile(r"^len\(([A-Za-z_][\w.\[\]']*)\) == \d+$")
# where Dynamo quotes the source line a guard came from: "... # ckpt.py:48 in forward"
_QUOTED_LINE = re.compile(r"#\s*([^#\s]+\.py:\d+) in \w+\s*$")


def _growing_containers(reasons: list[str]) -> dict[str, str]:
    """Container -> the line its length guard quotes, for guards on the length of a list or
    dict the compiled code grows every call (a log appended to in the forward)."""
    found: dict[str, str] = {}
    for reason in reasons:
        m = _LENGTH_GUARD.match(_guard(reason))
        if m:
            line = _QUOTED_LINE.search(_one_line(reason))
            found.setdefault(m.group(1), line.group(1) if line else "")
    return found


def _growing_containers_advice(containers: dict[str, str]) -> str:
    # a module's log appended to in its compiled forward was told to "pass them as tensors
    # rather than Python numbers", at the line of the checkpoint call
    named = ", ".join(f"`{name}`" + (f" (grown at {line})" if line else "")
                      for name, line in containers.items())
    return (f"the recompiles follow the length of {named}, which the compiled code grows "
            "every call: Dynamo guards on the length it traced and compiles again for each; "
            "return the value from the compiled function and append it outside, or write it "
            "into a tensor made before the loop")


# "tensor 'ids' dispatch key set mismatch. expected DispatchKeySet(PrivateUse1, ...),
# actual DispatchKeySet(PrivateUse1, BackendSelect)"
_DISPATCH_KEY_GUARD = re.compile(r"tensor '([^']+)' dispatch key set mismatch\. expected "
                                 r"DispatchKeySet\(([^)]*)\), actual DispatchKeySet\(([^)]*)\)")


def _dispatch_key_guards(reasons: list[str]) -> dict[str, tuple[set[str], set[str]]]:
    """Input -> (its keys as compiled, as called), for guards on an input's dispatch keys
    (empty unless every reason is one)."""
    found = [_DISPATCH_KEY_GUARD.search(_one_line(r)) for r in reasons]
    if not found or not all(found):
        return {}
    return {m.group(1): ({k.strip() for k in m.group(2).split(",")},
                         {k.strip() for k in m.group(3).split(",")}) for m in found if m}


def _dispatch_keys_advice(where: str, keys: dict[str, tuple[set[str], set[str]]]) -> str:
    # a decoder's prompt made outside torch.inference_mode() and its tokens inside it: the
    # recompile was told to keep "guarded values" constant, or pass tensors for numbers
    named = ", ".join(f"`{name}`" for name in keys)
    if all(("ADInplaceOrView" in a) != ("ADInplaceOrView" in b) for a, b in keys.values()):
        return (f"the recompile{where} follows how {named} was made: in one call outside "
                "torch.inference_mode() and in another inside it (an inference tensor lacks "
                "the ADInplaceOrView dispatch key, which Dynamo guards on); make it on the "
                "same side every call: inside inference_mode too where the loop runs there "
                "(the prompt's tensor as well), or clone it there (x.clone())")
    changed = sorted(set().union(*(a ^ b for a, b in keys.values())))
    return (f"the recompile{where} follows the dispatch keys of {named} "
            f"({', '.join(changed)}), which change with how a tensor is made (its device, "
            "inference mode, autograd): make it the same way every call")


def _python_values_advice(where: str, values: dict[str, list[str]]) -> str:
    # a decoder given its position as an int under dynamic=False: a compile per position,
    # then uncompiled past the limit; dynamic left to Dynamo saved 532 us of a 716 us step,
    # the position as a tensor 470
    named = ", ".join(f"`{name}` ({', '.join(seen[:3])}{', ...' if len(seen) > 3 else ''})"
                      for name, seen in values.items())
    head = (f"the recompiles{where} follow new values of the Python number"
            f"{'s' if len(values) > 1 else ''} {named}: each call's value is compiled in as "
            "a constant")
    if all(name.startswith("self.") for name in values):
        # a counter kept on the module (`self.calls += 1`): torch.compile keeps a module's
        # int attributes static whatever `dynamic` says (a trial could not follow "compile
        # without dynamic=False": it had never passed it)
        return (head + " (torch.compile keeps an nn.Module's int attributes static), so "
                "each new one compiles again; keep it out of the compiled forward, pass it "
                "as a tensor on the device, or set "
                "torch._dynamo.config.allow_unspec_int_on_nn_module = True")
    return (head + " (dynamic=False keeps Python ints static), so each new one compiles "
            "again; pass it as a tensor on the device, or, where the model is compiled with "
            "dynamic=False, compile without it (Dynamo then makes an int that changes dynamic "
            "after one recompile); mark_dynamic marks tensors' dims, not Python numbers")


def _one_line(reason: str) -> str:
    """A reason as one line: Dynamo's guard and the source it quotes, without the user
    stack it appends (several lines pasted into a finding) or the run of spaces it aligns
    the quoted source with."""
    first = reason.split("\nUser stack trace:")[0].strip().splitlines()
    return re.sub(r"\s{2,}#", " #", first[0]) if first else ""


# the graph break Dynamo reports when a function reaches its recompile limit
LIMIT_BREAK = "Dynamo recompile limit exceeded"
# the graph break Dynamo reports at an nn.RNN, nn.GRU or nn.LSTM without allow_rnn
RNN_BREAK = "Attempted to wrap RNN"


def _rnn_break(breaks: pd.DataFrame) -> bool:
    return bool(breaks["reason"].astype(str).str.contains(RNN_BREAK, regex=False).any())


# torch.compile(DDP(model)): Dynamo skips DDP's forward, so nothing of the model compiles
DDP_SKIPPED = "DistributedDataParallel._inside_ddp_forward"
DDP_ADVICE = ("compile the module DDP wraps, not the wrapper: torch.compile(DDP(model)) ran "
              "eagerly (Dynamo skips DDP's forward); DDP(torch.compile(model)) compiles it")


def compiled_ddp_wrapper(breaks: pd.DataFrame) -> bool:
    """Whether the graph breaks say torch.compile was given the DDP wrapper."""
    return bool(len(breaks)) and bool(breaks["reason"].astype(str).str.contains(
        DDP_SKIPPED, regex=False).any())


# DDP(torch.compile(model)): Dynamo's DDP optimizer splits the graph at DDP's buckets
DDP_SPLIT = "DDPOptimizer intentional graph-break"
DDP_SPLIT_ADVICE = ("the graph breaks DDPOptimizer reports are Dynamo's own: it splits the "
                    "model's graph at DDP's gradient buckets on purpose, so that each "
                    "bucket's all-reduce overlaps the rest of the backward; nothing to fix "
                    "(torch._dynamo.config.optimize_ddp = False merges them, trading that "
                    "overlap for fewer launches)")


# Dynamo's reasons for a break that reads or prints a device value on the host
_HOST_READS = {"Tensor.item()": "a .item()", "builtin operator `print`": "a print",
               "Tensor.tolist": "a .tolist()"}


def _host_reads(reasons: pd.Series) -> str:
    """"a .item() and a print": what of the breaks' reasons reads a device value on the
    host ("" for none). A user's break at `print(h.mean().item())` was told Dynamo's two
    hints and not to remove the print, which saved 60% of the step."""
    found = [said for key, said in _HOST_READS.items()
             if reasons.astype(str).str.contains(key, regex=False).any()]
    return " and ".join(found)


# a frame of torch's own modules ("torch/nn/modules/transformer.py:1245 in ...")
_TORCH_CODE = re.compile(r"(?:^|[/\\])torch[/\\]nn[/\\]")
# torch functions that read a device value on the host, and what spares the read: an
# nn.Transformer's causal mask checked by reading it was told to remove "a debugging line
# left in" at the user's call; tgt_is_causal=True saved what the finding claimed
CAUSAL_MASK_FIX = ("nn.Transformer checks whether the mask it was given is causal by reading "
                   "it: pass is_causal=True with a causal mask (tgt_is_causal=True to "
                   "nn.Transformer and TransformerDecoder, is_causal=True to "
                   "TransformerEncoder), and it reads nothing")
_TORCH_READ_FIXES = {"_detect_is_causal_mask": CAUSAL_MASK_FIX}


def _torch_reads_advice(breaks: pd.DataFrame) -> str:
    """What to do about graph breaks at host reads inside torch's own modules: no line of
    the user's reads; what spares the read, where it is known."""
    said = []
    for within, source in zip(breaks["within"].astype(str), breaks["source"].astype(str),
                              strict=True):
        function = within.rpartition(" in ")[2]
        fix = _TORCH_READ_FIXES.get(function, "pass what it computes as an argument, where "
                                              "the module takes one, or set "
                                              "torch._dynamo.config.capture_scalar_outputs "
                                              "= True")
        said.append(f"the break{' called' if source else ''}"
                    + (f" at {source}" if source else "")
                    + f" is inside torch's own `{function}` ({within.partition(' in ')[0]}), "
                    f"no line of yours: {fix}")
    return "; ".join(dict.fromkeys(said))


def _eager_nki_lines(trace: Trace) -> set[str]:
    """The lines ("file.py:40") that call an NKI kernel eagerly (an `nki::` op outside the
    graphs): in compiled code, a kernel called through nki.jit breaks the graph there."""
    ops = trace.ops
    if not len(ops) or "graph_id" not in ops:
        return set()
    eager = ops[ops["name"].astype(str).str.startswith("nki::")
                & (ops["graph_id"].to_numpy() < 0)]
    return {str(s) for s in eager["source"] if s}


def _recommendation(all_breaks: pd.DataFrame, breaks: pd.DataFrame, recompiles: pd.DataFrame,
                    reasons: list[str], nki_lines: set[str], limit_reached: bool) -> str:
    """Advice for what happened: graph-break advice only when there are graph breaks."""
    advice = []
    # a kernel launched through nki.jit in compiled code: Dynamo cannot enter its launch (a
    # trial was quoted "a `lock` context manager" and told to avoid it, without the fix)
    lines = breaks["source"].map(lambda s: str(s).split(" in ")[0])  # "file:line in fn"
    at_nki = lines.isin(nki_lines).to_numpy(bool)
    if at_nki.any():
        sites = sorted(set(lines[at_nki]))
        advice.append(f"the NKI kernel called at {', '.join(sites[:3])} breaks the graph: "
                      "Dynamo cannot trace a launch through nki.jit; call it through "
                      "nki.as_torch_op(kernel) instead, a custom op that runs inside the "
                      "compiled graph as its kernel (docs/nki.md)")
        breaks = breaks[~at_nki]
    if compiled_ddp_wrapper(breaks):
        advice.append(DDP_ADVICE)
    ddp_split = breaks["reason"].str.contains(DDP_SPLIT, regex=False).to_numpy(bool)
    if ddp_split.any():
        advice.append(DDP_SPLIT_ADVICE)
        breaks = breaks[~ddp_split]
    # torch's Optimizer.step breaks the graph on purpose, around its update (so that
    # AOTAutograd sees the no_grad region): a compiled optimizer step has them, whatever
    # the user's code does
    in_optimizer = breaks["within"].str.contains("torch/optim/", regex=False).to_numpy(bool)
    break_sites = sorted({s for s in breaks["source"][~in_optimizer] if s})
    if (~in_optimizer).any():
        hints = list(dict.fromkeys(h for h in breaks["hint"][~in_optimizer] if h))
        # a read inside torch's own code is no line of the user's to remove
        in_torch = breaks["within"].astype(str).str.contains(_TORCH_CODE).to_numpy(bool)
        reads = _host_reads(breaks["reason"][~in_optimizer & ~in_torch])
        torch_reads = _torch_reads_advice(breaks[~in_optimizer & in_torch])
        advice.append("fix the graph breaks" + (f" at {', '.join(break_sites[:3])}"
                                                if break_sites else "")
                      + " (torch._dynamo.explain(model)(inputs) lists them)"
                      + (f": among them {reads} in the compiled code (often a debugging "
                         "line left in): remove it, or keep the value on the device and read "
                         "it outside the compiled function" if reads else "")
                      + (f"; {torch_reads}" if torch_reads else "")
                      + "".join(f"; Dynamo's hint: {h.rstrip('.')}" for h in hints[:2]))
    if in_optimizer.any():
        sites = sorted({s for s in breaks["source"][in_optimizer] if s})
        many = in_optimizer.sum() > 1
        advice.append(f"the graph break{'s' if many else ''} "
                      + (f"at {', '.join(sites[:3])} " if sites else "")
                      # told to leave the step out of the compiled function, where its
                      # update compiled saved 845 us a step and fused=True 703 (a trial)
                      + f"{'are' if many else 'is'} torch's own: Optimizer.step breaks the "
                      "graph around its update on purpose, and its update still runs "
                      "compiled; nothing to fix (fused=True is the other way to one kernel "
                      "a step)")
    if len(recompiles) or not len(all_breaks):
        guards = [_guard(r) for r in reasons]  # not the source line Dynamo quotes after it
        shapes = any(map(_is_shape, guards))
        values = _python_values(guards)
        sites = sorted({s for s in recompiles["source"] if s})
        where = f" at {', '.join(sites[:3])}" if sites else ""
        needed = _needed_graphs(reasons)
        learning_rate = any(_LR_GUARD.search(g) for g in guards)
        momentum = any(_MOMENTUM_GUARD.search(g) for g in guards)
        optimizer_state = bool(sites) and all("torch/optim/" in s for s in sites)
        scheduled = []  # guards on what a scheduler changes every step
        if learning_rate:
            scheduled.append(f"the recompiles{where} follow the optimizer's learning rate, a "
                             "Python float an LR scheduler changes every step: the compiled "
                             "optimizer step is compiled again for each value (its guard "
                             "`param_groups[0]['lr'] == ...`) until Dynamo's recompile limit, "
                             "and then runs uncompiled; give the optimizer a tensor learning "
                             "rate (torch.optim.AdamW(params, lr=torch.tensor(1e-3))), which "
                             "the compiled step reads instead of compiling in (OneCycleLR "
                             "and CyclicLR change the momentum too, a guard Dynamo reports "
                             "once the rate's passes: construct them with "
                             "cycle_momentum=False as well)")
        if momentum:
            # told only of the learning rate, a trial's tensor rate left the storm going
            # on `betas[0]` and made the step 3.2 ms slower
            scheduled.append(f"the recompiles{where} follow the optimizer's momentum "
                             "(`param_groups[0]['betas'][0]` or `['momentum']`), a Python float "
                             "OneCycleLR and CyclicLR change every step as they do the learning "
                             "rate: construct the scheduler with cycle_momentum=False")
        if scheduled:
            advice += scheduled
        elif optimizer_state:
            advice.append(f"the recompile{where} is the optimizer's: its state is made on "
                          "its first step, and the next step's guards see it; once, nothing "
                          "to fix")
        elif needed:
            kinds = recompiles["reason"].map(_needed_graph_kind)
            for kind in sorted(needed, key=lambda k: k != "module"):  # the limit's first
                of_kind = recompiles[(kinds == kind).to_numpy(bool)]
                at = sorted({s for s in of_kind["source"] if s})
                many = len(of_kind) > 1
                advice.append(_NEEDED_GRAPH_ADVICE[kind].format(
                    s="s" if many else "", v="" if many else "s",
                    where=f" at {', '.join(at[:3])}" if at else "",
                    limit=_MODULES_PAST_LIMIT if limit_reached else _MODULES_UNDER_LIMIT))
        elif growing := _growing_containers(reasons):
            advice.append(_growing_containers_advice(growing))
        elif keys := _dispatch_key_guards(reasons):
            advice.append(_dispatch_keys_advice(where, keys))
        else:
            if values:
                advice.append(_python_values_advice(where, values))
            # with value guards, a size guard failing once or twice (a cache's first
            # length) is no storm of its own
            if not values and _each_size_once(guards):
                advice.append(_size_once_advice(where, len(recompiles) > 1))
            elif (shapes and (not values or sum(map(_is_shape, guards)) >= th.RECOMPILE_STORM)
                    or not reasons):
                advice.append(f"the recompiles{where} follow changing input shapes: pad or "
                              "bucket them to a few fixed sizes, or mark the varying dim with "
                              "torch._dynamo.mark_dynamic(x, dim) or compile with "
                              "torch.compile(..., dynamic=True)")
            elif not values:
                advice.append(f"the recompiles{where} follow changing guarded values: keep "
                              "them constant across calls, or pass them as tensors rather "
                              "than Python numbers")
    text = "; ".join(advice)
    return text[0].upper() + text[1:] + "."
