"""Host-bound device: the device idles between kernels because the host launches too slowly."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd
from neuron_explorer.analyses.critical_path import device_time_saving
from neuron_explorer.analyses.startup import startup_gaps
from neuron_explorer.device_terms import device_terms
from neuron_explorer.memo import memoised
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import (
    Finding,
    evidence,
    is_inference,
    make,
    step_time,
    top,
    trains,
    us,
)

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace
    from neuron_explorer.what_if.into_graphs import IntoGraphs

RULE_ID = "host_bound"


def launch_gaps(trace: Trace) -> pd.DataFrame:
    """The gaps in which the device waited for the host to launch, less the one-time
    start-up ones (`startup_gaps`): those a faster host would save on every step."""
    gaps = trace.idle_reasons()
    host = gaps[gaps["reason"] == "host_launch"]
    startup = startup_gaps(trace)
    return host[~host["next_slice_id"].isin(startup["next_slice_id"])] if len(startup) else host


def is_host_bound(trace: Trace) -> bool:
    """Whether the device mostly waits on the host to launch (this rule fires)."""
    lost = float(launch_gaps(trace)["dur"].sum())
    return lost > 0 and lost >= th.HOST_BOUND_MIN_SHARE * step_time(trace)


def prerequisite(trace: Trace) -> str:
    """For a rule whose saving is device time: the rule whose fix must come first (this
    one, on a host-bound run whose fix feeds the device; "" otherwise), for
    `Finding.after`."""
    return RULE_ID if is_host_bound(trace) and fix_feeds_the_device(trace) else ""


@dataclass(frozen=True)
class DeviceSaving:
    """What a fix that makes the device faster saves on the steps, for a rule's finding."""

    time_lost_ns: float
    after: str  # the rule whose fix must come first (`Finding.after`), or ""
    note: str  # a sentence for the finding's explanation, or ""
    basis: str  # `Finding.saving_basis`


def fix_feeds_the_device(trace: Trace) -> bool:
    """Whether this rule's fix, as replayed, takes away most of the launch gaps: the device
    then sets the steps, so device time saved is step time saved after it. A fix that
    saves little of them (a kernel launched per row, compiled: 4 us of 172 a step) leaves
    the host setting the steps, and a device fix saves what it saves now."""
    def feeds() -> bool:
        gaps = float(launch_gaps(trace)["dur"].sum())
        saving, basis = fix_saving(trace, gaps)
        if basis == HOOKS_ONLY:  # no fix: the host goes on setting the steps
            return False
        if only_a_larger_batch(trace):  # a change of workload, not a fix of this one
            return False
        return not basis.startswith("replay") or saving >= th.HOST_BOUND_FIX_FEEDS * gaps

    return memoised(trace, "host_fix_feeds_the_device", feeds)


def only_a_larger_batch(trace: Trace) -> bool:
    """Whether this finding's only advice is a larger batch: a compiled run with no graph
    break, nothing eager beside its graphs to bring in, and no copies or optimizer step to
    fix first. A larger batch changes the workload, so a device fix's step saving cannot
    wait on it: a compiled recommender told that casting to bfloat16 saves 92 us a step
    "after the host-bound fix" ran the same step cast (566 us), 93 us less device time."""
    return memoised(trace, "host_only_a_larger_batch", lambda: (
        is_compiled(trace) and not len(trace.compile_summary()["graph_breaks"])
        and not _mostly_eager(trace) and not _optimizer_first(trace)
        and not _copies_first(trace)))


def device_saving(trace: Trace, device_ns: float, host_added_ns: float = 0.0) -> DeviceSaving:
    """For a rule whose fix saves `device_ns` of device time (and adds `host_added_ns` of
    host work): on a host-bound run whose fix feeds the device, that time once the host
    keeps the device fed (after that fix); otherwise the part of it the steps lose
    (`critical_path.device_time_saving`: a step can only shorten down to its host's own
    work, grown by what the fix adds)."""
    if is_host_bound(trace) and fix_feeds_the_device(trace):
        return DeviceSaving(
            device_ns, RULE_ID,
            " The run is host-bound now, so this is device time rather than step time: "
            "after you fix the host-bound issue, this is next.",
            "critical path after the host-bound fix: the device time saved, once the host "
            "keeps the device fed")
    saved = max(device_time_saving(trace, device_ns, host_added_ns), 0.0)
    if host_added_ns and saved < NEAR_ALL * device_ns:
        return DeviceSaving(
            saved, "",
            f" {us(device_ns)} less device time over the analysed steps shortens them by "
            f"{us(saved)} only: the fix also adds {us(host_added_ns)} of host work over "
            "them, and past that the host's own work sets their length.",
            "critical path: the steps shorten only down to the host's own time, grown by the "
            "host work the fix adds")
    if saved >= NEAR_ALL * device_ns:
        return DeviceSaving(saved, "", "", "critical path: the device sets the steps' "
                                           "length, so device time saved is step time saved")
    return DeviceSaving(
        saved, "",
        f" {us(device_ns)} less device time over the analysed steps shortens them by "
        f"{us(saved)} only: past that, the host's own work sets their length."
        + batch_only_note(trace),
        "critical path: the steps shorten only down to the host's own time (the device's "
        "lead over the host, and the host's waits on it, are what it can save)")


def batch_only_note(trace: Trace) -> str:
    """Why a device fix saves no more on a host-bound run with no fix of the host's left."""
    if not (is_host_bound(trace) and only_a_larger_batch(trace)):
        return ""
    return (" The host-bound finding's only advice left is a larger batch, a change of "
            "workload: with one large enough that the device sets the steps, device time "
            "saved is step time saved.")


