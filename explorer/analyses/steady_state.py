"""Which steps the per-step figures use: the steady state, not warm-up and compilation.

A compiled run spends its first steps compiling (seconds, against milliseconds for
a steady step); averaging them in says nothing about the step the user will run a
million times. So breakdowns, MFU/MBU, op statistics and `diff` use:
- the user's `--steps START:STOP` window when the recording had one;
- otherwise the steps after the last one that compiled or recompiled; where the last
  step compiled again (a short last batch), the steps that compiled nothing (every step
  when all of them did); when none did, every step but an eager warm-up: a first step
  (or two) over WARMUP_FACTOR x the median of the others pays one-time costs (the
  optimizer's state, first allocations, the framework's caches) the later steps do not;
- in both cases without the code after the last step mark (the recorder writes
  which steps a mark ended), unless nothing else is left, and without a PyTorch
  profiler's last step where the profile stopped just into it (a fragment, under
  FRAGMENT_SHARE of the others' median);
- without a first step of set-up alone: uploads, no model call (a loop calling
  `neuron_explorer.step()` at the top of each iteration ends a step of the set-up with
  its first call);
- and, in a recording cut short (killed, or damaged part-way: the loader warned), only
  the steps that end before its ops or kernels stop (or, when none does, the step they
  stop in): the trace lost the later steps' device events, which would read as a device
  idle all step.
Compile time is reported on its own (`compile_summary`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.common import trace_format as tf
from neuron_explorer.memo import memoised
from neuron_explorer.tables import assign_steps, kind_mask

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace


@dataclass(frozen=True)
class StepSelection:
    """The steps analysed, out of the steps recorded, and why those."""

    steps: tuple[int, ...]  # analysed
    recorded: tuple[int, ...]  # every step slice in the trace
    reason: str  # "after the last compile (step 0)", "the --steps 2:4 window", ...
    # leading steps left out as an eager warm-up; None where that rule does not apply
    # (a recorded window, a compile, no steps)
    warm_up: int | None = None

    def describe(self) -> str:
        """'steps 1–5 of 0–6 (after the last compile, in step 0)'."""
        if not self.recorded:
            return "the whole trace (no steps)"
        text = f"{_ranges(self.steps)} of {_ranges(self.recorded, bare=True)}"
        return f"{text} ({self.reason})" if self.reason else text


def _ranges(steps: tuple[int, ...], bare: bool = False) -> str:
    """(1, 2, 3, 5) -> 'steps 1–3, 5'."""
    if not steps:
        return "none"
    parts: list[str] = []
    start = prev = steps[0]
    for s in (*steps[1:], None):
        if s is not None and s == prev + 1:
            prev = s
            continue
        parts.append(f"{start}–{prev}" if prev > start else f"{start}")
        if s is not None:
            start = prev = s
    prefix = "" if bare else ("step " if len(steps) == 1 else "steps ")
    return prefix + ", ".join(parts)


WARMUP_FACTOR = 1.5
WARMUP_STEPS_MAX = 2  # leading steps that can be a warm-up
WARMUP_MIN_STEPS = 3  # with fewer steps, no step is called a warm-up
FRAGMENT_SHARE = 0.05  # a profiler's last step under this share of the others' is a fragment


def warmup_steps(trace: Trace, candidates: tuple[int, ...]) -> tuple[int, ...]:
    """The leading steps of `candidates` that are an eager warm-up (see the module doc)."""
    dur = trace.steps.set_index("step")["dur"]
    return candidates[:warmup_count([float(dur[s]) for s in candidates])]


def warmup_count(durations: Sequence[float], shorter_too: bool = False) -> int:
    """How many leading steps of these, in order, are an eager warm-up: each over
    WARMUP_FACTOR x the median of the steps after it (`shorter_too`: or under the median
    / WARMUP_FACTOR, a first step that lacks what the later ones do)."""
    if len(durations) < WARMUP_MIN_STEPS:
        return 0
    warm = 0
    for first in durations[:WARMUP_STEPS_MAX]:
        rest = durations[warm + 1:]
        if len(rest) < WARMUP_MIN_STEPS - 1:
            break
        median = float(np.median(rest))
        if not (first > WARMUP_FACTOR * median
                or (shorter_too and first * WARMUP_FACTOR < median)):
            break
        warm += 1
    return warm


def compiling_steps(trace: Trace) -> set[int]:
    """Steps holding a compile span, a recompile or a graph break."""
    s = trace.table("slices")
    kinds = (tf.CAT_COMPILE, tf.CAT_RECOMPILE, tf.CAT_GRAPH_BREAK)
    ev = s[s["kind"].isin(kinds)]
    if not len(ev) or not len(trace.steps):
        return set()
    ts = ev["ts"].to_numpy(np.int64)
    starts = assign_steps(ts, trace.steps)
    ends = assign_steps(ts + np.maximum(ev["dur"].to_numpy(np.int64) - 1, 0), trace.steps)
    return {int(x) for x in np.r_[starts, ends] if x >= 0}


def training_steps(trace: Trace) -> set[int]:
    """Steps holding a backward or an optimizer step."""
    return memoised(trace, "training_steps", lambda: _training_steps(trace))


def _training_steps(trace: Trace) -> set[int]:
    s = trace.table("slices")
    mask = kind_mask(trace, (tf.CAT_BACKWARD, tf.CAT_OPTIMIZER))
    found = assign_steps(s["ts"].to_numpy(np.int64)[mask], trace.steps)
    return {int(x) for x in found if x >= 0}


def _compiles_that_matter(trace: Trace) -> set[int]:
    """The compiling steps that end a warm-up: in a run that trains, the training steps'
    (the per-step figures are theirs). A model sampled after training recompiles for
    `model.eval()` in its first sampling step; analysed after that, a train-then-sample
    run had no training step left and an empty report."""
    compiling = compiling_steps(trace)
    training = training_steps(trace) if compiling else set()
    return compiling & training if training else compiling


def completed_steps(trace: Trace) -> pd.DataFrame:
    """The step slices without the code after the last step mark (the unfinished step
    the recorder names in its metadata), unless nothing else is left."""
    steps = trace.steps
    completed = trace.metadata.get("steps_completed")
    if not isinstance(completed, list) or not len(steps):
        return steps
    done = steps[steps["step"].isin(completed)]
    return done if len(done) else steps


# in the loaders' warnings for a truncated file and for one damaged part-way: both lost
# the events written after the cut
CUT_SHORT = ("(was the recording killed?)", "the rest of the file is lost")


def cut_short(trace: Trace) -> bool:
    """Whether the recording was cut short (killed, or its file damaged part-way): it holds
    the run up to the cut."""
    return any(mark in w for w in trace.warnings for mark in CUT_SHORT)


def device_data_end(trace: Trace) -> tuple[int, int] | None:
    """Where a recording cut short stops holding ops, kernels and engine instructions, as
    (start, end) of the last event of the family that stops first: each family is written
    in time order, so a step that ends before that start holds all its events (None: not
    cut short, or it recorded none). The instructions are written in batches behind the
    kernels: a recording cut at half its file kept every step's kernels and the first
    half's instructions, and the steps without theirs doubled the host-bound finding."""
    if not cut_short(trace):
        return None
    last = [(int(t["ts"].max()), int((t["ts"] + t["dur"]).max()))
            for t in (trace.ops, trace.kernels, trace.instructions) if len(t)]
    return min(last) if last else None


