"""A trace built in memory with the explorer's table layout, for dashboard tests and benchmarks.

It has the structure of a recorded eager training loop (steps > modules > ops on
the host; kernels, engine instructions, DMA and an HBM counter on the device;
flows op -> kernel -> instruction) at any size, built with numpy in well under a
second per million events.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

ENGINES = ["tensor", "vector", "scalar", "gpsimd"]
OP_NAMES = np.array(["aten::addmm", "aten::relu", "aten::mul", "aten::add", "aten::sum", "aten::copy_"])
HARDWARE_FIGURES = {
    "preset": "trn2",
    "tensor_peak_flops": {"bfloat16": 79e12, "float32": 20e12},
    "hbm_bytes_per_s": 362e9,
    "memory_bytes_per_s": 362e9,
}


@dataclass
class Finding:
    rule_id: str
    title: str
    severity: str
    time_lost_ns: int
    share_of_step: float
    evidence: list
    explanation: str
    recommendation: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class SyntheticTrace:
    """Tables shaped like `neuron_explorer.Trace`, and the analyses the dashboard calls."""

    slices: pd.DataFrame
    tracks: pd.DataFrame
    counters: pd.DataFrame
    flows: pd.DataFrame
    steps: pd.DataFrame
    ops: pd.DataFrame
    kernels: pd.DataFrame
    instructions: pd.DataFrame
    modules: pd.DataFrame
    metadata: dict = field(default_factory=dict)
    hardware_figures: dict | None = None

    def summary(self) -> dict:
        step = int(self.steps["dur"].median())
        busy = float(self.kernels["dur"].sum()) / max(float(self.steps["dur"].sum()), 1.0)
        return {"hardware": "trn2", "source_format": "synthetic", "n_steps": len(self.steps),
                "step_time_ns": step, "total_ns": int(self.slices["ts"].max() - self.slices["ts"].min()),
                "mfu": 0.031, "hfu": 0.04, "mbu": 0.12, "device_busy_share": busy}

    def breakdown(self) -> pd.DataFrame:
        rows = []
        for step in self.steps.itertuples():
            k = self.kernels[self.kernels["step"] == step.step]
            device = int(k["dur"].sum())
            rows += [(step.step, "device", "tensor", device // 2), (step.step, "device", "vector", device // 2),
                     (step.step, "device", "idle", step.dur - device),
                     (step.step, "host", "ops", int(step.dur * 0.8)), (step.step, "host", "sync", int(step.dur * 0.2))]
        df = pd.DataFrame(rows, columns=["step", "side", "category", "ns"])
        df["share"] = df["ns"] / df.groupby(["step", "side"])["ns"].transform("sum")
        return df

    def _stats(self, df: pd.DataFrame, key: str) -> pd.DataFrame:
        g = df.groupby(key).agg(count=("dur", "size"), total_ns=("dur", "sum"), mean_ns=("dur", "mean"))
        g["share"] = g["total_ns"] / g["total_ns"].sum()
        return g.reset_index().rename(columns={key: "name"})

    def op_stats(self) -> pd.DataFrame:
        return self._stats(self.ops, "name")

    def module_stats(self) -> pd.DataFrame:
        return self._stats(self.modules, "module")

    def kernel_stats(self) -> pd.DataFrame:
        return self._stats(self.kernels, "name")

    def engine_utilisation(self, bin_ns=None) -> pd.DataFrame:
        ins = self.instructions
        bin_ns = bin_ns or max(int((ins["ts"].max() - ins["ts"].min()) // 100), 1)
        b = (ins["ts"] // bin_ns) * bin_ns
        u = ins.assign(bin=b).groupby(["bin", "engine"])["dur"].sum().div(bin_ns).clip(upper=1.0)
        return u.reset_index().rename(columns={"bin": "ts", "dur": "utilisation"})

    def roofline(self) -> pd.DataFrame:
        g = self.ops.groupby("name").agg(flops=("flops", "sum"), bytes=("bytes", "sum"), dur=("device_dur", "sum"))
        g["intensity"] = g["flops"] / g["bytes"]
        g["achieved_flops_per_s"] = g["flops"] / (g["dur"] / 1e9)
        g["bound"] = np.where(g["intensity"] > 79e12 / 362e9, "compute", "memory")
        return g.reset_index()

    def memory_timeline(self) -> pd.DataFrame:
        return self.counters.rename(columns={"value": "in_use_bytes"}).assign(device=0)[["ts", "in_use_bytes", "device"]]

    def memory_at_peak(self) -> pd.DataFrame:
        return pd.DataFrame({"holder": ["model.0.weight", "activations"], "bytes": [1 << 20, 3 << 20]})

    def compile_summary(self) -> dict:
        return {}

    def bottlenecks(self) -> list:
        sync = self.slices[self.slices["category"] == "sync"]
        first = sync.iloc[0]
        step_ns = float(self.steps["dur"].median())
        return [
            Finding("host_bound", "The device waits on kernel launches", "high", int(step_ns * 0.6), 0.6,
                    [{"ts": int(self.kernels["ts"].iloc[0]), "dur": int(step_ns / 4),
                      "slice_ids": [int(self.kernels["id"].iloc[0])], "description": "launch gaps"}],
                    "Kernels are short and the host launches them one by one.",
                    "Use torch.compile to fuse ops into fewer kernels."),
            Finding("sync_in_loop", "loss.item() synchronises every step", "medium", int(first["dur"]),
                    float(first["dur"]) / step_ns,
                    [{"ts": int(first["ts"]), "dur": int(first["dur"]), "slice_ids": [int(first["id"])],
                      "description": "sync"}],
                    "The host waits for the device at each .item().",
                    "Log the loss every N steps instead."),
        ]


def make_trace(n_steps: int = 3, ops_per_step: int = 40, instructions_per_kernel: int = 3,
               seed: int = 0) -> SyntheticTrace:
    """A trace of `n_steps` eager steps; events = n_steps * ops_per_step * (3 + instructions_per_kernel)."""
    rng = np.random.default_rng(seed)
    n_ops = n_steps * ops_per_step
    modules_per_step = 4
    op_gap = 40_000  # ns between launches: host-bound
    step_len = ops_per_step * op_gap + 200_000
    step_of_op = np.repeat(np.arange(n_steps), ops_per_step)
    pos_in_step = np.tile(np.arange(ops_per_step), n_steps)
    op_ts = step_of_op * step_len + 10_000 + pos_in_step * op_gap
    op_dur = np.full(n_ops, 30_000)
    names = OP_NAMES[rng.integers(0, len(OP_NAMES), n_ops)]
    module_of_op = pos_in_step * modules_per_step // ops_per_step
    kernel_ts = op_ts + 20_000
    kernel_dur = rng.integers(2_000, 12_000, n_ops)
    next_id = [1]

    def take(n):
        block = np.arange(next_id[0], next_id[0] + n)
        next_id[0] += n
        return block

    tracks = pd.DataFrame({
        "track_id": [1, 10, 11, 12, 13, 14, 15, 20],
        "name": ["MainThread", "Kernels", "Tensor Engine", "Vector Engine", "Scalar Engine", "GpSimd Engine",
                 "DMA q0", "HBM in use (bytes)"],
        "kind": ["thread", "kernels", "engine", "engine", "engine", "engine", "dma", "counter"],
        "process": ["python train.py"] + ["neuron:0 (trn2)"] * 7,
        "pid": [100] + [1000] * 7, "tid": [100, 1, 2, 3, 4, 5, 6, 7], "device": [-1] + [0] * 7,
    })
    frames = []
    step_ids = take(n_steps)
    steps = pd.DataFrame({"step": np.arange(n_steps), "ts": np.arange(n_steps) * step_len,
                          "dur": np.full(n_steps, step_len - 50_000)})
    frames.append(_frame(step_ids, steps["ts"], steps["dur"], [f"step {i}" for i in range(n_steps)],
                         "step", 1, 0, -1, [{"step": int(i)} for i in range(n_steps)]))
    n_mod = n_steps * modules_per_step
    mod_ids = take(n_mod)
    mod_step = np.repeat(np.arange(n_steps), modules_per_step)
    mod_idx = np.tile(np.arange(modules_per_step), n_steps)
    per_mod = ops_per_step // modules_per_step * op_gap
    mod_ts = mod_step * step_len + 10_000 + mod_idx * per_mod
    mod_names = np.array([f"model.{i}" for i in range(modules_per_step)])[mod_idx]
    frames.append(_frame(mod_ids, mod_ts, np.full(n_mod, per_mod - 5_000), mod_names, "module", 1, 1,
                         step_ids[mod_step], None))
    op_ids = take(n_ops)
    op_parent = mod_ids[step_of_op * modules_per_step + module_of_op]
    op_args = [{"op_id": int(i), "shapes": "[[64, 512], [512, 512]]", "dtypes": "[float32, float32]",
                "flops": 33554432, "bytes": 1179648, "module": f"model.{m}", "source": "train.py:42"}
               for i, m in zip(range(n_ops), module_of_op, strict=True)] if n_ops <= 20_000 else None
    frames.append(_frame(op_ids, op_ts, op_dur, names, "op", 1, 2, op_parent, op_args))
    sync_ids = take(n_steps)
    sync_ts = steps["ts"].to_numpy() + step_len - 190_000
    frames.append(_frame(sync_ids, sync_ts, np.full(n_steps, 120_000), ["aten::item"] * n_steps, "sync", 1, 1,
                         step_ids, [{"kind": "item", "source": "train.py:50"}] * n_steps))
    kernel_ids = take(n_ops)
    frames.append(_frame(kernel_ids, kernel_ts, kernel_dur, np.char.add("kernel_", names.astype(str)), "kernel",
                         10, 0, -1, None))
    k = instructions_per_kernel
    ins_ids = take(n_ops * k)
    ins_kernel = np.repeat(np.arange(n_ops), k)
    ins_slot = np.tile(np.arange(k), n_ops)
    ins_dur = np.maximum(kernel_dur[ins_kernel] // k - 100, 10)
    ins_ts = kernel_ts[ins_kernel] + ins_slot * (kernel_dur[ins_kernel] // k)
    ins_engine = np.array(ENGINES)[ins_slot % len(ENGINES)]
    ins_track = 11 + ins_slot % len(ENGINES)
    frames.append(_frame(ins_ids, ins_ts, ins_dur, np.where(ins_engine == "tensor", "MultiplyMoving", "TensorTensor"),
                         "instruction", ins_track, 0, -1, None))
    dma_ids = take(n_ops)
    frames.append(_frame(dma_ids, kernel_ts - 1_500, np.full(n_ops, 1_400), ["DmaLoad"] * n_ops, "dma", 15, 0, -1, None))
    slices = pd.concat(frames, ignore_index=True)
    flows = pd.DataFrame({
        "flow_id": np.arange(2 * n_ops),
        "src_id": np.concatenate([op_ids, kernel_ids]),
        "dst_id": np.concatenate([kernel_ids, ins_ids[::k]]),
    })
    counter_ts = np.sort(np.concatenate([kernel_ts, kernel_ts + kernel_dur]))
    counters = pd.DataFrame({"ts": counter_ts, "value": (1 << 20) * (2 + np.sin(np.arange(counter_ts.size) / 50)),
                             "track_id": 20, "name": "HBM in use (bytes)"})
    ops = pd.DataFrame({"id": op_ids, "ts": op_ts, "dur": op_dur, "name": names, "op_id": np.arange(n_ops),
                        "kernel_id": np.arange(n_ops), "device_dur": kernel_dur,
                        "flops": np.where(names == "aten::addmm", 33554432, 32768), "bytes": 1179648,
                        "module": np.char.add("model.", module_of_op.astype(str)), "step": step_of_op})
    kernels = pd.DataFrame({"id": kernel_ids, "ts": kernel_ts, "dur": kernel_dur,
                            "name": np.char.add("kernel_", names.astype(str)), "kernel_id": np.arange(n_ops),
                            "op_id": np.arange(n_ops), "device": 0, "step": step_of_op})
    instructions = pd.DataFrame({"id": ins_ids, "ts": ins_ts, "dur": ins_dur, "engine": ins_engine,
                                 "kernel_id": ins_kernel, "device": 0})
    modules = pd.DataFrame({"id": mod_ids, "ts": mod_ts, "dur": per_mod - 5_000, "module": mod_names,
                            "phase": "forward", "depth": 1, "step": mod_step})
    return SyntheticTrace(slices, tracks, counters, flows, steps, ops, kernels, instructions, modules,
                          metadata={"hardware": "trn2"}, hardware_figures=HARDWARE_FIGURES)


def _frame(ids, ts, dur, names, category, track, depth, parent, args) -> pd.DataFrame:
    n = len(ids)
    return pd.DataFrame({
        "id": np.asarray(ids, dtype=np.int64), "ts": np.asarray(ts, dtype=np.int64),
        "dur": np.asarray(dur, dtype=np.int64), "name": np.asarray(names, dtype=object),
        "category": category, "track_id": np.broadcast_to(np.asarray(track, dtype=np.int64), (n,)),
        "depth": depth, "parent_id": np.broadcast_to(np.asarray(parent, dtype=np.int64), (n,)),
        "args": args if args is not None else [None] * n,
    })


@dataclass
class SyntheticDiff:
    ops: pd.DataFrame

    def to_text(self) -> str:
        return "step time: +0.0%"

    def to_dict(self) -> dict:
        return {"ops": self.ops.to_dict("records")}


def synthetic_diff(a: SyntheticTrace, b: SyntheticTrace) -> SyntheticDiff:
    sa, sb = a.op_stats().set_index("name"), b.op_stats().set_index("name")
    return SyntheticDiff((sb["total_ns"] - sa["total_ns"]).rename("delta_ns").reset_index())