# a saving this close to the device time is all of it (rounding, not the host)
NEAR_ALL = 0.95


def check(trace: Trace) -> list[Finding]:
    host = launch_gaps(trace)
    lost = float(host["dur"].sum())
    if not is_host_bound(trace):
        return []
    names = trace.table("slices")["name"].array  # a few rows read: no string per slice
    items = [evidence(r.ts, r.dur, [r.next_slice_id],
                      f"device idle {us(r.dur)} until the host launched {names[r.next_slice_id]}")
             for r in top(host, "dur").itertuples()]
    median = float(host["dur"].median())
    explanation = (f"In {len(host)} gaps (median {us(median)}) the next kernel was launched "
                   "only after the device had gone idle: the host spends longer issuing each "
                   "op than the device spends running it, so the device is starved.")
    saving, basis = fix_saving(trace, lost)
    if basis.startswith(INTO_GRAPHS):
        explanation += (" With its eager launches inside its graphs (the fix advised), a "
                        f"replay saves {us(saving)}; these gaps cost {us(lost)}.")
    elif basis.startswith("replay") and saving < lost and _looped_read_sentence(trace):
        explanation += (f" Compiled as it is, a what-if replay saves {us(saving)} of the "
                        f"{us(lost)} these gaps cost: the forward would run eagerly (a read "
                        "of a device value in a loop, below).")
    elif basis.startswith("replay") and saving < lost and _whole_step_saving(trace, saving):
        explanation += (f" Compiled, a what-if replay saves {us(saving)} of the "
                        f"{us(lost)} these gaps cost: the loss and its backward stay eager "
                        "beside a compiled model." + _whole_step_sentence(trace, saving))
    elif basis.startswith("replay") and saving < lost:
        explanation += (f" Compiled, a what-if replay saves {us(saving)} of the "
                        f"{us(lost)} these gaps cost: the rest is host work that compiling "
                        "keeps (Python between the model's calls, hooks"
                        + (", the optimizer)." if trains(trace) else ")."))
    elif basis.startswith("replay") and saving > lost:
        explanation += (f" Compiled, a what-if replay saves {us(saving)}, more than the "
                        f"{us(lost)} these gaps cost: fused, the device's own work "
                        "shortens too." + _whole_step_sentence(trace, saving))
    # eager ops a graph break or the recompile limit left inside the compiled model: code
    # brought into compiled code breaks there too until that is fixed (compiling the loss
    # of such a model saved 4 us a step; after the print's removal, 124)
    after = "recompilation" if basis.startswith(INTO_GRAPHS) and left_by_breaks(trace) \
        else ""
    return [make(
        trace, RULE_ID, f"Device waits on the host to launch work ({len(host)} gaps)", saving,
        items, explanation, _recommendation(trace), symptom_ns=lost, saving_basis=basis,
        after=after)]


def left_by_breaks(trace: Trace) -> int:
    """The eager ops inside the compiled model's calls (left so by a graph break or
    Dynamo's recompile limit) of the analysed steps, where they are a large share of the
    eager launches (`EAGER_LEFT_SHARE`); 0 otherwise."""
    from neuron_explorer.what_if.into_graphs import eager_launches

    launches = eager_launches(trace)
    inside = len(launches.broken)
    eager = len(launches.movable) + len(launches.optimizer)
    return inside if inside and inside >= EAGER_LEFT_SHARE * (eager + inside) else 0


def fix_saving(trace: Trace, gaps_ns: float) -> tuple[float, str]:
    """(what the advised fix saves, `Finding.saving_basis`): the compiled replay's saving
    where a replay predicts it, else the launch gaps `gaps_ns`."""
    compiled = compiled_saving_ns(trace)
    if compiled is not None:
        return compiled, ("replay: the run replayed compiled (the fix advised) saves this "
                          "much: fewer launches, and fused kernels on the device")
    into = _into_graphs_replay(trace)
    if into is not None:
        # the gaps were claimed: 0.5-1.7x what compiling the loss and fusing saved
        return into.saving_ns, (
            INTO_GRAPHS + ": the loss and other eager ops launching beside the graphs "
            "brought into them (their host launches gone, the ops that join each "
            "graph run after it as one program fused along their data flow)"
            + (", the optimizer's step fused=True" if into.fused else ""))
    if is_compiled(trace) and _only_hooks_beside_graphs(trace):
        return 0.0, HOOKS_ONLY
    return gaps_ns, ("critical path: the host sets the step's length, and a host that kept "
                     "the device fed would save these gaps (one-time start-up gaps left out)")


def _into_graphs_replay(trace: Trace) -> IntoGraphs | None:
    """The replay of a compiled run with its eager launches brought into its graphs, where
    that is this finding's saving (most launches beside the graphs, or hooks' only)."""
    if not is_compiled(trace) or not (_mostly_eager(trace) or _only_hooks_beside_graphs(trace)):
        return None
    from neuron_explorer.what_if.into_graphs import into_graphs_saving

    return into_graphs_saving(trace)


def counts_the_fused_optimizer(trace: Trace) -> bool:
    """Whether this finding fires with a saving that holds the optimizer's fused=True: on a
    compiled model, where its fix leads with it, or where its replay brings the eager
    launches into the graphs and fuses the optimizer's step with them. Another finding
    naming fused=True then overlaps this one (a compiled CNN was claimed 1.63 ms here and
    635 us for fused=True beside it, 2.27 ms in all, where the two fixes saved 1.88)."""
    if not is_host_bound(trace) or not is_compiled(trace):
        return False
    if advises_the_optimizer(trace):
        return True
    into = _into_graphs_replay(trace)
    return into is not None and into.fused


