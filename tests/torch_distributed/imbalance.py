"""Two or more ranks that meet at collectives every step, balanced or with the last rank
doing more, for the straggler tests.

    --model fsdp     an FSDP2-sharded transformer block (host-bound at this size);
    --model stream   elementwise work on a large tensor then an all-reduce (device-bound);
    --small          ... on a small tensor instead (host-bound: launches, not device work);
    --compile        the FSDP2 model wrapped in torch.compile;
    --sleep-ms MS    the last rank waits MS more per step on the host (a real wait);
    --work N         the last rank does N times the others' work per step;
    --cpu-probe PATH each rank also runs its step's model in plain PyTorch on the CPU and
                     appends that run's CPU time (ns) to PATH.<rank>, one line a step: how
                     fast the machine ran each rank's work, measured in the same run.
"""

import argparse
import copy
import os
import time

import neuron_explorer
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--model", choices=("fsdp", "stream"), default="fsdp")
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--sleep-ms", type=float, default=0)
parser.add_argument("--work", type=int, default=1)
parser.add_argument("--small", action="store_true")
parser.add_argument("--compile", action="store_true")
parser.add_argument("--cpu-probe", default="")
args = parser.parse_args()
dist.init_process_group()
rank, world = dist.get_rank(), dist.get_world_size()
device = torch.device("neuron", int(os.environ["LOCAL_RANK"]) % torch.neuron.device_count())
torch.neuron.set_device(device)
last = rank == world - 1
work = args.work if last else 1


def cpu_probe(model: nn.Module, x: torch.Tensor) -> None:
    """The step's work in plain PyTorch on the CPU, timed by this thread's CPU time (which,
    like the recorder's host clock, leaves out time spent waiting for a CPU)."""
    if not args.cpu_probe:
        return
    start = time.thread_time_ns()
    model.zero_grad()
    F.mse_loss(model(x), torch.zeros_like(x)).backward()
    with torch.no_grad():
        for p in model.parameters():
            p.sub_(1e-3 * p.grad)
    with open(f"{args.cpu_probe}.{rank}", "a") as out:
        out.write(f"{time.thread_time_ns() - start}\n")


def fsdp_steps() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64),
                          nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    twin = copy.deepcopy(model)  # stays on the CPU: the probe's model
    model = model.to(device)
    mesh = init_device_mesh("neuron", (world,))
    for layer in (model[0], model[2], model[3], model[5]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    if args.compile:
        model = torch.compile(model, backend="neuron")
    for _ in range(args.steps):
        x = torch.randn(4 * work, 32, 64).to(device)
        loss = F.mse_loss(model(x), torch.zeros_like(x))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        # before the sleep: the CPU a sleep leaves idle comes back slow for a while
        cpu_probe(twin, torch.randn(4 * work, 32, 64))
        if last and args.sleep_ms:
            time.sleep(args.sleep_ms / 1e3)
        loss.item()


def stream_steps() -> None:
    # 16 MiB: 0.1 ms a pass on the device; small, a launch costs more than its work
    x = torch.ones(1 << 10 if args.small else 1 << 22, device=device)
    for _ in range(args.steps):
        y = x
        for _ in range(3 * work):
            y = y * 0.5 + 0.5
        if last and args.sleep_ms:
            time.sleep(args.sleep_ms / 1e3)
        dist.all_reduce(y)
        y[:1].item()
        neuron_explorer.step()


fsdp_steps() if args.model == "fsdp" else stream_steps()
dist.destroy_process_group()
