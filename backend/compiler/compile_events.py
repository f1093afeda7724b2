"""Compile events: Dynamo spans, graph breaks and recompiles, sent to the event hub.

Dynamo calls our start/end callbacks around each frame it compiles; at the end we
know which graph breaks the frame hit (Dynamo's list of graph-compile reasons, with
the user's stack) and, for a recompile, which guard failed (Dynamo's compile
metrics). The AOTAutograd and neuron-compiler spans are timed by the backend itself
(`span`). All times are on the host clock's timeline.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import traceback
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from neuron_explorer.backend.clock import clock
from neuron_explorer.backend.events import CompileEvent, hub

if TYPE_CHECKING:
    from neuron_explorer.backend.source_lines import SourceLocator

# "Failed to trace builtin operator\n  Explanation: ...\n  Hint: ..." -> its parts.
_EXPLANATION = re.compile(r"^\s*Explanation:\s*(.*)$", re.MULTILINE)
_HINT = re.compile(r"^\s*Hint:\s*(.*)$", re.MULTILINE)
# 'File "/path/train.py", line 42, in forward' in an FX node's stack trace.
_STACK_LINE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
# A branch on a tensor's value in the frame Dynamo compiles: its compile reason names
# only the bytecode ("generic_jump TensorVariable()"); these are the words Dynamo's own
# graph-break message gives it (they come with the reason when the branch is in a
# function it inlined).
_JUMP = "generic_jump"
_JUMP_REASON = ("Data-dependent branching: Detected data-dependent branching (e.g. `if "
                "my_tensor.sum() > 0:`). Dynamo does not support tracing dynamic control flow")
_JUMP_HINT = "Use `torch.cond` to express dynamic control flow."


def emit(kind: str, name: str, start_ns: int, end_ns: int | None = None, **args: object) -> None:
    """Send one compile span (or an instant, when `end_ns` is None) to the hub."""
    end = start_ns if end_ns is None else end_ns
    hub.compile_event(CompileEvent(kind, name, start_ns, end, dict(args)))


@contextmanager
def span(kind: str, name: str, args: dict | None = None) -> Iterator[dict]:
    """Time a block as a compile span; the block may add to the yielded args."""
    collected: dict = dict(args or {})
    start = clock.now()
    try:
        yield collected
    finally:
        emit(kind, name, start, clock.now(), **collected)


def summarize_break_reason(text: str) -> tuple[str, str]:
    """Dynamo's multi-line graph-break text -> (one-line reason, without a closing period
    as the findings end it, and first hint)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    head = lines[0] if lines else "unknown"
    if head.startswith(_JUMP):
        return _JUMP_REASON, _JUMP_HINT
    explanation = _EXPLANATION.search(text)
    reason = (f"{head}: {explanation.group(1)}" if explanation else head).removesuffix(".")
    hint = _HINT.search(text)
    return reason, hint.group(1) if hint else ""


def source_of_graph(gm: object) -> str:
    """The user code a traced graph came from, as "file:line in function"."""
    graph = getattr(gm, "graph", None)
    for node in getattr(graph, "nodes", ()):
        trace = node.meta.get("stack_trace") if hasattr(node, "meta") else None
        if trace:
            frames = _STACK_LINE.findall(trace)
            if frames:
                path, line, func = frames[-1]
                return f"{path}:{line} in {func}"
    return ""


def compiling_code_location() -> str:
    """"file:line in function" of the frame Dynamo is compiling now, found on the call
    stack (Dynamo's frame compiler holds it as `code`); "" when not compiling. When that
    frame is torch's own (the wrapper `torch.compile(module)` calls, which inlines the
    module), the user's line that called it."""
    frame: types.FrameType | None = sys._getframe(1)
    for _ in range(80):
        if frame is None:
            break
        code = frame.f_code
        if code.co_name == "_compile" and code.co_filename.endswith("convert_frame.py"):
            target = frame.f_locals.get("code")
            if not isinstance(target, types.CodeType):
                return ""
            if not target.co_filename.startswith(_TORCH_ROOT):
                return f"{target.co_filename}:{target.co_firstlineno} in {target.co_name}"
            return _calling_user_line(frame)
        frame = frame.f_back
    return ""


_TORCH_ROOT = os.path.dirname(torch.__file__) + os.sep


def _calling_user_line(frame: types.FrameType | None) -> str:
    """The user's frame outward of `frame` (as the recorder finds an op's source line; a
    patched `backward` of the recorder's sits between a lazy backward and its caller)."""
    from neuron_explorer.backend.source_lines import SourceLocator

    user = SourceLocator().user_frame(frame)
    return f"{user.f_code.co_filename}:{user.f_lineno} in {user.f_code.co_name}" if user else ""


def _break_site(stack: list[traceback.FrameSummary] | None, source: str,
                locator: SourceLocator) -> str:
    """"file:line in function" of a graph break in the user's code: the innermost frame of
    its stack in the user's files (a break inside torch or this package, in a function
    or hook Dynamo inlined, is the user's line that led there); else the source of the
    frame being compiled, when that is the user's; else ""."""
    for frame in reversed(stack or ()):
        if not locator.is_internal(frame.filename):
            return f"{frame.filename}:{frame.lineno} in {frame.name}"
    path = source.rpartition(":")[0]
    return source if path and not locator.is_internal(path) else ""