HOOKS_ONLY = ("estimate: none, what launches beside the graphs is hooks' work (DDP's "
              "reducer scaling the gradients, the collectives), autograd's seed of the "
              "backward and an optimizer step that fused=True would not shorten; no change "
              "to the program moves them into compiled code")


def _only_hooks_beside_graphs(trace: Trace) -> bool:
    """Whether a compiled run's launches beside its graphs are hooks' work, and nothing
    that compiling more would move (no loss or other code of the program's, nothing a
    graph break left eager): what is left besides is autograd's seed and the optimizer's
    step, whose fused replay is then the whole saving. A DDP model compiled with its loss
    was claimed 1.06 ms of a 1.42 ms step, its gaps, where fused=True saved nothing and
    no other fix was left."""
    from neuron_explorer.what_if.into_graphs import backward_seed, eager_launches

    launches = eager_launches(trace)
    return bool(len(launches.hooks)) and not len(launches.broken) and \
        bool(backward_seed(launches.movable).all())


def compiled_saving_ns(trace: Trace, whole_step: bool = False) -> float | None:
    """What the analysed steps would save compiled (an eager trace with op keys replayed
    by `whatif --mode compiled`; `whole_step`: the training step compiled, the loss with
    the model), or None where no replay predicts it. The recorded steps last as the
    run's pace sets them (`device_pace`): a device behind its host sets it."""
    import numpy as np
    from neuron_explorer.analyses.device_pace import paced_durations
    from neuron_explorer.analyses.steady_state import in_analysed_steps
    from neuron_explorer.analyses.step_breakdown import counted_steps
    from neuron_explorer.what_if.compiled import advised_compile_mode
    from neuron_explorer.what_if.replay import predicted_step_ns

    if is_compiled(trace) or not device_terms(trace.metadata).recorded_here:
        return None
    predicted = predicted_step_ns(trace, advised_compile_mode(trace)
                                  + ("_step" if whole_step else ""))
    steps = in_analysed_steps(trace, trace.steps)
    if predicted is None or not len(steps):
        return None
    paced = paced_durations(trace)
    recorded = float(np.median(paced)) if len(paced) else float(steps["dur"].median())
    if _waits_for_other_ranks(trace):
        # the replay keeps no wait for another rank: against a recording paced by those
        # waits, a rank waiting on a straggler was told compiling saved it 4.6 ms a step
        # of a 2.9 ms step of its own work. Compared with its own eager replay instead.
        eager = predicted_step_ns(trace, "eager")
        recorded = min(recorded, eager) if eager is not None else recorded
    return max(recorded - predicted, 0.0) * counted_steps(trace)


def _whole_step_saving(trace: Trace, model_saving: float) -> float:
    """What compiling the training step saves (the loss and its backward in the graphs
    with the model), where it saves clearly more than compiling the model alone; else 0.
    A trial's loss of many small ops took 3.9 ms a step more to launch than the model's
    compiled step, and the finding put no figure on compiling it."""
    if not trains(trace):
        return 0.0
    step = compiled_saving_ns(trace, whole_step=True)
    if step is None or step - model_saving < max(
            th.WHOLE_STEP_MORE * model_saving,
            th.WHOLE_STEP_MIN_SHARE * step_time(trace)):
        return 0.0
    return step


def _whole_step_sentence(trace: Trace, model_saving: float) -> str:
    step = _whole_step_saving(trace, model_saving)
    if not step:
        return ""
    return (f" Compiling the training step instead (a function that runs the model and "
            f"computes the loss, compiled: the loss and its backward in the graphs too), the "
            f"replay saves {us(step)}, {us(step - model_saving)} more.")


def _waits_for_other_ranks(trace: Trace) -> bool:
    """Whether the analysed steps' collectives waited for other ranks to arrive."""
    from neuron_explorer.analyses import communication as comm
    from neuron_explorer.analyses.steady_state import in_analysed_steps

    coll = comm.collectives(trace)
    return bool(len(coll)) and float(in_analysed_steps(trace, coll)["wait_ns"].sum()) > 0


def compiled_device_saving_ns(trace: Trace) -> float | None:
    """The device time the analysed steps would save compiled: their kernels replayed by
    `whatif --mode compiled` against the same ops lowered again eagerly; None where no
    replay predicts it (see `compiled_saving_ns`)."""
    from neuron_explorer.what_if.compiled import advised_compile_mode
    from neuron_explorer.what_if.replay import predicted_device_ns

    if is_compiled(trace) or not device_terms(trace.metadata).recorded_here:
        return None
    eager = predicted_device_ns(trace, "eager")
    compiled = predicted_device_ns(trace, advised_compile_mode(trace))
    if eager is None or compiled is None:
        return None
    return max(eager - compiled, 0.0)


def is_compiled(trace: Trace) -> bool:
    """Whether the trace runs compiled graphs."""
    # a --steps window may leave the compile spans out: the graph launches still say it
    # (a frame Dynamo gave up on, an nn.GRU's, leaves a span of no graph: that run is eager)
    graphs = trace.compile_summary()["graphs"]
    return bool((graphs["graph_id"] >= 0).any()) or bool((trace.ops["graph_id"] >= 0).any())


# copies whose ops take this share of the host's op time are the launches to fix first
COPIES_MIN_SHARE = 0.4