def _without_trailing_fragment(trace: Trace, steps: tuple[int, ...]
                               ) -> tuple[tuple[int, ...], str]:
    """The steps of a PyTorch profiler's trace without its last one where that is a
    fragment, under FRAGMENT_SHARE of the others' median: the profile stopped just after
    `prof.step()` opened it (an MI250 trace's ProfilerStep#2 of 49 us beside a 9.3 ms
    step made a median step of 4.7 ms). Our recorder says which steps a mark ended."""
    from neuron_explorer.device_terms import device_terms

    if len(steps) < 2 or device_terms(trace.metadata).recorded_here:
        return steps, ""
    dur = trace.steps.set_index("step")["dur"]
    last, others = steps[-1], float(np.median(dur.reindex(steps[:-1]).to_numpy()))
    if not float(dur.get(last, 0)) < FRAGMENT_SHARE * others:
        return steps, ""
    return steps[:-1], (f"step {last} is a fragment, {float(dur.get(last, 0)) / 1e3:.0f} us: "
                        "the profile stopped in it")


def _with_device_data(trace: Trace, steps: tuple[int, ...]) -> tuple[tuple[int, ...], str]:
    """The steps of `steps` that hold the device events of a cut-short recording, and why:
    those that end before its events stop, else the one they stop in (held in part)."""
    data = device_data_end(trace)
    if data is None:
        return steps, ""
    start, end = data
    s = trace.steps.set_index("step")
    whole = tuple(n for n in steps if int(s.at[n, "ts"] + s.at[n, "dur"]) <= start)
    kept = whole or tuple(n for n in steps if int(s.at[n, "ts"]) < end)[-1:]
    if not kept or len(kept) == len(steps):
        return steps, ""
    stops = next((n for n in steps if n not in whole), steps[-1])
    return kept, (f"the recording was cut short: its device events stop in step {stops}"
                  + ("" if whole else ", analysed in part"))


