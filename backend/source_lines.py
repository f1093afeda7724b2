"""The user's source line behind an op or a sync: the first frame outside torch and us.

Walking the stack on every op must be cheap: whether a file belongs to torch,
this project or the standard library is decided once per file name and cached
(a str caches its hash; a code object recomputes its own on every lookup), and the
"file:line" strings are cached per call site (file, function's first line, bytecode
offset): reading a frame's line number decodes its code's line table each time.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
from types import FrameType

import torch


def _internal_roots() -> tuple[str, ...]:
    roots = {
        os.path.dirname(torch.__file__),
        *(_package_folder(f"neuron_explorer{sub}")
          for sub in ("", ".common", ".backend", ".collectors", ".webapp")),
        sysconfig.get_paths()["stdlib"],
    }
    return tuple(sorted(r + os.sep for r in roots if r))


def _workloads_root() -> str:
    """The reference workloads are user code as far as source lines go."""
    return _package_folder("neuron_explorer.workloads") + os.sep


def _package_folder(name: str) -> str:
    """A subpackage's folder, found without importing it: the backend sits below the
    collectors and the explorer, and imports neither."""
    spec = importlib.util.find_spec(name)
    locations = spec.submodule_search_locations if spec is not None else None
    return locations[0] if locations else ""


# where nn.Module's __call__ runs hooks and forward: plumbing around every module's call
_MODULE_CALLS = "/torch/nn/modules/module.py"


class SourceLocator:
    """Finds "file:line" of the innermost user frame, caching per file name."""

    def __init__(self, user_roots: tuple[str, ...] | None = None) -> None:
        self._internal = _internal_roots()
        self._user_roots = (_workloads_root(),) if user_roots is None else user_roots
        self._is_internal: dict[str, bool] = {}
        self._text: dict[tuple[str, int, int], str] = {}
        self._cwd = os.getcwd() + os.sep

    def _classify(self, filename: str) -> bool:
        if filename.startswith("<") and not filename.startswith("<stdin"):
            internal = filename.startswith(("<frozen", "<string>"))
        elif self._user_roots and filename.startswith(self._user_roots):
            internal = False
        else:
            internal = filename.startswith(self._internal) or "/site-packages/torch/" in filename
        self._is_internal[filename] = internal
        return internal

    def is_internal(self, filename: str) -> bool:
        """Whether a file is torch's, this project's or the stdlib's (not the user's)."""
        internal = self._is_internal.get(filename)
        return self._classify(filename) if internal is None else internal

    def user_frame(self, frame: FrameType | None) -> FrameType | None:
        """The first frame from `frame` outward that is outside torch, this project and
        the stdlib (`locate` is the same walk, inlined for the per-op path)."""
        while frame is not None:
            filename = frame.f_code.co_filename
            internal = self._is_internal.get(filename)
            if internal is None:
                internal = self._classify(filename)
            if not internal:
                return frame
            frame = frame.f_back
        return None

    def torch_call(self, skip: int = 1) -> str:
        """The torch function the innermost user frame called to get here, as
        "torch/distributions/categorical.py:70 in Categorical.__init__" (torch's outermost
        frame inside the user's); "" when the user's code reached here through no torch
        code."""
        frame: FrameType | None = sys._getframe(skip)
        outermost = None
        while frame is not None and self.is_internal(frame.f_code.co_filename):
            path = frame.f_code.co_filename.replace("\\", "/")
            at = path.rfind("/torch/")
            # not nn.Module's call plumbing: the module's own forward says what read
            # (`Transformer.forward`, not `Module._wrapped_call_impl`)
            if at >= 0 and not path.endswith(_MODULE_CALLS):
                outermost = (path[at + 1:], frame.f_lineno, frame.f_code.co_qualname)
            frame = frame.f_back
        return f"{outermost[0]}:{outermost[1]} in {outermost[2]}" if outermost else ""

    def locate(self, skip: int = 1) -> str:
        """"file:line" of the first frame outside torch, this project and the stdlib."""
        frame: FrameType | None = sys._getframe(skip)
        known = self._is_internal
        while frame is not None:
            code = frame.f_code
            filename = code.co_filename
            internal = known.get(filename)
            if internal is None:
                internal = self._classify(filename)
            if not internal:
                # by bytecode offset: `f_lineno` decodes the line table on every read
                key = (filename, code.co_firstlineno, frame.f_lasti)
                text = self._text.get(key)
                if text is None:
                    name = filename.removeprefix(self._cwd)
                    text = self._text[key] = f"{name}:{frame.f_lineno}"
                return text
            frame = frame.f_back
        return ""