def copies_starving(trace: Trace) -> tuple[float, float]:
    """(copies a step, their ops' share of the host's op time) in the analysed steps:
    the host<->device copies (`host_device_copies.copies`) among the launches that keep
    the device waiting."""
    from neuron_explorer.rules.host_device_copies import analysed_copies, copy_ops

    c = analysed_copies(trace)
    ops = _analysed_ops(trace)
    if not len(c) or not len(ops):
        return 0.0, 0.0
    return len(c) / max(ops["step"].nunique(), 1), _op_time_share(trace, ops,
                                                                  copy_ops(trace, c))


def _analysed_ops(trace: Trace):
    from neuron_explorer.analyses.steady_state import in_analysed_steps

    return in_analysed_steps(trace, trace.ops[trace.ops["step"] >= 0])


def _op_time_share(trace: Trace, ops, ids) -> float:
    """The share of the host's op time (`ops`' slices, overlaps counted once) that the
    slices `ids` cover."""
    import numpy as np
    from neuron_explorer.common.intervals import Union

    s = trace.table("slices")
    ts, dur = s["ts"].to_numpy(np.int64), s["dur"].to_numpy(np.int64)
    every_ids = ops["id"].to_numpy(np.int64)
    every = Union(ts[every_ids], ts[every_ids] + dur[every_ids]).total
    mine = Union(ts[ids], ts[ids] + dur[ids]).total
    return mine / every if every else 0.0


def _most_launches(starving: tuple[float, float], what: str, unit: str, fix: str) -> str:
    """Advice to fix `what` first, where (launches a step, share of the host's op time)
    `starving` says it is most of what the host launches."""
    per_step, share = starving
    if share < COPIES_MIN_SHARE:
        return ""
    lead = "Most of the host's launches are" if share >= 0.5 else \
        "The largest part of the host's launches is"
    return f"{lead} {what} ({per_step:.0f}{unit} a step, {share:.0%} of its op time): {fix} "


def _copies_first(trace: Trace) -> str:
    """Advice to fix the copies first, where they are most of what the host launches and
    their own finding says how (a compiled model's one upload of its input a step, and
    its result's read, left nothing to fix there, yet led this advice: creating the input
    on the device made the step 12 us slower)."""
    from neuron_explorer.rules import host_device_copies

    if not host_device_copies.check(trace):
        return ""
    return _most_launches(copies_starving(trace), "host<->device copies", "",
                          "fix them first, as the host<->device copies finding says.")


def optimizer_starving(trace: Trace) -> tuple[float, float]:
    """(op launches a step inside an unfused optimizer's step, their share of the host's
    op time) in the analysed steps: a foreach=False optimizer launches a kernel per
    parameter and formula term, more than the model it trains."""
    import numpy as np
    from neuron_explorer import tables
    from neuron_explorer.common import trace_format as tf

    ops = _analysed_ops(trace)
    if not len(ops) or fused_optimizer(trace):
        return 0.0, 0.0
    ids = ops["id"].to_numpy(np.int64)
    mine = ids[tables.ancestor_of_kind(trace, ids, (tf.CAT_OPTIMIZER,)) >= 0]
    if not len(mine):
        return 0.0, 0.0
    return len(mine) / max(ops["step"].nunique(), 1), _op_time_share(trace, ops, mine)


# what compiling the optimizer's step asks of a recording: a user's trace of one step
MARK_STEPS = ("(mark each step with neuron_explorer.step() then: a compiled optimizer step "
              "ends no step in the recording)")
# compiling the optimizer's step, beside fused=True: its launches go as well, its device
# work is another program's, which no replay here measures
COMPILED_STEP_CAVEAT = (
    "Compiling its step instead " + MARK_STEPS + " also takes its launches off the host, "
    "but may save less device time: compiled, the update runs as several passes over the "
    "parameters where the fused kernel makes one, and Adam's bias corrections are "
    "computed per parameter on the device (a 2-layer GPT's AdamW step: 505 us of foreach "
    "passes, 303 compiled, 164 fused); the saving is the fused kernel's.")


def fused_optimizer(trace: Trace) -> bool:
    """Whether the optimizer's step already runs fused (`fused=True`: one kernel a step)."""
    return bool(_analysed_ops(trace)["name"].astype(str).str.contains("_fused_").any())


def advises_the_optimizer(trace: Trace) -> bool:
    """Whether the host-bound finding fires with the optimizer's fix first (its saving then
    counts fused=True's, where the model is compiled)."""
    return is_host_bound(trace) and bool(_optimizer_first(trace))


def _optimizer_first(trace: Trace) -> str:
    """Advice to fuse the optimizer's step, where it is most of what the host launches."""
    from neuron_explorer.what_if.fused_optimizer import FUSED_OPS  # what fused=True makes

    starving = optimizer_starving(trace)
    if starving[1] < COPIES_MIN_SHARE:
        return ""
    others = sorted(_optimizer_classes(trace) - set(FUSED_OPS))
    if others:  # a class without fused=True (Shampoo, a custom one): compiling is the fix
        return _most_launches(starving, "the optimizer's step", " ops",
                              f"compile its step ({', '.join(others)} "
                              f"{'has' if len(others) == 1 else 'have'} no fused=True), or "
                              "use its foreach implementation where it has one.")
    from neuron_explorer.rules.optimizer_recreated import remade_state

    if len(remade_state(trace)[0]):
        # fused=True on an optimizer built every step made a user's steps 134 us slower
        # where the replay of the recorded steps said 300 us faster
        return _most_launches(starving, "the optimizer's step", " ops",
                              "it is constructed anew every step (the optimizer_recreated "
                              "finding): construct it once, before the loop, first; then "
                              "construct it with fused=True (one kernel a step) or compile "
                              "its step " + MARK_STEPS + ".")
    return _most_launches(starving, "the optimizer's step", " ops",
                          "construct the optimizer with fused=True (one kernel a step"
                          + _fused_step_saving(trace) + "). " + COMPILED_STEP_CAVEAT)


