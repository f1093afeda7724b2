"""`neuron-explorer COMMAND ...` run in processes forked from one that has imported what
the command imports before it does its work (for `record`: torch, the backend, the
recorder, up to where the program starts; for `report` and `diff`: the loaders, the
analyses, pandas, and torch and the backend for the findings' what-if replays):

    python cli_server.py COMMAND   # one request a line, JSON: [ARGV, CWD, ENV, STDOUT, STDERR]

For each request it forks a child that runs `python -m neuron_explorer.cli ARGV` (ARGV
starts with COMMAND) as a fresh process would in CWD with ENV, its output into the files
STDOUT and STDERR, and answers the child's pid in a line, then its exit status in another.
The child is where a fresh process would be, without its seconds of imports: a modelled
recording has the same bytes, a report the same text (tests/test_cli_server.py). ENV may
differ from the server's own environment only in what is read as the command runs, not
on import (cli_runner.py, which starts the servers, runs anything else afresh).

The child leaves the server's loop by the way `python -m neuron_explorer.cli` ends: the
`SystemExit` of `sys.exit(main())`, or an uncaught exception, ends the interpreter with
its exit handlers run and its exit status."""

from __future__ import annotations

import gc
import importlib
import json
import os
import sys

import neuron_explorer.cli
from neuron_explorer.collectors import thread_pool_wait

COMMAND = sys.argv[1]
# As `record` does before it imports torch (libgomp reads it as torch loads it).
PASSIVE = COMMAND == "record" and thread_pool_wait.wait_asleep()
neuron_explorer.cli.build_parser(COMMAND)  # the command's own module
# what the findings' what-if replays import as a report runs them: torch and the backend's
# compiler, cost model and numerics (3 s of CPU a report)
REPLAYS = ("torch", "neuron_explorer.rules", "neuron_explorer.backend.compiler.program",
           "neuron_explorer.backend.replay", "neuron_explorer.backend.mixed_precision",
           "neuron_explorer.what_if.compiled", "neuron_explorer.what_if.fused_program",
           "neuron_explorer.what_if.lower_precision", "neuron_explorer.what_if.fused_optimizer")
PREPARED = {
    # and what programs import after that: Dynamo as they make an optimizer (1.7 s of
    # CPU), AOTAutograd as they compile (0.3 s)
    "record": ("torch", "torch._dynamo", "torch._functorch.aot_autograd", "neuron_explorer",
               "neuron_explorer.collectors.session",
               "neuron_explorer.collectors.program", "neuron_explorer.collectors.device_sink",
               "neuron_explorer.collectors.framework_hooks"),  # as a recording starts
    "report": ("neuron_explorer.trace", "neuron_explorer.report", *REPLAYS),
    "diff": ("neuron_explorer.trace", "neuron_explorer.report", "neuron_explorer.render",
             "neuron_explorer.trace_diff", *REPLAYS),
}
for _module in PREPARED[COMMAND]:
    importlib.import_module(_module)
# What the imports made lives as long as the process: out of the cyclic collector's reach,
# a child's collections (and its collection at exit) no longer walk the millions of
# objects torch and Dynamo define (a small recording: 1.4 s of CPU, 0.6 s frozen). Times
# on the modelled clock do not depend on the collector, so its trace keeps its bytes.
gc.freeze()


def _child(argv: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """Become `python -m neuron_explorer.cli ARGV`, started in CWD with ENV."""
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY),
                            (1, out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                            (2, err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        new = os.open(path, flags, 0o644)
        os.dup2(new, fd)
        os.close(new)
    # not the server's requests, read ahead into its buffer
    sys.stdin = open(os.devnull)  # noqa: SIM115 - the process's stdin until it ends
    os.chdir(cwd)
    # what a process started in CWD takes for its starting folder (spawned workers find
    # the program's relative path from it), read as multiprocessing is imported
    if "multiprocessing.process" in sys.modules:
        sys.modules["multiprocessing.process"].ORIGINAL_DIR = os.path.abspath(cwd)
    os.environ.clear()
    os.environ.update(env)
    if PASSIVE:
        os.environ[thread_pool_wait.WAIT_POLICY_ENV] = "PASSIVE"
    sys.argv = [neuron_explorer.cli.__file__, *argv]
    sys.path[0] = cwd  # as `python -m` sets it
    sys.exit(neuron_explorer.cli.main(argv))


def serve() -> None:
    for line in sys.stdin:
        argv, cwd, env, out, err = json.loads(line)
        pid = os.fork()
        if pid == 0:  # never back into this loop: the child ends as the command would
            _child(argv, cwd, env, out, err)
        print(pid, flush=True)
        print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)


if __name__ == "__main__":
    serve()
