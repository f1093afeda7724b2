"""Small traces with known answers, one per situation the explorer must recognise.

All times are ns. FIGURES is a made-up but self-consistent hardware: BF16 peak
1e14 FLOP/s, FP32 2.5e13, HBM 1e11 B/s (ridge 1000 FLOP/B in BF16, 250 in FP32),
1 GB of HBM.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from synthetic import TraceBuilder, Track

FIGURES = {
    "preset": "trn2",
    "tensor_peak_flops": {"bfloat16": 1e14, "float16": 1e14, "float32": 2.5e13},
    "hbm_bytes_per_s": 1e11,
    "memory_bytes_per_s": 1e11,
    "dma_bytes_per_s": 1e11,
    "hbm_bytes": 1_000_000_000,
    "partitions": 128,
}
STEP = 10_000  # every scenario's step length


@dataclass
class Scenario:
    """A TraceBuilder with the usual tracks of one host thread and one device."""

    b: TraceBuilder = field(default_factory=TraceBuilder)
    host: Track = None  # type: ignore[assignment]
    kernels: Track = None  # type: ignore[assignment]
    engines: dict[str, Track] = field(default_factory=dict)
    dma: Track = None  # type: ignore[assignment]
    hbm: Track = None  # type: ignore[assignment]
    next_kernel: int = 1

    def __post_init__(self) -> None:
        self.host = self.b.thread()
        self.kernels = self.b.device_track(0, "Kernels")
        for engine, name in (("tensor", "Tensor Engine"), ("vector", "Vector Engine"),
                             ("scalar", "Scalar Engine"), ("gpsimd", "GpSimd Engine")):
            self.engines[engine] = self.b.device_track(0, name)
        self.dma = self.b.device_track(0, "DMA q0")
        self.hbm = self.b.counter_track(0, "HBM in use (bytes)")
        self.b.metadata(self.host, {"hardware": "trn2", "hardware_figures": FIGURES,
                                    "command": "python train.py"})

    def step(self, n: int, dur: int = STEP) -> int:
        """A step slice; returns its start."""
        self.b.slice(self.host, n * STEP, dur, f"step {n}", "step", {"step": n})
        return n * STEP

    def op(self, ts: int, dur: int, name: str, op_id: int, step: int, *,
           kernel: tuple[int, int] | None = None, busy: dict[str, int] | None = None,
           flops: int = 0, hw_flops: int | None = None, nbytes: int = 0,
           dtypes: str = "[bfloat16]", shapes: str = "[[128, 128]]", module: str = "",
           source: str = "train.py:10", fallback: bool = False,
           instructions: bool = True, key: str | None = None) -> None:
        """An op on the host and, when `kernel` = (start, dur) is given, its kernel; `key`
        is its op key arg (common/op_key_codec.py), if any."""
        kid = self.next_kernel if kernel else -1
        args = {"op_id": op_id, "kernel_id": kid, "shapes": shapes, "dtypes": dtypes,
                "flops": flops, "bytes": nbytes, "module": module, "source": source,
                "fallback": fallback, "device": 0, "step": step}
        if key is not None:
            args["key"] = key
        self.b.slice(self.host, ts, dur, name, "op", args, flow_out=[op_id] if kernel else [])
        if not kernel:
            return
        self.next_kernel += 1
        k0, kd = kernel
        busy = busy or {}
        self.b.slice(self.kernels, k0, kd, f"k_{name.split('::')[-1]}", "kernel",
                     {"kernel_id": kid, "op_id": op_id, "flops": flops,
                      "hw_flops": flops if hw_flops is None else hw_flops, "bytes": nbytes,
                      "engine_busy_ns": json.dumps(busy), "fallback": fallback, "step": step},
                     flow_in=[op_id])
        if instructions:
            t = k0
            for engine, ns in busy.items():
                if engine == "dma":
                    continue
                self.b.slice(self.engines[engine], t, ns, "Inst", "instruction",
                             {"kernel_id": kid, "engine": engine, "opcode": "Inst"})
                t += ns

    def write(self, tmp: Path, name: str, fmt: str = "pftrace") -> Path:
        if fmt == "json":
            return self.b.write_json(tmp / f"{name}.json")
        return self.b.write_pftrace(tmp / f"{name}.pftrace")


def basic(*, steps: int = 2) -> Scenario:
    """Two 10 us steps; per step (times from the step start):

    host: dataloader [0,1000), module model.fc [1000,5000) holding aten::mm [1000,2000)
    and aten::relu [3000,3500), sync (.item() at train.py:42) [6000,8000),
    aten::add [8500,9000).
    device: mm kernel [2500,4500) (tensor 1500 + vector 500, FP32, 2e6 FLOPs of 2.5e6
    executed, 4000 B), relu kernel [5000,6000) (vector 1000, 1000 FLOPs, 100000 B), add
    kernel [9200,9400) (vector 200, 1000 FLOPs, 12000 B).
    HBM in use (step 0 only): 1000 B at 2500, 3000 B at 5000, 2500 B at 9300.
    """
    sc = Scenario()
    for n in range(steps):
        t = sc.step(n)
        sc.b.slice(sc.host, t, 1000, "next(batch)", "dataloader", {"step": n})
        sc.b.slice(sc.host, t + 1000, 4000, "model.fc", "module",
                   {"module": "model.fc", "phase": "forward", "step": n})
        sc.op(t + 1000, 1000, "aten::mm", 10 * n + 1, n, kernel=(t + 2500, 2000),
              busy={"tensor": 1500, "vector": 500}, flops=2_000_000, hw_flops=2_500_000,
              nbytes=4000, dtypes="[float32, float32]", shapes="[[100, 512], [512, 384]]",
              module="model.fc")
        sc.op(t + 3000, 500, "aten::relu", 10 * n + 2, n, kernel=(t + 5000, 1000),
              busy={"vector": 1000}, flops=1000, nbytes=100_000, module="model.fc")
        sc.b.slice(sc.host, t + 6000, 2000, "sync", "sync",
                   {"kind": "item", "source": "train.py:42", "device": 0, "step": n})
        sc.op(t + 8500, 500, "aten::add", 10 * n + 3, n, kernel=(t + 9200, 200),
              busy={"vector": 200}, flops=1000, nbytes=12_000)
    sc.b.counter(sc.hbm, 2500, 1000)
    sc.b.counter(sc.hbm, 5000, 3000)
    sc.b.counter(sc.hbm, 9300, 2500)
    return sc


def clean(*, steps: int = 2) -> Scenario:
    """Compute-bound BF16 steps with no waits: no rule should fire.

    Per step: aten::mm on the host [0,500) (shapes multiples of 128), its kernel
    [600,9900) with tensor 9300, vector 4000, scalar 3000 busy; 9e8 FLOPs, 1e5 B.
    """
    sc = Scenario()
    for n in range(steps):
        t = sc.step(n)
        sc.op(t, 500, "aten::mm", n + 1, n, kernel=(t + 600, 9300),
              busy={"tensor": 9300, "vector": 4000, "scalar": 3000}, flops=900_000_000,
              nbytes=100_000, shapes="[[256, 512], [512, 1024]]", instructions=False)
    sc.b.counter(sc.hbm, 600, 1_000_000)
    return sc