def _optimizer_classes(trace: Trace) -> set[str]:
    """The classes of the optimizers whose steps the trace holds ("AdamW" of our
    "AdamW.step", "Shampoo" of PyTorch's profiler's "Optimizer.step#Shampoo.step")."""
    from neuron_explorer import tables
    from neuron_explorer.common import trace_format as tf

    names = tables.of_kind(trace, tf.CAT_OPTIMIZER)["name"].astype(str)
    return {n.rpartition("#")[2].removesuffix(".step") for n in names if n.endswith(".step")}


def _fused_step_saving(trace: Trace) -> str:
    """What fused=True saves a step, host and device, by replay (where the trace allows)."""
    from neuron_explorer.analyses.step_breakdown import counted_steps
    from neuron_explorer.what_if.fused_optimizer import fused_optimizer_saving

    fused = fused_optimizer_saving(trace)
    if fused is None or not fused.step_ns:
        return ""
    per_step = fused.step_ns / max(counted_steps(trace), 1)
    return f": replayed so, each step takes {us(per_step)} less"


def _recommendation(trace: Trace) -> str:
    """Fewer, larger launches, in the terms of what the script already does."""
    optimizer = _optimizer_first(trace)
    return _copies_first(trace) + optimizer + _launch_advice(trace, bool(optimizer))


def _launch_advice(trace: Trace, optimizer_told: bool = False) -> str:
    """Fewer, larger launches, in the terms of what the script already does
    (`optimizer_told`: the optimizer's fix was given already)."""
    cs = trace.compile_summary()
    compiled = is_compiled(trace)
    breaks = ("remove the graph breaks that leave eager ops between graphs, "
              if len(cs["graph_breaks"]) else "")
    inference = is_inference(trace)
    batch = ("batch more requests into each call of the model" if inference else
             "increase the batch size")
    if compiled:
        return (_eager_beside_graphs(trace, optimizer_told)
                or f"The model is already compiled: {batch} so each launch does more work, "
                   f"{breaks}and keep Python work (logging, metric math) out of the hot loop.")
    what = "the model" if inference else "the model or the training step"
    terms = device_terms(trace.metadata)
    from neuron_explorer.rules.recompilation import compiled_ddp_wrapper

    tried = _compiled_without_a_graph(cs["graph_breaks"])
    if tried:
        return (f"The model is wrapped in {terms.compile_call}, but no graph of it ran: "
                f"{tried}. Compiling as it is saves nothing here; the launches stay one by "
                f"one until the model's forward runs as graphs (fix that break first), or "
                f"{batch} so each launch does more work; keep Python work (logging, metric "
                "math) out of the hot loop." + terms.launch_remedy
                + (_predicted_compile(trace) if terms.recorded_here else ""))
    if compiled_ddp_wrapper(cs["graph_breaks"]):
        what = ("the module DDP wraps (DDP(torch.compile(model)): torch.compile(DDP(model)) "
                "ran eagerly here, as Dynamo skips DDP's forward)")
    elif ddp_wrapped(trace):  # told "wrap the model", a user compiled DDP's wrapper: 0 saved
        what = ("the module DDP wraps, before wrapping it (DDP(torch.compile(model)): "
                "torch.compile(DDP(model)) runs eagerly, as Dynamo skips DDP's forward)")
    return (f"Launch fewer, larger kernels: wrap {what} in {terms.compile_call} so ops fuse "
            f"into a few kernels per graph, or {batch} so each launch does more work; keep "
            "Python work (logging, metric math) out of the hot loop."
            + (_small_buckets_first(trace) if ddp_wrapped(trace) else "") + terms.launch_remedy
            + (_predicted_compile(trace) if terms.recorded_here else ""))


def _compiled_without_a_graph(breaks: pd.DataFrame) -> str:
    """Where an eager run's graph breaks show a torch.compile that ran no graph, what broke
    it, in words ("" otherwise: no breaks, or DDP's wrapper, said apart). A user's
    FSDP2 model, compiled, broke at fully_shard's hooks (which Dynamo is told to skip)
    and ran eagerly at the eager step time; the advice was to compile it."""
    from neuron_explorer.rules.recompilation import compiled_ddp_wrapper

    if not len(breaks) or compiled_ddp_wrapper(breaks):
        return ""
    first = breaks.iloc[0]
    within = str(first.get("within") or "")
    if "fsdp" in within.lower():
        return (f"Dynamo broke at FSDP2's hooks (fully_shard's, which it is told not to "
                f"trace) at {first['source']}")
    reason = str(first["reason"]).split(":")[0]
    return f"Dynamo broke at {first['source']} ({reason}; the graph-break finding says more)"


