"""The few lines printed on stderr when a recording ends: where, how big, what, how to open."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from neuron_explorer.common.trace_format import CAT_DMA, CAT_INSTRUCTION, CAT_KERNEL, CAT_OP, LEVELS

if TYPE_CHECKING:
    from neuron_explorer.collectors.recorder import Recorder

_OP_LEVEL = {CAT_OP, CAT_KERNEL}
_ENGINE_LEVEL = {CAT_INSTRUCTION, CAT_DMA, "counter"}


def events_per_level(counts: dict[str, int]) -> dict[str, int]:
    """Event counts by the level that records them (metadata not counted)."""
    levels = {"framework": 0, "op": 0, "engine": 0}
    for category, n in counts.items():
        if category in _OP_LEVEL:
            levels["op"] += n
        elif category in _ENGINE_LEVEL:
            levels["engine"] += n
        elif category != "metadata":
            levels["framework"] += n
    return levels


def human_size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} bytes"


def _steps_text(recorded: list[int], completed: list[int],
                optimizer_step_compiled: bool = False) -> str:
    if not completed:
        if recorded and optimizer_step_compiled:
            return ("1 (the whole run: optimizer.step() ran inside a compiled function, "
                    "where it ends no step; call neuron_explorer.step() after it)")
        if recorded:
            return "1 (the whole run: no optimizer.step() or neuron_explorer.step() ended a step)"
        return "none"
    if completed == list(range(completed[0], completed[-1] + 1)):
        text = (f"{len(completed)} ({completed[0]}–{completed[-1]})" if len(completed) > 1
                else f"1 ({completed[0]})")
    else:
        text = f"{len(completed)} ({', '.join(map(str, completed))})"
    unfinished = [s for s in recorded if s not in completed]
    if unfinished:
        text += f", then the code after the last step mark as step {unfinished[-1]}"
    return text


def summary(recorder: Recorder) -> str:
    from neuron_explorer.collectors.child_processes import child_traces

    path = recorder.writer.path
    size = os.path.getsize(path) if os.path.exists(path) else 0
    levels = events_per_level(recorder.writer.counts)
    shown = [f"{name} {levels[name]:,}" for name in LEVELS]
    lines = [
        (f"neuron-explorer: trace written to {path} ({human_size(size)}, level "
        f"{recorder.options.level})"),
        f"  events: {', '.join(shown)}",
        "  steps recorded: " + _steps_text(recorder.steps_recorded, recorder.steps_completed,
                                           recorder.optimizer_step_compiled)
        + (" (a step per call of the model: no optimizer step ran)"
           if recorder.step_boundary == "forward" else ""),
    ]
    children = child_traces(path)
    if children:
        lines.append(f"  child processes: {', '.join(children)}")
    lines.append(f"  open it: neuron-explorer view {path}  |  neuron-explorer report {path}"
                 "  |  https://ui.perfetto.dev")
    return "\n".join(lines)
