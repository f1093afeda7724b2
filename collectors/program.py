"""Running the recorded program as `python` would: argv, `__main__`, exit code, signals.

A script or `-m module` runs in this process (runpy), so the recorder sees every
op; anything else (`torchrun ...`) runs as a child process whose Python children
record themselves. Exceptions print the traceback Python would print (without our
frames); Ctrl-C and SIGTERM unwind the program so the trace can be completed, and
then end this process the way Python would have.
"""

from __future__ import annotations

import importlib.util
import os
import runpy
import shutil
import signal
import subprocess
import sys
import sysconfig
import traceback
from dataclasses import dataclass
from types import TracebackType

from neuron_explorer.collectors import signal_guard
from neuron_explorer.collectors.trace_writer import RecordingError

SCRIPT, MODULE, COMMAND = "script", "module", "command"


class Terminated(BaseException):
    """Raised in the program when SIGTERM arrives, so it unwinds (not an Exception: user
    code's `except Exception` does not swallow it)."""


@dataclass
class Program:
    kind: str  # SCRIPT, MODULE or COMMAND
    target: str  # script path, module name or executable
    args: list[str]

    @property
    def argv(self) -> list[str]:
        """The command line as Python would run it (for the trace's metadata)."""
        if self.kind == SCRIPT:
            return ["python", self.target, *self.args]
        if self.kind == MODULE:
            return ["python", "-m", self.target, *self.args]
        return [self.target, *self.args]

    @property
    def stem(self) -> str:
        """A name for the default output file."""
        base = os.path.basename(self.target)
        return base[:-3] if base.endswith(".py") else base.replace(".", "_") or "trace"


def _is_python(word: str) -> bool:
    name = os.path.basename(word)
    return name.startswith("python") and not name.endswith(".py")


def parse_program(words: list[str], module: str | None = None) -> Program:
    """What to run, from the words after the options; raises RecordingError if unusable."""
    words = list(words)
    if words and words[0] == "--":
        words = words[1:]
    if module is not None:
        return _checked(Program(MODULE, module, words))
    if not words:
        raise RecordingError("nothing to record: give a program, e.g. "
                             "`neuron-explorer record train.py` or `record -- python train.py`")
    if _is_python(words[0]) and len(words) > 1:
        rest = words[1:]
        if rest[0] == "-m":
            if len(rest) < 2:
                raise RecordingError("-m needs a module name, e.g. `record -m package.module`")
            return _checked(Program(MODULE, rest[1], rest[2:]))
        if not rest[0].startswith("-"):
            return _checked(Program(SCRIPT, rest[0], rest[1:]))
    if words[0] == "-m":
        if len(words) < 2:
            raise RecordingError("-m needs a module name, e.g. `record -m package.module`")
        return _checked(Program(MODULE, words[1], words[2:]))
    if words[0].endswith(".py") or (os.path.isfile(words[0]) and not os.access(words[0], os.X_OK)):
        return _checked(Program(SCRIPT, words[0], words[1:]))
    return _checked(Program(COMMAND, words[0], words[1:]))


def _checked(program: Program) -> Program:
    if program.kind == SCRIPT and not os.path.isfile(program.target):
        raise RecordingError(f"no such script: {program.target} (check the path, or run from "
                             "the folder that holds it)")
    if program.kind == MODULE:
        try:
            found = importlib.util.find_spec(program.target) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise RecordingError(f"no module named {program.target!r} (is its package installed "
                                 "or in the current folder?)")
    if program.kind == COMMAND and shutil.which(program.target) is None:
        # a command of the environment the recorder runs in (its torchrun) is found there
        # when that environment is not activated: `.venv/bin/neuron-explorer record --
        # torchrun ...` said "no such program: torchrun"
        beside = shutil.which(program.target, path=os.pathsep.join(
            dict.fromkeys((sysconfig.get_path("scripts"), os.path.dirname(sys.executable)))))
        if beside is None:
            raise RecordingError(f"no such program: {program.target} (give a Python script, "
                                 "`-m module`, or a command on PATH)")
        return Program(COMMAND, beside, program.args)
    return program