def _small_buckets_first(trace: Trace) -> str:
    """Where DDP reduces the gradients in many small buckets, what compiling under them
    needs first: Dynamo splits the compiled graph at DDP's buckets and refuses a first
    bucket larger than the others (a user following the advice with bucket_cap_mb=0.001
    hit `First bucket should be smaller/equal to other buckets`)."""
    from neuron_explorer.analyses import communication as comm
    from neuron_explorer.analyses.steady_state import in_analysed_steps

    coll = in_analysed_steps(trace, comm.collectives(trace))
    reduces = coll[coll["collective"] == "all_reduce"]
    if not len(reduces):
        return ""
    per_step = len(reduces) / reduces["step"].nunique()
    # buckets under DDP's first one (1 MiB): below it, DDPOptimizer refuses them. Buckets
    # of one backward differ in size; a whole gradient reduced once a micro-batch does not
    if (per_step < SMALL_BUCKETS_PER_STEP or float(reduces["bytes"].median()) >= 1 << 20
            or reduces["bytes"].nunique() < 2):
        return ""
    return (f" With {per_step:.0f} gradient all-reduces a step (DDP's buckets), compiling "
            "under DDP needs bucket_cap_mb raised first, or "
            "torch._dynamo.config.optimize_ddp = False: Dynamo splits the graph at the "
            "buckets and fails on a first bucket larger than the others.")


# gradient all-reduces a step (of under 1 MiB) from which DDP's buckets count as small
SMALL_BUCKETS_PER_STEP = 3


def ddp_wrapped(trace: Trace) -> bool:
    """Whether a rank's model runs inside DistributedDataParallel: a rank that runs
    collectives and whose root module holds its model as `<root>.module` (DDP's
    attribute)."""
    from neuron_explorer import tables
    from neuron_explorer.common import trace_format as tf

    if not len(tables.of_kind(trace, tf.CAT_COLLECTIVE)):
        return False
    names = set(tables.of_kind(trace, tf.CAT_MODULE)["name"].astype(str))
    return any("." not in n and f"{n}.module" in names for n in names)


INTO_GRAPHS = "replay: the run replayed with its eager launches inside its graphs"
# a compiled run whose eager launches (copies and hooks' work left out) are this many
# times its graphs' launches, and at least EAGER_MIN_PER_STEP a step, launches mostly
# outside its graphs (at 2, a DDP model's eager loss, 5 launches a step beside 4 graphs,
# was claimed its gaps, 5.2x what compiling the loss saved)
EAGER_OVER_GRAPHS = 1.0
EAGER_MIN_PER_STEP = 4.0
EAGER_SITES_NAMED = 4


def _mostly_eager(trace: Trace) -> bool:
    """Whether a compiled run launches mostly eager ops outside its graphs (copies, the
    optimizer's zero_grad and the backward's gradient accumulation left out)."""
    from neuron_explorer.what_if.into_graphs import eager_launches

    launches = eager_launches(trace)
    steps = max(launches.graphs["step"].nunique(), 1)
    eager = len(launches.movable) + len(launches.optimizer) + len(launches.broken)
    return eager / steps >= max(EAGER_MIN_PER_STEP,
                                EAGER_OVER_GRAPHS * len(launches.graphs) / steps)


def _eager_beside_graphs(trace: Trace, optimizer_told: bool) -> str:
    """Advice for a compiled run whose launches are mostly eager ops outside its graphs:
    told to increase the batch size, a compiled LM's step stayed 2.06 ms; compiling its
    loss, clipping and optimizer step saved 845 us of the 854 claimed."""
    return into_graphs_advice(trace, optimizer_told) if _mostly_eager(trace) else ""


def into_graphs_advice(trace: Trace, optimizer_told: bool) -> str:
    """Bring the eager ops beside a compiled run's graphs (the loss, gradient clipping,
    the optimizer's step) into compiled code, naming where they are. Gradient
    accumulation's adds are named apart: compiling the loss or the step leaves them
    eager."""
    import pandas as pd
    from neuron_explorer.what_if.into_graphs import (
        accumulating_adds,
        eager_launches,
        zero_tangents,
    )

    launches = eager_launches(trace)
    steps = max(launches.graphs["step"].nunique(), 1)
    eager = pd.concat([launches.movable, launches.optimizer])
    per_step = len(eager) / steps
    sites = pd.concat([("at " + launches.movable["source"].astype(str)),
                       pd.Series("in the optimizer's step", index=launches.optimizer.index)])
    counts = sites[sites != "at "].value_counts()
    named = ", ".join(f"{n / steps:.0f} {site}" for site, n in
                      counts.head(EAGER_SITES_NAMED).items())
    more = len(counts) - EAGER_SITES_NAMED
    named += f" and more at {more} other line{'s' * (more > 1)}" if more > 0 else ""
    inside = left_by_breaks(trace)
    left = ""
    if inside:
        left = (f" {inside / steps:.0f} more run inside the compiled model's own calls: a "
                "graph break or Dynamo's recompile limit left them uncompiled (the "
                "recompilation or shape_recompiles finding says which, and counts them); "
                "fix that first: compiled code that calls the model breaks there too.")
    training = trains(trace)
    if not training:
        what = (" Move the work on the model's outputs (sampling, argmax, metric math) into "
                "the compiled function (and mark each request with neuron_explorer.step(): "
                "the model's return, which ends a step in the recording, is then inside "
                "compiled code)")
    elif loss_is_eager(launches.movable):
        what = " Compute the loss inside the compiled function" + (
            " and return its other outputs detached (an output returned with its gradient "
            "tracked that the loss does not use gets a zero gradient filled in each "
            "backward)" if zero_tangents(launches.movable).any() else "")
    elif accumulating_adds(launches.movable).any():
        what = " The loss is compiled already; bring in the rest"
    else:
        # the loss is compiled: what runs beside the graphs works on the model's outputs
        what = (" The loss is compiled already: compute the metrics on the model's outputs "
                "(argmax, softmax, running sums) inside the compiled function too, and "
                "return them detached (an output returned for metrics with its gradient "
                "tracked gets a zero gradient filled in each backward)")
    return (f"The model is already compiled, but {per_step:.0f} ops a step still launch one "
            "by one outside its graphs" + (f" ({named})" if named else "")
            + ": bring them into compiled code (the saving counts all of them brought in: "
            "a fix that brings in some saves their part)." + left + what
            + ((", and" if optimizer_told or fused_optimizer(trace) else
                " and construct the optimizer with fused=True, or")
               + " compile the rest of the step beside the model and its loss: what "
               "follows loss.backward() (gradient clipping, the optimizer step) as a "
               "function of its own, torch.compile'd (give clip_grad_norm_ a list of the "
               "parameters made once: a generator breaks the graph). Dynamo breaks a graph "
               "at backward(), so one "
               "compiled function holding the whole step runs as several graphs with eager "
               "work between; mark each step with neuron_explorer.step()" if training else "")
            + "; then keep Python work (logging, metric math) out of the hot loop."
            + _accumulations(launches.accumulations, steps)
            + _accumulating_at_backward(launches.movable, steps))