def _torch_site(stack: list[traceback.FrameSummary] | None) -> str | None:
    """Where in torch's own code a graph break was raised ("torch/optim/optimizer.py:85 in
    _use_grad"), when its innermost frame is torch's; else None."""
    if not stack:
        return None
    frame = stack[-1]
    path = frame.filename.replace("\\", "/")
    at = path.rfind("/torch/")
    if at < 0:
        return None
    return f"{path[at + 1:]}:{frame.lineno} in {frame.name}"


class CompileEventRecorder:
    """Turns Dynamo's compile callbacks into CompileEvents (installed once)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, tuple[int, int]] = {}  # compile id -> (start ns, breaks seen)
        self._sources: dict[str, str] = {}  # compile id -> user source of its graphs
        # Dynamo's count of each reason it gave up a whole frame for (run eager), as of
        # the last frame
        self._skips_seen: dict[str, int] = {}

    def install(self) -> None:
        """Register the Dynamo callbacks (idempotent; again after `torch._dynamo.reset()`,
        which drops every callback)."""
        from torch._dynamo.callback import callback_handler

        with self._lock:
            if self._on_start not in callback_handler.start_callbacks:
                callback_handler.register_start_callback(self._on_start)
            if self._on_end not in callback_handler.end_callbacks:
                callback_handler.register_end_callback(self._on_end)

    def note_graph_source(self, compile_id: str, source: str) -> None:
        """Remember where a frame's graph came from (for its recompile event); open the
        frame's span now if its start was missed (callbacks installed mid-compile)."""
        if source:
            self._sources[compile_id] = source
        if compile_id not in self._open:
            from torch._dynamo.utils import graph_break_reasons

            self._open[compile_id] = (clock.now(), len(graph_break_reasons))

    def _on_start(self, args: object) -> None:
        from torch._dynamo.utils import graph_break_reasons

        compile_id = str(getattr(args, "compile_id", ""))
        self._open[compile_id] = (clock.now(), len(graph_break_reasons))

    def _on_end(self, args: object) -> None:
        compile_id = str(getattr(args, "compile_id", ""))
        end = clock.now()
        start, breaks_seen = self._open.pop(compile_id, (end, 0))
        # Dynamo compiling a frame, or AOTAutograd compiling a backward on first use.
        trigger = str(getattr(args, "callback_trigger", ""))
        what = "lazy backward" if "LAZY_BACKWARD" in trigger else "dynamo"
        try:
            self._emit_frame(compile_id, start, end, breaks_seen, what)
        except (AttributeError, TypeError, IndexError) as exc:  # torch internals changed
            emit("dynamo", f"dynamo {compile_id}", start, end, compile_id=compile_id,
                 error=f"compile events incomplete: {exc}")

    def _emit_frame(self, compile_id: str, start: int, end: int, breaks_seen: int,
                    what: str) -> None:
        from torch._dynamo.utils import get_metrics_context, graph_break_reasons

        source = self._sources.pop(compile_id, "") or compiling_code_location()
        metrics = get_metrics_context()
        recorded = getattr(metrics, "_metrics", {}) if metrics.in_progress() else {}
        guard = recorded.get("recompile_reason") if what == "dynamo" else None
        if breaks_seen > len(graph_break_reasons):  # torch._dynamo.reset() cleared the list
            breaks_seen = 0
        new_breaks = list(graph_break_reasons[breaks_seen:])
        # a frame given up over what is also an ordinary graph break (a data-dependent
        # branch in a resumed frame) is that break, already recorded
        broken = {summarize_break_reason(b.reason)[0] for b in graph_break_reasons}
        skips = [text for text in self._new_skips()
                 if summarize_break_reason(text)[0] not in broken]
        emit("dynamo", f"{what} {compile_id}", start, end, compile_id=compile_id,
             graph_breaks=len(new_breaks) + len(skips), recompile=bool(guard))
        for text in skips:  # the frame runs eager: everything in it is as if broken off
            reason, hint = summarize_break_reason(text)
            emit("graph_break", "graph break", end, compile_id=compile_id, reason=reason,
                 hint=hint, source=source, skipped_frame=True)
        if guard:
            emit("recompile", f"recompile {compile_id}", start, compile_id=compile_id,
                 reason=str(guard), guard=str(guard), source=source)
        if not new_breaks:
            return
        from neuron_explorer.backend.source_lines import SourceLocator

        locator = SourceLocator()
        for brk in new_breaks:
            reason, hint = summarize_break_reason(brk.reason)
            emit("graph_break", "graph break", end, compile_id=compile_id,
                 reason=reason, hint=hint, source=_break_site(brk.user_stack, source, locator),
                 within=_torch_site(brk.user_stack))


    def _new_skips(self) -> list[str]:
        """The reasons Dynamo gave up a whole frame for since the last frame ended (its
        `unimplemented` counter: an nn.GRU it will not trace, say); such a frame has no
        graph break of its own and runs eager."""
        from torch._dynamo.utils import counters

        now = dict(counters["unimplemented"])
        if any(n < self._skips_seen.get(text, 0) for text, n in now.items()) or \
                len(now) < len(self._skips_seen):  # torch._dynamo.reset() cleared them
            self._skips_seen = {}
        new = [text for text, n in now.items() if n > self._skips_seen.get(text, 0)]
        self._skips_seen = now
        return new


recorder = CompileEventRecorder()