@dataclass
class Outcome:
    """How the program ended: its exit code, or the signal that is to end us next."""

    code: int
    signal: int | None = None
    error: str | None = None  # the exception that ended it, and the line of the program


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


def run_program(program: Program) -> Outcome:
    """Run the program; return its exit code (or the signal to re-raise once recorded)."""
    if program.kind == COMMAND:
        return _run_command(program)
    # raised only where the recorder's open slices and the trace agree (signal_guard)
    previous = signal.signal(signal.SIGTERM, signal_guard.deferring(_raise_terminated))
    saved_argv, saved_path0 = sys.argv, sys.path[0] if sys.path else None
    try:
        if program.kind == SCRIPT:
            sys.argv = [program.target, *program.args]
            sys.path[0] = os.path.dirname(os.path.abspath(program.target))
            runpy.run_path(program.target, run_name="__main__")
        else:
            sys.argv = [program.target, *program.args]
            sys.path[0] = os.getcwd()
            runpy.run_module(program.target, run_name="__main__", alter_sys=True)
        return Outcome(0)
    except SystemExit as exc:
        return Outcome(_exit_code(exc.code))
    except KeyboardInterrupt as exc:
        _print_traceback(exc)
        return Outcome(130, signal.SIGINT)
    except Terminated:
        return Outcome(128 + signal.SIGTERM, signal.SIGTERM)
    except BaseException as exc:  # noqa: BLE001 - the program's error, reported as Python would
        _print_traceback(exc)
        return Outcome(1, error=described(exc))
    finally:
        sys.argv = saved_argv
        if saved_path0 is not None:
            sys.path[0] = saved_path0
        signal.signal(signal.SIGTERM, previous)


def _run_command(program: Program) -> Outcome:
    proc = subprocess.Popen([program.target, *program.args])

    def forward(signum: int, frame: object) -> None:
        proc.send_signal(signum)  # the command decides how to end; we wait for it

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if code < 0:
        return Outcome(128 - code, -code)
    return Outcome(code)


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def described(exc: BaseException) -> str:
    """"Type: message (file:line)": the exception and the line of the program it came
    through last (the frame of the recorded program nearest the error)."""
    first = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {first[0]}" if first else type(exc).__name__
    where = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        path = os.path.abspath(frame.filename)
        if not path.startswith(_LIBRARIES) and not frame.filename.startswith("<"):
            where = f"{os.path.relpath(path) if path.startswith(os.getcwd()) else path}" \
                    f":{frame.lineno}"
    return f"{text} ({where})" if where else text


# where library code lives (Python's, installed packages', this package's layers): an
# error's line is the last frame outside them
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LIBRARIES = tuple({os.path.dirname(os.__file__) + os.sep,
                    *(sysconfig.get_paths()[key] + os.sep
                      for key in ("stdlib", "platstdlib", "purelib", "platlib")),
                    *(os.path.join(_ROOT, layer) + os.sep for layer in
                      ("backend", "collectors", "common", "explorer", "webapp"))})


def _print_traceback(exc: BaseException) -> None:
    """The traceback Python would print: our own and runpy's frames left out."""
    tb: TracebackType | None = exc.__traceback__
    ours = {os.path.abspath(__file__), os.path.abspath(runpy.__file__)}
    while tb is not None and (tb.tb_frame.f_code.co_filename.startswith("<frozen runpy")
                              or os.path.abspath(tb.tb_frame.f_code.co_filename) in ours):
        tb = tb.tb_next
    sys.excepthook(type(exc), exc.with_traceback(tb), tb)


def end_like_python(outcome: Outcome) -> int:
    """Die by the program's signal (as Python does for Ctrl-C / SIGTERM), else return its code."""
    if outcome.signal is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(outcome.signal, signal.SIG_DFL)
        os.kill(os.getpid(), outcome.signal)
    return outcome.code
