"""`whatif(trace, hardware=..., mode=..., dtype=...)`: a recorded run re-timed on other
hardware, in another mode or dtype, without running it again.

The recording's op stream (each op slice's op key, `op_key_codec`) is lowered and
scheduled again by the backend's own lowering and timeline (`backend/replay.py`, or
`what_if.compiled` for `mode="compiled"`); host time between launches is kept from the
recording and sync waits are re-derived. The result is written as a trace with the
recorded layout (`what_if.writer`) and loaded, so `report`, `diff` and the dashboard
read it like any other; its metadata's "whatif" entry says it is a prediction and of
what. docs/whatif.md explains what is exact and what is approximated.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from neuron_explorer import tables
from neuron_explorer.analyses.steady_state import device_data_end, in_analysed_steps
from neuron_explorer.common import op_key_codec
from neuron_explorer.common import trace_format as tf
from neuron_explorer.common.errors import NeuronExplorerError
from neuron_explorer.common.presets import PRESETS
from neuron_explorer.memo import memoised
from neuron_explorer.trace import Trace, load
from neuron_explorer.what_if.label import META_WHATIF
from neuron_explorer.what_if.options import DTYPES, HARDWARE, MODES

_RECORD_HINT = ("record the program again with `neuron-explorer record --level op` (or "
                "--level engine) in eager mode")
# Why a trace holds no op keys, in the words of its format (for the message only)
_NO_KEYS = {
    "kineto_json": f"it is a PyTorch-profiler (Kineto) trace; {_RECORD_HINT}",
    "": ("it was recorded before op slices carried op keys (or by a program that launched "
         f"no eager op); {_RECORD_HINT}, with this version"),
}


class WhatIfError(NeuronExplorerError):
    """A trace cannot be re-timed as asked (it lacks op keys, or an option is wrong)."""


@dataclass(frozen=True)
class WhatIfOptions:
    """What to predict; None keeps what the recording had."""

    hardware: str | None = None
    mode: str = "eager"
    dtype: str | None = None
    launch_overhead_us: float | None = None
    allow_rnn: bool = False  # compiled: RNN modules compiled too (Dynamo's allow_rnn)

    def check(self) -> None:
        if self.hardware is not None and self.hardware not in HARDWARE:
            raise WhatIfError(f"unknown hardware {self.hardware!r}: use one of "
                              f"{', '.join(HARDWARE)}")
        if self.mode not in MODES:
            raise WhatIfError(f"unknown mode {self.mode!r}: use eager or compiled")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise WhatIfError(f"unknown dtype {self.dtype!r}: use bf16 or fp8 (matmuls)")
        if self.dtype is not None and self.mode == "compiled":
            # under autocast a graph casts around each matmul inside itself: on a small
            # MLP that made the compiled step's device time 4% longer, where retyping
            # the matmuls alone predicted it 1.5% shorter
            raise WhatIfError("--dtype is predicted for eager runs only: a compiled graph "
                              "under autocast casts around its matmuls, which the replay "
                              "does not model; record the compiled run under autocast, or "
                              "predict --dtype on the eager run")
        if self.allow_rnn and self.mode != "compiled":
            raise WhatIfError("--allow-rnn goes with --mode compiled: it says how "
                              "torch.compile treats RNN, GRU and LSTM modules")
        if self.launch_overhead_us is not None and not self.launch_overhead_us >= 0:
            raise WhatIfError(f"--launch-overhead {self.launch_overhead_us} is negative: "
                              "give the host time per launch in µs, 0 or more")


def is_prediction(trace: Trace) -> bool:
    """Whether `trace` was predicted by `whatif` rather than recorded."""
    return isinstance(trace.metadata.get(META_WHATIF), dict)


def replayable(trace: Trace) -> bool:
    """Whether the rules may replay `trace`'s fixes: a recording, or a prediction that moved
    it to other hardware only. Such a prediction holds the recording's eager ops with
    their op keys and host times, re-timed on the preset it names, so its replays are what
    a recording made there replays (a trn1 prediction's findings were estimates where the
    trn1 recording's were replays: 764 us against 1462 for host_bound). A prediction in
    bf16, compiled, or with another launch overhead than its preset's is not what its
    ops and preset say."""
    meta = trace.metadata.get(META_WHATIF)
    if not isinstance(meta, dict):
        return True
    if meta.get("mode") != "eager" or meta.get("dtype") is not None:
        return False
    preset = PRESETS.get(str(meta.get("hardware")))
    return preset is not None and meta.get("launch_overhead_ns") == \
        preset.host_launch_overhead_ns


def recorded_ops(trace: Trace, whole_run: bool = True) -> pd.DataFrame:
    """The eager op stream of `trace` with each op's key decoded (column `key`), or a
    WhatIfError that names the recording level needed. `whole_run`: the replay stands for
    every step (a predicted trace), which a recording cut short cannot give; the rules'
    predictions compare the analysed steps only, which end before the cut."""
    name = trace.path or "the trace"
    ops = tables.of_kind(trace, tf.CAT_OP)
    if not len(ops):
        level = trace.metadata.get(tf.META_LEVEL) or "framework"
        raise WhatIfError(
            f"{name} was recorded at --level {level}, which holds no ops: a what-if needs "
            f"an op-level or engine-level recording; {_RECORD_HINT}")
    if whole_run and device_data_end(trace) is not None:  # its last steps predicted empty
        raise WhatIfError(
            f"{name} was cut short (the recording was killed): the ops of its last steps "
            "are lost, so a what-if would predict those steps without their work; predict "
            "a recording that ran to its end")
    ids = ops["id"].to_numpy()
    keys = trace.slice_args.column(tf.ARG_OP_KEY, ids)
    has_key = np.fromiter((k is not None for k in keys), bool, len(keys))
    graphs = tables.number(trace, tf.ARG_GRAPH_ID, ids, default=-1) >= 0
    if graphs.any():
        raise WhatIfError(
            f"{name} holds compiled-graph launches, whose op streams are not in the trace; "
            "record the program without torch.compile (eager) and predict it with "
            "--mode compiled")
    if not has_key.any():
        why = _NO_KEYS.get(trace.source_format, _NO_KEYS[""])
        raise WhatIfError(f"{name} holds no neuron op keys to re-time: {why}")
    texts = trace.args.texts
    shapes, dtypes = texts(tf.ARG_SHAPES, ids), texts(tf.ARG_DTYPES, ids)
    names = ops["name"].to_numpy()
    decoded = [_decoded(i, n, s, d, k) if k is not None else None
               for i, n, s, d, k in zip(ids.tolist(), names, shapes, dtypes, keys, strict=True)]
    out = ops[["id", "ts", "dur", "name", "track_id"]].copy()
    out["device"] = tables.number(trace, tf.ARG_DEVICE, ids, default=0)
    out["key"] = pd.Series(decoded, index=out.index, dtype=object)
    return out


def _decoded(slice_id: int, name: str, shapes: str, dtypes: str, key: str):
    """The op key of one op slice, or None (with a warning naming the slice) when it does
    not decode: that op is replayed with its recorded times, as ops without keys are."""
    import warnings

    try:
        return op_key_codec.decode(name, shapes, dtypes, key)
    except op_key_codec.OpKeyError as exc:
        warnings.warn(f"op slice {slice_id}: {exc}; it keeps its recorded times",
                      stacklevel=3)
        return None


def _default_output(trace: Trace, options: WhatIfOptions) -> str:
    tag = hashlib.sha1(repr((os.path.abspath(trace.path or ""), asdict(options))).encode())
    folder = os.path.join(tempfile.gettempdir(), "neuron-explorer-whatif")
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, f"whatif-{tag.hexdigest()[:12]}.pftrace")


def whatif(trace: Trace | str | os.PathLike, hardware: str | None = None, *,
           mode: str = "eager", dtype: str | None = None,
           launch_overhead_us: float | None = None, allow_rnn: bool = False,
           output: str | os.PathLike | None = None) -> Trace:
    """`trace` (an eager op- or engine-level recording) predicted on `hardware` (trn1,
    trn2, trn3; default: as recorded), in `mode` (eager or compiled; `allow_rnn`: with
    `torch._dynamo.config.allow_rnn = True`, RNN modules compiled too), with matmuls in
    `dtype` (bf16, fp8) and `launch_overhead_us` of host time per launch; written to
    `output` (default: a file in the temporary folder) and returned as a Trace."""
    from neuron_explorer.what_if.writer import write_prediction

    if not isinstance(trace, Trace):
        loaded = load(trace)
        if not isinstance(loaded, Trace):
            raise WhatIfError(f"{trace} is a run of several ranks: predict one rank's trace")
        trace = loaded
    options = WhatIfOptions(hardware, mode, dtype, launch_overhead_us, allow_rnn)
    options.check()
    if is_prediction(trace):
        raise WhatIfError(f"{trace.path} is itself a prediction: predict from the recording "
                          f"it came from ({trace.metadata[META_WHATIF].get('from')})")
    ops = recorded_ops(trace)
    path = str(output) if output is not None else _default_output(trace, options)
    write_prediction(trace, ops, options, path)
    predicted = load(path)
    assert isinstance(predicted, Trace)
    return predicted


def op_keys(trace: Trace, op_ids: np.ndarray) -> list[tuple] | None:
    """The decoded op key of each op slice of `op_ids`; None where there are none, or one
    is missing or damaged."""
    if not len(op_ids):
        return None
    keys = trace.slice_args.column(tf.ARG_OP_KEY, op_ids)
    if any(k is None for k in keys):
        return None
    names = tables.slice_names(trace)[op_ids]
    shapes = trace.args.texts(tf.ARG_SHAPES, op_ids)
    dtypes = trace.args.texts(tf.ARG_DTYPES, op_ids)
    try:
        return [op_key_codec.decode(*row) for row in zip(
            names.tolist(), shapes.tolist(), dtypes.tolist(), keys.tolist(), strict=True)]
    except op_key_codec.OpKeyError:
        return None


# A rule's compiled prediction gives up past this many dependencies in one program: the
# padded matmuls of odd_dims.pftrace made 75 M of them, 25-80 s of scheduling in a report.
# At 2 M a user's 16384-row elementwise blocks (8-16 M) gave up (2.1 s of CPU) and
# memory_bound_ops fell back to its roof estimate, 12x what compiling saved; replayed
# whole, 3.6 s.
PREDICTION_MAX_DEPENDENCIES = 16_000_000


def predicted_step_ns(trace: Trace, mode: str = "compiled") -> float | None:
    """The median step time a what-if replay in `mode` predicts on the recorded preset
    ("eager", "compiled", "compiled_allow_rnn": RNN modules compiled too, or
    "compiled_without_reads": the reads of a device value in a loop gone; any of the
    compiled ones with "_step" after it: the training step compiled, the loss with the
    model), without
    writing a trace (rules state it as the saving of their fix); None for a
    trace without op keys or steps, or whose compiled programs are too large to schedule
    while a report waits (`prediction_too_large`). Cached on the trace."""
    return _prediction(trace, mode)[0]


def predicted_device_ns(trace: Trace, mode: str = "compiled") -> float | None:
    """The device time (every kernel's length, summed) of the analysed steps' ops (their
    eval passes left out) in a what-if replay in `mode` on the recorded preset; None where
    `predicted_step_ns` is.
    Mode "eager" gives the recorded kernels' lengths back, lowered again: the baseline a
    rule compares another mode's device time with."""
    return _prediction(trace, mode)[2]


def prediction_too_large(trace: Trace, mode: str = "compiled") -> bool:
    """Whether `predicted_step_ns` gave up because the programs are too large to schedule
    while a report waits (`neuron-explorer whatif` still replays them whole)."""
    return _prediction(trace, mode)[1]


def replay_inputs(trace: Trace) -> tuple[pd.DataFrame, list] | None:
    """The recording's host rows and replay events (`what_if.writer.host_events`) for the
    predictions rules state while a report waits; None for a prediction the rules do not
    replay (`replayable`), a trace without steps, or one the replay cannot re-time (no op
    keys, compiled graphs)."""
    from neuron_explorer.what_if.writer import host_events

    if not replayable(trace) or not len(trace.steps):
        return None
    try:
        # a recording cut short too: its analysed steps end before the cut (a killed
        # run's host-bound finding fell back to its gaps, 2.5x what compiling saved)
        ops = recorded_ops(trace, whole_run=False)
    except WhatIfError:
        return None
    return host_events(trace, ops)


def _prediction(trace: Trace, mode: str) -> tuple[float | None, bool, float | None]:
    """(predicted median step ns or None, whether it was given up as too large, the
    analysed steps' predicted device ns or None)."""
    def compute() -> tuple[float | None, bool, float | None]:
        from neuron_explorer.backend.replay import ReplayOptions, replay

        inputs = replay_inputs(trace)
        if inputs is None:
            return None, False, None
        rows, events = inputs
        options = ReplayOptions(trace.hardware or "trn2")
        base = mode.removesuffix("_step")
        if base in ("compiled", "compiled_allow_rnn", "compiled_without_reads"):
            from neuron_explorer.what_if.compiled import ProgramTooLarge, replay_compiled

            try:
                replayed, shift, _ = replay_compiled(
                    trace, rows, events, options, PREDICTION_MAX_DEPENDENCIES,
                    allow_rnn=base == "compiled_allow_rnn",
                    without_reads=base == "compiled_without_reads",
                    whole_step=mode.endswith("_step"))
            except ProgramTooLarge:
                return None, True, None
        else:
            replayed, shift = replay(events, options)
        # the steps every per-step figure uses (after the warm-up), as the predicted
        # trace's own report does: `report` and `whatif` state one figure
        steps = in_analysed_steps(trace, trace.steps)
        start = steps["ts"].to_numpy(np.int64)
        host = shift(start + steps["dur"].to_numpy(np.int64)) - shift(start)
        recorded_ts = rows["ts"].to_numpy(np.int64)
        return (_paced_median(steps, host, recorded_ts, replayed), False,
                _device_ns(trace, steps, recorded_ts, replayed))

    return memoised(trace, f"whatif_step_ns:{mode}", compute)


def _device_ns(trace: Trace, steps: pd.DataFrame, recorded_ts: np.ndarray,
               replayed: list) -> float:
    """The length of every kernel the replayed ops launched from inside `steps`, less
    the eval passes recorded in them (as every finding counts a step's work)."""
    from neuron_explorer.analyses.phases import without_eval

    start = steps["ts"].to_numpy(np.int64)
    end = start + steps["dur"].to_numpy(np.int64)
    at = np.searchsorted(start, recorded_ts, side="right") - 1
    inside = np.flatnonzero((at >= 0) & (recorded_ts < end[np.maximum(at, 0)]))
    launched = without_eval(trace, pd.DataFrame(
        {"step": steps["step"].to_numpy()[at[inside]], "ts": recorded_ts[inside]},
        index=inside))
    return float(sum(k.end_ns - k.start_ns for i in launched.index
                     if replayed[i] is not None for k in replayed[i].kernels))


def _paced_median(steps: pd.DataFrame, host: np.ndarray, recorded_ts: np.ndarray,
                  replayed: list) -> float:
    """The predicted median step: the host's windows `host`, or where the predicted device
    falls behind its host, the time between the ends of consecutive steps' device work
    (`analyses.device_pace`, as the predicted trace's report reads it)."""
    from neuron_explorer.analyses.device_pace import MIN_INTERVALS, device_behind

    start = steps["ts"].to_numpy(np.int64)
    end = start + steps["dur"].to_numpy(np.int64)
    device_end = np.full(len(steps), np.nan)
    for i, op in enumerate(replayed):
        if op is None or not op.kernels:
            continue
        at = int(np.searchsorted(start, recorded_ts[i], side="right")) - 1
        if at >= 0 and recorded_ts[i] < end[at]:
            device_end[at] = np.fmax(device_end[at], max(k.end_ns for k in op.kernels))
    number = steps["step"].to_numpy(np.int64)
    # each step's interval from the step before's device work (NaN: not a step after it)
    intervals = np.full(len(steps), np.nan)
    intervals[1:] = np.where(np.diff(number) == 1, np.diff(device_end), np.nan)
    known = intervals[~np.isnan(intervals)]
    host_median = float(np.median(host))
    if len(known) < MIN_INTERVALS or not device_behind(np.asarray(host), intervals):
        return host_median
    return float(np.median(known))