def _accumulating_at_backward(movable, steps: int) -> str:
    """What the advice says of the movable ops that are gradient accumulation's adds (the
    model compiled with its loss, as no module: no backward range holds them). A trial's
    compiled loss was told to compute its loss inside the compiled function again, and
    that these adds stay eager; compiled autograd saved 5.07 ms a step of 4.89 claimed."""
    from neuron_explorer.what_if.into_graphs import accumulating_adds

    adds = int(accumulating_adds(movable).sum())
    if not adds:
        return ""
    return (f" Of them, {adds / steps:.0f} a step at the backward() line are autograd adding "
            "each gradient into the .grad already there (gradient accumulation, or "
            "gradients zeroed in place), counted in the saving. "
            f"{COMPILED_AUTOGRAD}; fewer, larger micro-batches make fewer of them.")


def loss_is_eager(ops: pd.DataFrame) -> bool:
    """Whether a loss is among `ops` (rows of `trace.ops` beside the graphs): a loss
    function, or any op at the `backward()` line but the gradient it starts from and the
    zero gradients AOTAutograd fills in for outputs the loss did not use. A hand-written
    loss has no loss function, and eager, its backward runs at that line too; metrics on
    the model's outputs have no backward."""
    from neuron_explorer.common.op_families import LOSSES, base_name
    from neuron_explorer.what_if.into_graphs import (
        accumulating_adds,
        at_backward_line,
        backward_seed,
        zero_tangents,
    )

    names = ops["name"].astype(str)
    if names.map(lambda n: base_name(n) in LOSSES).any():
        return True
    return bool((at_backward_line(ops) & ~backward_seed(ops) & ~zero_tangents(ops)
                 & ~accumulating_adds(ops)).any())


# eager ops inside the compiled model's calls, from this share of those beside its graphs,
# are named as what a graph break or the recompile limit left
EAGER_LEFT_SHARE = 0.25


def _accumulations(adds, steps: int) -> str:
    """What the advice leaves: AccumulateGrad's adds in a compiled module's backward."""
    if not len(adds):
        return ""
    where = str(adds["source"].astype(str).mode().iloc[0])
    return (f" Left eager by both: {len(adds) / steps:.0f} adds a step at {where}, the "
            "backward adding each micro-batch's gradients into .grad (gradient "
            f"accumulation). {COMPILED_AUTOGRAD} (not counted here); fewer, larger "
            "micro-batches make fewer of them.")


COMPILED_AUTOGRAD = ("Compiled autograd brings them into the backward's graph: run "
                     "loss.backward() inside `with torch._dynamo.compiled_autograd._enable("
                     "torch.compile(backend=\"neuron\")):`")


def _predicted_compile(trace: Trace) -> str:
    """What a compiled what-if replay predicts for the step time (traces with op keys)."""
    from neuron_explorer.what_if.compiled import advised_compile_mode
    from neuron_explorer.what_if.replay import predicted_step_ns, prediction_too_large

    mode = advised_compile_mode(trace)
    predicted = predicted_step_ns(trace, mode)
    recorded = float(trace.steps["dur"].median()) if len(trace.steps) else 0.0
    if predicted is None and prediction_too_large(trace, mode):
        return (" `neuron-explorer whatif TRACE --mode compiled` replays the run compiled and "
                "gives the step it predicts (its programs are too large to predict here, "
                "while the report waits).")
    if predicted is None or not recorded:
        return ""
    saved = recorded - predicted
    flag = " --allow-rnn" if mode == "compiled_allow_rnn" else ""
    return (f" A compiled what-if replay predicts a step of {us(predicted)} instead of "
            f"{us(recorded)} ({recorded / max(predicted, 1):.1f}x; `neuron-explorer whatif "
            f"TRACE --mode compiled{flag}`), after compiling, which takes seconds at the first "
            "call and again for each new input shape"
            + (f": each second of compiling pays back over about {1e9 / saved:,.0f} steps"
               if saved > 0 else "") + "." + _rnn_sentence(trace, mode)
            + _looped_read_sentence(trace) + _forward_reads_sentence(trace)
            + _data_dependent_shape_sentence(trace))


