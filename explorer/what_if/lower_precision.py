"""A float32 recording's ops as they would run in a lower precision (`whatif --dtype`, and
the saving the FP32-matmul finding states): under autocast, each tensor's dtype follows
the recorded data flow (`backend.mixed_precision.plan`); with the model cast whole,
every float32 tensor is in the lower precision."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.memo import memoised

if TYPE_CHECKING:
    from neuron_explorer.backend.mixed_precision import Planned
    from neuron_explorer.trace import Trace


def planned(trace: Trace, rows: pd.DataFrame, events: list, dtype: str,
            whole_model: bool = False) -> list[Planned | None]:
    """Per host event (`what_if.writer.host_events`), its op as it would run in `dtype`;
    None for what is not an op with a key."""
    from neuron_explorer.backend.mixed_precision import Planned, cast_whole, plan
    from neuron_explorer.what_if.compiled import recorded_data_flow

    keys = [ev.key if ev.transfer_ns is None and ev.recorded_ns is None else None
            for ev in events]
    if whole_model:
        return [None if k is None else Planned(cast_whole(k, dtype)) for k in keys]
    flow = recorded_data_flow(trace, rows)
    backward = [ev.backward for ev in events]
    if flow is None:
        return plan(keys, backward, dtype)
    producers, readers = flow
    return plan(keys, backward, dtype, producers, readers)


def in_dtype(trace: Trace, rows: pd.DataFrame, events: list, dtype: str | None) -> list:
    """`events` with each op's key and casts as it would run under autocast in `dtype`
    (the events themselves where `dtype` is None)."""
    if dtype is None:
        return events
    return [ev if p is None else dataclasses.replace(ev, key=p.key, casts_before=p.before,
                                                     casts_after=p.after)
            for ev, p in zip(events, planned(trace, rows, events, dtype), strict=True)]


def _plan_by_id(trace: Trace, whole_model: bool) -> dict[int, tuple[tuple, Planned]] | None:
    """Per op slice id with a key: its recorded key and its op as it would run in bf16;
    None where the rules do not replay the trace (`what_if.replay.replayable`) or it holds
    no op keys. Kept on the trace."""
    from neuron_explorer.what_if.replay import WhatIfError, recorded_ops, replayable
    from neuron_explorer.what_if.writer import host_events

    def compute() -> dict[int, tuple[tuple, Planned]] | None:
        if not replayable(trace):
            return None
        try:
            ops = recorded_ops(trace, whole_run=False)
        except WhatIfError:
            return None
        rows, events = host_events(trace, ops)
        plans = planned(trace, rows, events, "bf16", whole_model)
        return {int(i): (ev.key, p) for i, ev, p in
                zip(rows["id"].tolist(), events, plans, strict=True) if p is not None}

    return memoised(trace, f"bf16_plan:{whole_model}", compute)


def predicted_bf16_saving_ns(trace: Trace, matmul_ids: np.ndarray,
                             casts: bool = True) -> float | None:
    """Device time the run's analysed ops would save in bf16 on the recorded preset, where
    `matmul_ids` are its float32 matmuls: under autocast (the matmuls, the ops after them
    that run in bf16 too, less the casts it adds; `casts=False`: a model and inputs cast
    whole, every op in bf16 and no casts), each op lowered as recorded and as it would run
    (each distinct key once). None when a matmul has no op key (rules keep their rule of
    thumb)."""
    from neuron_explorer.analyses.phases import in_analysed_work
    from neuron_explorer.backend.replay import ReplayOptions, lower_key

    plans = _plan_by_id(trace, whole_model=not casts)
    if plans is None or not len(matmul_ids) or any(int(i) not in plans
                                                   for i in matmul_ids.tolist()):
        return None
    preset = ReplayOptions(trace.hardware or "trn2").preset()
    lengths: dict[tuple, float] = {}

    def length(key: tuple) -> float:
        if key not in lengths:
            kernel, _ = lower_key(key, preset)
            lengths[key] = float(kernel.duration_ns) if kernel is not None else 0.0
        return lengths[key]

    total = 0.0
    for i in in_analysed_work(trace, trace.ops)["id"].tolist():
        if int(i) in plans:
            old, new = plans[int(i)]
            total += (length(old) - length(new.key)
                      - sum(map(length, (*new.before, *new.after))))
    return total


def autocast_cast_count(trace: Trace) -> int | None:
    """How many casts autocast adds to the run's analysed ops: each is an op the host
    launches too. None for a trace the rules do not replay."""
    from neuron_explorer.analyses.phases import in_analysed_work

    plans = _plan_by_id(trace, whole_model=False)
    if plans is None:
        return None
    return sum(len(plans[i][1].before) + len(plans[i][1].after)
               for i in in_analysed_work(trace, trace.ops)["id"].tolist() if i in plans)
