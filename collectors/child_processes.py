"""Recording the processes a recorded program starts: forks, spawns, torchrun workers.

While a recording runs, `NEURON_EXPLORER_RECORD` (JSON: base output path, level,
steps, format, root pid) is set and the `bootstrap` folder leads `PYTHONPATH`, so
every Python child runs our `sitecustomize`, which starts a recording of its own
as soon as the child imports torch. Forked children (DataLoader workers,
`multiprocessing` with fork) inherit the recorder itself: after the fork they drop
the parent's buffered events and write their own trace. Each child's trace is
named after the parent's: `run.rank1.pftrace` under torchrun (RANK set), else
`run.pid4242.pftrace`; a child that recorded nothing leaves no file. When the record
command runs a launcher (`torchrun`), the traces go into one run folder instead:
`train.run/rank0.pftrace`, `train.run/rank1.pftrace`, ... (`run_folder`). A rank's own
children are named by pid, never by the rank they inherit.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import json
import os
import sys
from typing import Any

from neuron_explorer.collectors.recorder import Recorder, RecordOptions

CHILD_ENV = "NEURON_EXPLORER_RECORD"
BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap")

_saved_env: dict[str, str | None] | None = None
_fork_handler_installed = False


def child_path(base: str, pid: int, rank: str | None, run_folder: str | None = None) -> str:
    """Trace path of a child process: next to the parent's trace, or in the run folder."""
    root, ext = os.path.splitext(base)
    label = f"rank{rank}" if rank is not None else f"pid{pid}"
    if run_folder:
        return os.path.join(run_folder, f"{label}{ext}")
    return f"{root}.{label}{ext}"


def child_traces(base: str) -> list[str]:
    """Child traces written next to `base` (for the summary)."""
    root, ext = os.path.splitext(base)
    pattern = glob.escape(root) + ".*" + glob.escape(ext)
    return sorted(p for p in glob.glob(pattern)
                  if p != base and os.path.basename(p)[len(os.path.basename(root)) + 1:]
                  .startswith(("rank", "pid")))


def _config(options: RecordOptions, run_folder: str | None = None) -> dict[str, Any]:
    return {
        "output": os.path.abspath(options.path),
        "level": options.level,
        "steps": list(options.steps) if options.steps else None,
        "format": options.fmt,
        "root_pid": os.getpid(),
        "root_rank": os.environ.get("RANK"),
        "run_folder": os.path.abspath(run_folder) if run_folder else None,
    }


def export_to_children(options: RecordOptions, run_folder: str | None = None) -> None:
    """Make Python children of this process record themselves (until `stop_exporting`);
    with `run_folder`, each rank's trace goes there as rankN."""
    global _saved_env
    if _saved_env is None:
        _saved_env = {k: os.environ.get(k) for k in (CHILD_ENV, "PYTHONPATH")}
    os.environ[CHILD_ENV] = json.dumps(_config(options, run_folder))
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if BOOTSTRAP_DIR not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR, *paths])


def stop_exporting() -> None:
    """Put back the environment `export_to_children` changed."""
    global _saved_env
    if _saved_env is None:
        return
    for key, value in _saved_env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    _saved_env = None


def _child_rank(config: dict[str, Any]) -> str | None:
    rank = os.environ.get("RANK")
    return rank if rank is not None and rank != config.get("root_rank") else None


def start_from_environment() -> Recorder | None:
    """In a child process started while its parent recorded: record this one too."""
    from neuron_explorer.collectors import session

    raw = os.environ.get(CHILD_ENV)
    if not raw or session.active() is not None:
        return None
    try:
        config = json.loads(raw)
    except ValueError:
        return None
    if config.get("root_pid") == os.getpid():
        return None
    steps = tuple(config["steps"]) if config.get("steps") else None
    rank = _child_rank(config)
    path = child_path(config["output"], os.getpid(), rank, config.get("run_folder"))
    options = RecordOptions(path, config.get("level", "engine"), steps,
                            config.get("format", "pftrace"), list(sys.argv), quiet=True,
                            drop_if_empty=True)
    recorder = session.start(options, record_children=False)
    atexit.register(recorder.stop)
    _note_an_uncaught_error(recorder)
    if rank is not None:
        # this rank's own children (DataLoader workers) inherit RANK: name them by pid
        os.environ[CHILD_ENV] = json.dumps({**config, "root_rank": rank})
        _end_cleanly_on_sigterm(recorder)
    return recorder


def _note_an_uncaught_error(recorder: Recorder) -> None:
    """An error that ends this process (a rank's crash) goes into its trace's end mark, as
    `record` notes its own program's: the run's report then says the rank failed."""
    from neuron_explorer.collectors.program import described

    previous = sys.excepthook

    def hook(kind: type[BaseException], exc: BaseException, tb: object) -> None:
        if not isinstance(exc, KeyboardInterrupt):
            recorder.program_ended(1, described(exc))
        previous(kind, exc, tb)  # type: ignore[arg-type]

    sys.excepthook = hook


def _end_cleanly_on_sigterm(recorder: Recorder) -> None:
    """torchrun stops the other ranks with SIGTERM when one fails: unwind instead of dying
    at once, so their traces are completed."""
    import signal

    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        def _exit(signum: int, frame: object) -> None:
            recorder.program_ended(128 + signum, "stopped by SIGTERM (the launcher ends "
                                                 "every rank when one fails)")
            sys.exit(128 + signum)

        with contextlib.suppress(ValueError):  # not the main thread
            signal.signal(signal.SIGTERM, _exit)


def _after_fork_in_child() -> None:
    from neuron_explorer.collectors import session

    recorder = session.active()
    if recorder is None:
        return
    raw = os.environ.get(CHILD_ENV)
    config = json.loads(raw) if raw else {"output": os.path.abspath(recorder.options.path)}
    recorder.after_fork(child_path(config["output"], os.getpid(), None,
                                   config.get("run_folder")))
    session.attach_sink_after_fork(recorder)
    atexit.register(recorder.stop)
    # multiprocessing's fork children leave through os._exit, running only its finalizers,
    # and clear those right after the fork: register ours from its after-fork callbacks.
    from multiprocessing import util

    util.register_after_fork(recorder, _finalize_at_exit)


def _finalize_at_exit(recorder: Recorder) -> None:
    from multiprocessing import util

    util.Finalize(recorder, recorder.stop, exitpriority=100)


def install_fork_handler() -> None:
    """Register (once per process) what a forked child does with an active recording."""
    global _fork_handler_installed
    if not _fork_handler_installed and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _fork_handler_installed = True