def _forward_reads_sentence(trace: Trace) -> str:
    """For a model whose forward reads device values on the host (not inside a loop:
    `_looped_read_sentence`'s): the prediction compiles the forward whole, and Dynamo
    breaks its graph at each read. A trial's nn.Transformer, claimed 128 ms a step by
    compiling, saved 2.6 until its causal-mask check stopped reading the mask."""
    import numpy as np
    from neuron_explorer.analyses.phases import in_analysed_work, model_calls
    from neuron_explorer.analyses.step_breakdown import counted_steps
    from neuron_explorer.common import trace_format as tf
    from neuron_explorer.rules.recompilation import CAUSAL_MASK_FIX
    from neuron_explorer.tables import assign_steps, kind_mask
    from neuron_explorer.what_if.compiled import looped_reads

    if looped_reads(trace):
        return ""
    slices = trace.table("slices")
    syncs = slices[kind_mask(trace, (tf.CAT_SYNC,))]
    syncs = in_analysed_work(trace, syncs.assign(step=assign_steps(
        syncs["ts"].to_numpy(np.int64), trace.steps)))
    calls = model_calls(trace)
    if not len(syncs) or not len(calls):
        return ""
    ts = syncs["ts"].to_numpy(np.int64)
    inside = np.zeros(len(syncs), bool)
    for start, end in zip(calls["ts"].tolist(), calls["end"].tolist(), strict=True):
        inside |= (ts >= start) & (ts < end)
    if not inside.any():
        return ""
    ids = syncs["id"].to_numpy(np.int64)[inside]
    within = pd.Series(trace.slice_args.texts(tf.ARG_WITHIN, ids)).astype(str)
    sources = pd.Series(trace.slice_args.texts(tf.ARG_SOURCE, ids)).astype(str)
    torch_call = within[within != ""].mode()
    where = sources[sources != ""].mode()
    said = (f" at {where.iloc[0]}" if len(where) else "") + (
        f", inside torch's `{torch_call.iloc[0].rpartition(' in ')[2]}`" if len(torch_call)
        else "")
    causal = bool(len(torch_call)) and "torch/nn/modules/transformer.py" in torch_call.iloc[0]
    fix = (CAUSAL_MASK_FIX if causal else "remove the read, keep the value on the device, or "
           "set torch._dynamo.config.capture_scalar_outputs = True")
    per_step = inside.sum() / max(counted_steps(trace), 1)
    return (f" That is with the forward compiled whole: it reads a device value on the host "
            f"({per_step:.3g} a step{said}), and Dynamo breaks the graph at each read, "
            f"running the code around it eagerly; first {fix}.")


def _data_dependent_shape_sentence(trace: Trace) -> str:
    """For a model that runs ops whose output's size depends on the data (`nonzero` picking
    a mixture-of-experts' tokens): the setting the prediction assumes. By default Dynamo
    breaks the graph at each, and one inside a loop leaves the whole forward eager (a
    trial's router: 14.8 ms a step predicted, 0.3 ms saved without the setting, 14.9 with
    it), as does a Python branch on such a size."""
    from neuron_explorer.analyses.phases import in_analysed_work
    from neuron_explorer.common.op_families import DATA_DEPENDENT_SHAPES, base_name

    ops = in_analysed_work(trace, trace.ops[trace.ops["step"] >= 0])
    if "graph_id" in ops:
        ops = ops[ops["graph_id"].to_numpy() < 0]
    names = ops["name"].astype(str)
    found = ops[names.map(lambda n: base_name(n) in DATA_DEPENDENT_SHAPES).to_numpy(bool)]
    if not len(found):
        return ""
    sites = found.groupby([found["name"].astype(str), found["source"].astype(str)]).size()
    (name, source), _ = next(iter(sites.sort_values(ascending=False).items()))
    looped = bool((found.groupby(["step", found["source"].astype(str)]).size() > 1).any())
    return (" That is with `torch._dynamo.config.capture_dynamic_output_shape_ops = True` set "
            f"before compiling: by default Dynamo breaks the graph at `{name}`"
            + (f" ({source})" if source else "") + ", whose output's size depends on the data"
            + (", and a break inside a loop runs the whole forward eagerly" if looped else "")
            # a trial's router skipped experts no token chose: with the setting, that branch
            # still broke the graph and compiling saved 2%; without it, 0.99x the figure
            + ". A Python branch on that size (`if idx.numel() == 0: continue`, skipping an "
            "expert no token chose) breaks the graph even so: drop it, as ops on an empty "
            "selection do nothing.")


def _looped_read_sentence(trace: Trace) -> str:
    """For a model whose forward reads a device value in a loop: why compiling it as it is
    saves nothing, and what to change first."""
    from neuron_explorer.what_if.compiled import looped_reads

    looped = looped_reads(trace)
    if not looped:
        return ""
    where = ", ".join(f"`{module}` at {line}" for module, line in list(looped.items())[:3])
    return (f" That is with the forward as it is: it reads a device value on the host inside "
            f"a loop ({where}), and a graph break inside a loop makes Dynamo run the whole "
            "forward eagerly. Take the read out of the loop first (decide on the device with "
            "torch.where, or check every N steps: see the sync finding); then compiling fuses "
            "the loop's ops.")


def _rnn_sentence(trace: Trace, mode: str) -> str:
    """For a model with RNN modules: the setting the prediction assumes, and the step
    predicted without it (Dynamo leaves them eager by default)."""
    from neuron_explorer.what_if.compiled import compile_skipped_modules
    from neuron_explorer.what_if.replay import predicted_step_ns

    if mode != "compiled_allow_rnn":
        return ""
    rnns = [path for path, why in compile_skipped_modules(trace).items() if why == "rnn"]
    as_is = predicted_step_ns(trace, "compiled")
    return (" That is with `torch._dynamo.config.allow_rnn = True` set before compiling: "
            f"by default Dynamo does not trace nn.RNN, nn.GRU or nn.LSTM, so "
            f"{', '.join(f'`{p}`' for p in rnns[:3])} would run eager between graphs"
            + (f" and the step stay at about {us(as_is)}" if as_is is not None else "") + ".")