def select_steps(trace: Trace, warm_up: int | None = None) -> StepSelection:
    """The steady-state steps of `trace` (see the module doc); `warm_up`: leave out that
    many leading steps as the eager warm-up, whatever their length (`diff` aligns two
    runs so)."""
    recorded = tuple(int(s) for s in trace.steps["step"].tolist())
    if not recorded:
        return StepSelection((), (), "")
    candidates = recorded
    notes: list[str] = []
    done = tuple(int(s) for s in completed_steps(trace)["step"].tolist())
    if len(done) < len(recorded):
        candidates = done
        notes.append(f"step {recorded[-1]} is the code after the last step mark")
    candidates, cut = _with_device_data(trace, candidates)
    if cut:
        notes.append(cut)
    candidates, fragment = _without_trailing_fragment(trace, candidates)
    if fragment:
        notes.append(fragment)
    before = trace.metadata.get("steps_before_marks")
    if isinstance(before, int) and 0 < before < len(candidates) and \
            not _marks_begin_another_phase(trace, before):
        # the model's returns ended steps until the first neuron_explorer.step(): those and
        # the one that mark ended are pieces of the first iteration, not steps
        candidates = tuple(s for s in candidates if s >= before)
        notes.append(f"{_ranges(tuple(range(before)))} end before the first step mark")
    if _setup_before_the_marks(trace, candidates):
        notes.append(f"step {candidates[0]} is the set-up before the first step mark")
        candidates = candidates[1:]
    window = trace.metadata.get("steps")
    if isinstance(window, list) and window:
        stop = window[1] if len(window) > 1 and window[1] is not None else ""
        return StepSelection(candidates, recorded, "; ".join(
            [f"the recorded window --steps {window[0]}:{stop}", *notes]))
    compiling = _compiles_that_matter(trace)
    last = max((s for s in compiling if s in candidates), default=None)
    if last is not None:
        after = tuple(s for s in candidates if s > last)
        # the last step compiled again (a short last batch, a new shape): the steps that
        # compiled none are the steady ones. A compiled loader loop whose last batch
        # recompiled was analysed whole, its 64 ms of compile "per step" hiding every
        # finding.
        quiet = tuple(s for s in candidates if s not in compiling)
        if after:
            candidates = after
            notes.insert(0, f"after the last compile, in step {last}")
        elif quiet:
            compiled = _ranges(tuple(sorted(compiling & set(candidates))))
            candidates = quiet
            notes.insert(0, f"the steps that compiled nothing ({compiled} compiled)")
        else:
            notes.insert(0, "every step compiles: no steady state recorded")
        return StepSelection(candidates, recorded, "; ".join(notes))
    warm = (warmup_steps(trace, candidates) if warm_up is None
            else candidates[:warm_up] if len(candidates) >= max(WARMUP_MIN_STEPS, warm_up + 1)
            else ())
    if warm:
        candidates = candidates[len(warm):]
        notes.insert(0, f"after the warm-up, {_ranges(warm)}")
    return StepSelection(candidates, recorded, "; ".join(notes), len(warm))


# what a step of the program's loop runs (the recorder opens a step at its first such event)
_ACTIVITY = (tf.CAT_MODULE, tf.CAT_BACKWARD, tf.CAT_OPTIMIZER, tf.CAT_DATALOADER,
             tf.CAT_COMPILE, tf.CAT_ANNOTATION)


def _marks_begin_another_phase(trace: Trace, before: int) -> bool:
    """Whether the steps ended before the first step mark (`before` of them) trained and
    the marked ones do not: a loop that samples after training marks its own steps, and
    the training steps before are steps, not pieces of its first iteration."""
    training = training_steps(trace)
    return any(s < before for s in training) and not any(s >= before for s in training)


def _setup_before_the_marks(trace: Trace, candidates: tuple[int, ...]) -> bool:
    """Whether the first of `candidates` is the set-up before a loop that calls
    `neuron_explorer.step()` at the top of each iteration: the first mark ended a step of
    uploads alone (`model.to`, the inputs), with no model call, backward, optimizer step or
    annotation in it, where every later step has them. A decoding loop's 3.3 ms of copies
    was analysed as its first step, tagged "eval", and entered every per-step claim."""
    if (trace.metadata.get("step_boundary") != "explicit" or len(candidates) < 2
            or candidates[0] != int(trace.steps["step"].iloc[0])):
        return False
    s = trace.table("slices")
    ev = s[s["kind"].isin(_ACTIVITY)]
    active = set(assign_steps(ev["ts"].to_numpy(np.int64), trace.steps).tolist())
    return candidates[0] not in active and all(c in active for c in candidates[1:])


def analysed_steps(trace: Trace) -> StepSelection:
    """`select_steps`, computed once per trace."""
    return memoised(trace, "steady_steps", lambda: select_steps(trace))


def in_analysed_steps(trace: Trace, frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of a table with a `step` column that belong to the analysed steps (every row
    of a trace without steps)."""
    if not len(trace.steps) or not len(frame):
        return frame
    wanted = analysed_steps(trace).steps
    return frame[frame["step"].isin(wanted)]
