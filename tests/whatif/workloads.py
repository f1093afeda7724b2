"""Small programs the what-if tests record on one preset and predict on another.

    python workloads.py NAME OUT.pftrace LEVEL [compiled]
    python workloads.py serve      # the same, a JSON line each, each in a forked child

A fresh process per recording: the hardware preset (NEURON_HARDWARE) is fixed for a
process on first use, and op, kernel and graph ids count on across recordings. `serve`
forks each child from a process that has only imported: no ids or preset yet."""

from __future__ import annotations

import gc
import json
import os
import sys
import traceback

import neuron_explorer
import torch
from torch import nn


def mlp(compiled: bool) -> None:
    from neuron_explorer.workloads.training import make_model, train

    train(make_model("mlp"), "neuron", 3, compile=compiled)


def device_bound(compiled: bool) -> None:
    """Big matmuls and a sync each step: the step time is the device's."""
    torch.manual_seed(0)
    w = torch.randn(2048, 2048, device="neuron")
    x = torch.randn(1024, 2048, device="neuron")
    for _ in range(3):
        y = x
        for _ in range(2):
            y = torch.relu(y @ w)
        y.sum().item()
        neuron_explorer.step()


def conv(compiled: bool) -> None:
    """A small conv net with layer norm and softmax: other lowerings than matmuls."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Flatten(),
                          nn.LayerNorm(16 * 8 * 8), nn.Linear(16 * 8 * 8, 10)).to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 3, 8, 8).to("neuron")
    y = torch.randint(0, 10, (8,)).to("neuron")
    for _ in range(3):
        loss = nn.functional.cross_entropy(model(x).softmax(-1), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        loss.item()


WORKLOADS = {"mlp": mlp, "device_bound": device_bound, "conv": conv}


def record(hardware: str, name: str, out: str, level: str, *rest: str) -> None:
    """`workloads.py NAME OUT LEVEL [compiled]` on `hardware`, as if in a process of its own."""
    os.environ["NEURON_HARDWARE"] = hardware
    sys.argv = [sys.argv[0], name, out, level, *rest]  # the command its trace names
    with neuron_explorer.record(out, level=level, quiet=True):
        WORKLOADS[name](rest == ("compiled",))


def serve() -> None:
    """For each line of stdin, a JSON list `[HARDWARE, NAME, OUT, LEVEL, ("compiled",) LOG]`:
    record it in a child forked from this process, imported but not yet run, and answer
    the child's exit status in a line; LOG gets the child's output. The child is where a
    fresh process of its own would be at `record` (its trace has the same bytes), without
    paying for the imports again."""
    gc.freeze()  # as tests/cli_server.py does: the children's collections skip the imports
    for line in sys.stdin:
        *args, log = json.loads(line)
        pid = os.fork()
        if pid == 0:  # the child: never back into this loop, whatever happens
            code = 1
            try:
                fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                record(*args)
                code = 0
            except BaseException:
                traceback.print_exc()  # into LOG: os._exit below ends the child before
                raise  # the interpreter could print it
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    if sys.argv[1:] == ["serve"]:
        serve()
    else:
        record(os.environ.get("NEURON_HARDWARE", "trn2"), *sys.argv[1:])
