"""Keep Dynamo out of the device's own Python code.

While a compiled function runs, Dynamo's frame hook sees every Python frame that starts
and compiles each one it does not skip. The code a compiled function runs outside its
graphs (the `if` on a tensor at a graph break, `.item()`, a print) reaches the device's
Python kernels from C++, so Dynamo compiled the emulation itself as if it were the
user's code: it broke graphs on the host clock's reads and the cost model's heap pushes,
and crashed on the timeline's NumPy arrays. A program that runs on the CPU with
`torch.compile` failed on neuron.

Every function of the backend is therefore marked for Dynamo as skipped together with
all it calls: the effect of `torch.compiler.disable` (recursive), set on the functions'
code objects rather than by wrapping them, so the eager path pays nothing per op and
`import torch` does not load Dynamo. Dynamo's skipfiles (`trace_rules`) do not fit:
their skip is not recursive (the recorder's sinks the backend calls would still be
compiled), and they change what Dynamo inlines while it traces the user's code.

The device's registration marks the modules loaded at `import torch` (a few ms; they
hold every kernel, hook and wrapper that torch calls), and the neuron backend marks the
modules loaded since at each compile. The mark is on frames only: Dynamo still traces
the user's calls of `torch.neuron` functions as before, and graphs still hold the
device's custom ops.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Iterable, Iterator

# The backend's folder (neuron_explorer.backend, and neuron_explorer.nki under it).
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_done_modules: set[str] = set()
_done_codes: set[types.CodeType] = set()


def _functions_of(module: types.ModuleType) -> Iterator[object]:
    """The functions a module defines: its own, its classes' methods (static, class and
    property ones too), and those held in its module-level containers."""
    name = module.__name__
    pending: list[object] = list(vars(module).values())
    seen: set[int] = set()
    while pending:
        obj = pending.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, (staticmethod, classmethod)):
            pending.append(obj.__func__)
        elif isinstance(obj, property):
            pending.extend(f for f in (obj.fget, obj.fset, obj.fdel) if f is not None)
        elif isinstance(obj, type):
            if obj.__module__ == name:
                pending.extend(vars(obj).values())
        elif isinstance(obj, (dict, list, tuple)) and obj is not module.__dict__:
            pending.extend(obj.values() if isinstance(obj, dict) else obj)
        elif callable(obj) and getattr(obj, "__module__", None) == name:
            while obj is not None:  # a decorated function, and the one it wraps
                yield obj
                obj = getattr(obj, "__wrapped__", None)


def _codes(functions: Iterable[object]) -> Iterator[types.CodeType]:
    """The code objects of the backend's files in `functions`, with the nested ones
    (inner functions, closures, lambdas, comprehensions, local classes)."""
    pending = [c for f in functions if isinstance(c := getattr(f, "__code__", None),
                                                  types.CodeType)]
    while pending:
        code = pending.pop()
        if code in _done_codes or not code.co_filename.startswith(_ROOT):
            continue
        _done_codes.add(code)
        yield code
        pending.extend(c for c in code.co_consts if isinstance(c, types.CodeType))


def skip_backend_frames() -> None:
    """Mark the functions of every backend module loaded so far (again for modules loaded
    since the last call): Dynamo never compiles their frames, nor any frame they start."""
    from torch._C._dynamo.eval_frame import (
        _FrameAction,
        _FrameExecStrategy,
        set_code_exec_strategy,
    )

    skip = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP)
    for name, module in list(sys.modules.items()):
        if name in _done_modules or not (getattr(module, "__file__", None) or "").startswith(
                _ROOT):
            continue
        _done_modules.add(name)
        for code in _codes(_functions_of(module)):
            set_code_exec_strategy(code, skip)
