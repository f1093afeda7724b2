"""Host wall time of a bf16 training step on the `neuron` device against the fp32 one.

The device's bf16 matmuls compute their host numbers through fp32 kernels and one
rounding (backend/matmul_numerics.py), so a bf16 step should cost about what an fp32
step costs on a host without native bf16 (PyTorch's CPU bf16 matmul is ~75x slower).
Runs the two steps interleaved, `--repeats` times each, and prints the medians, the
spread (min-max) and the bf16/fp32 ratio of medians, with CPU's own bf16 matmul in the
same run as a reference. Target: ratio <= 1.5.

    python benchmarks/bench_bf16.py [--repeats N] [--width W] [--batch B]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

TARGET_RATIO = 1.5


def _model(width: int, dtype: torch.dtype, device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width),
                         nn.ReLU(), nn.Linear(width, 16)).to(device=device, dtype=dtype)


def _step_fn(width: int, batch: int, dtype: torch.dtype, device: torch.device):
    model = _model(width, dtype, device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(batch, width).to(device=device, dtype=dtype)
    target = torch.randint(0, 16, (batch,)).to(device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x).float(), target)
        loss.backward()
        opt.step()
        loss.item()  # wait for the step, as a training loop's logging does

    return step


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()
    import neuron_explorer.backend  # noqa: F401  (registers the device)

    device = torch.device("neuron")
    steps = {dt: _step_fn(args.width, args.batch, dt, device)
             for dt in (torch.float32, torch.bfloat16)}
    for step in steps.values():  # warm up (first-call lowering, allocations)
        step()
    samples: dict[torch.dtype, list[float]] = {dt: [] for dt in steps}
    for _ in range(args.repeats):
        for dt, step in steps.items():
            samples[dt].append(_time(step))
    a = torch.randn(args.width, args.width).bfloat16()
    cpu_bf16 = _time(lambda: a @ a)
    cpu_fp32 = _time(lambda: a.float() @ a.float())
    print(f"MLP {args.width} wide, batch {args.batch}, {args.repeats} interleaved steps each")
    for dt, values in samples.items():
        print(f"  {dt!s:15s} median {statistics.median(values) * 1e3:8.1f} ms   "
              f"min {min(values) * 1e3:8.1f}  max {max(values) * 1e3:8.1f}")
    ratio = statistics.median(samples[torch.bfloat16]) / statistics.median(samples[torch.float32])
    fastest = min(samples[torch.bfloat16]) / min(samples[torch.float32])
    print(f"  bf16/fp32 step: {ratio:.2f}x of medians, {fastest:.2f}x of minimums "
          f"(target <= {TARGET_RATIO}x)")
    print(f"  reference, CPU {args.width}^2 matmul: bf16 {cpu_bf16 * 1e3:.1f} ms, "
          f"fp32 {cpu_fp32 * 1e3:.1f} ms ({cpu_bf16 / cpu_fp32:.0f}x)")
    return 0 if ratio <= TARGET_RATIO else 1


if __name__ == "__main__":
    raise SystemExit(main())
