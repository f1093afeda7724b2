"""A synthetic trace file, written with the project's own Perfetto writer, for the dashboard's
tests and benchmarks: load it with `neuron_explorer.load` and it is a real `Trace`.

It has the structure of a recorded eager training loop (steps > modules > ops and a
sync per step on the host; kernels, engine instructions, DMA and an HBM counter on
the device; flows op -> kernel -> first instruction) at any size, written with numpy
batches in about a second per million events.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from neuron_explorer.common import trace_format as tf

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

ENGINES = ["tensor", "vector", "scalar", "gpsimd"]
OP_NAMES = ["aten::addmm", "aten::relu", "aten::mul", "aten::add", "aten::sum", "aten::copy_"]
MODULES_PER_STEP = 4
OP_GAP_NS = 40_000  # between launches: the host, not the device, sets the pace
OP_FLOPS = {"aten::addmm": 33_554_432}
OP_BYTES = 1_179_648
SYNC_SOURCE = "train.py:50"
OP_SOURCE = "train.py:42"


def events_in(n_steps: int, ops_per_step: int, instructions_per_kernel: int = 3) -> int:
    """How many events `write_trace` writes (slices and counter samples)."""
    n_ops = n_steps * ops_per_step
    return (2 * n_steps + n_steps * MODULES_PER_STEP + n_ops * (3 + instructions_per_kernel)
            + 2 * n_ops)


def write_trace(path: Path, n_steps: int = 3, ops_per_step: int = 40,
                instructions_per_kernel: int = 3, seed: int = 0) -> Path:
    """Write a trace of `n_steps` eager steps to `path` (.pftrace); returns the path."""
    from neuron_explorer.collectors.perfetto_writer import PerfettoWriter
    from neuron_explorer.common.presets import get_preset

    rng = np.random.default_rng(seed)
    k = instructions_per_kernel
    n_ops = n_steps * ops_per_step
    step_len = ops_per_step * OP_GAP_NS + 200_000
    step_of_op = np.repeat(np.arange(n_steps), ops_per_step)
    pos_in_step = np.tile(np.arange(ops_per_step), n_steps)
    op_ts = step_of_op * step_len + 10_000 + pos_in_step * OP_GAP_NS
    name_index = rng.integers(0, len(OP_NAMES), n_ops)
    module_of_op = pos_in_step * MODULES_PER_STEP // ops_per_step
    kernel_ts = op_ts + 20_000
    kernel_dur = rng.integers(2_000, 12_000, n_ops)

    w = PerfettoWriter(str(path))
    w.process(100, "python train.py", ["python", "train.py"])
    main = w.thread(100, 100, "MainThread")
    device = w.process(1000, tf.DEVICE_PROCESS.format(index=0, preset="trn2"))
    kernels = w.track(tf.TRACK_KERNELS, device)
    engines = {e: w.track(tf.ENGINE_TRACKS[e], device) for e in ENGINES}
    dma = w.track(tf.DMA_TRACK.format(queue=0), device)
    hbm = w.counter_track(tf.COUNTER_HBM, device, "bytes")
    w.metadata(main, 0, {tf.META_HARDWARE: "trn2",
                         tf.META_HARDWARE_FIGURES: get_preset("trn2").figures(),
                         tf.META_LEVEL: "engine"})

    def batch(track, ts, dur, names: list[str], index, category: str, **kw) -> None:
        n = len(ts)
        tracks = np.full(n, track) if np.isscalar(track) else track
        w.slices(tracks, np.asarray(ts), np.asarray(dur), names, np.asarray(index), category, **kw)

    # host: steps > modules > ops, a sync at the end of each step
    steps_ts = np.arange(n_steps) * step_len
    batch(main, steps_ts, np.full(n_steps, step_len - 50_000),
          [f"step {i}" for i in range(n_steps)], np.arange(n_steps), tf.CAT_STEP,
          int_args={tf.ARG_STEP: np.arange(n_steps)})
    per_module = ops_per_step // MODULES_PER_STEP * OP_GAP_NS
    module_index = np.tile(np.arange(MODULES_PER_STEP), n_steps)
    module_names = [f"model.{i}" for i in range(MODULES_PER_STEP)]
    batch(main, np.repeat(steps_ts, MODULES_PER_STEP) + 10_000 + module_index * per_module,
          np.full(n_steps * MODULES_PER_STEP, per_module - 5_000), module_names, module_index,
          tf.CAT_MODULE, str_args={tf.ARG_MODULE: (module_names, module_index),
                                   tf.ARG_PHASE: (["forward"], np.zeros_like(module_index))})
    op_flow = np.arange(n_ops, dtype=np.uint64) + 1
    kernel_flow = op_flow + n_ops
    flops = np.array([OP_FLOPS.get(n, 32_768) for n in OP_NAMES])[name_index]
    zeros = np.zeros(n_ops, np.int64)
    batch(main, op_ts, np.full(n_ops, 30_000), OP_NAMES, name_index, tf.CAT_OP,
          int_args={tf.ARG_OP_ID: np.arange(n_ops), tf.ARG_KERNEL_ID: np.arange(n_ops),
                    tf.ARG_FLOPS: flops, tf.ARG_BYTES: np.full(n_ops, OP_BYTES),
                    tf.ARG_STEP: step_of_op},
          str_args={tf.ARG_MODULE: (module_names, module_of_op),
                    tf.ARG_SOURCE: ([OP_SOURCE], zeros),
                    tf.ARG_SHAPES: (["[[64, 512], [512, 512]]"], zeros),
                    tf.ARG_DTYPES: (["[float32, float32]"], zeros)},
          flow_out=op_flow)
    sync_index = np.zeros(n_steps, np.int64)
    batch(main, steps_ts + step_len - 190_000, np.full(n_steps, 120_000), ["aten::item"],
          sync_index, tf.CAT_SYNC, str_args={tf.ARG_SYNC_KIND: (["item"], sync_index),
                                             tf.ARG_SOURCE: ([SYNC_SOURCE], sync_index)})
    # device: a kernel per op, its instructions across the engines, a DMA load before it
    kernel_names = [f"kernel_{n}" for n in OP_NAMES]
    batch(kernels, kernel_ts, kernel_dur, kernel_names, name_index, tf.CAT_KERNEL,
          int_args={tf.ARG_KERNEL_ID: np.arange(n_ops), tf.ARG_OP_ID: np.arange(n_ops),
                    tf.ARG_BYTES: np.full(n_ops, OP_BYTES), tf.ARG_STEP: step_of_op},
          flow_in=op_flow, flow_out=kernel_flow)
    of_kernel = np.repeat(np.arange(n_ops), k)
    slot = np.tile(np.arange(k), n_ops)
    engine_index = slot % len(ENGINES)
    first = np.zeros(n_ops * k, np.uint64)
    first[::k] = kernel_flow
    batch(np.array([engines[ENGINES[e]] for e in engine_index]),
          kernel_ts[of_kernel] + slot * (kernel_dur[of_kernel] // k),
          np.maximum(kernel_dur[of_kernel] // k - 100, 10), ["MultiplyMoving", "TensorTensor"],
          (engine_index != 0).astype(np.int64), tf.CAT_INSTRUCTION, flow_in=first)
    batch(dma, kernel_ts - 1_500, np.full(n_ops, 1_400), ["DmaLoad"], zeros, tf.CAT_DMA)
    counter_ts = np.sort(np.concatenate([kernel_ts, kernel_ts + kernel_dur]))
    in_use = ((1 << 20) * (2 + np.sin(np.arange(counter_ts.size) / 50))).astype(np.int64)
    w.counters(np.full(counter_ts.size, hbm), counter_ts, in_use)
    w.close()
    return Path(path)


def load_synthetic(folder: Path, n_steps: int = 3, ops_per_step: int = 40, seed: int = 0) -> Trace:
    """Write a synthetic trace into `folder` and load it: a real `Trace`."""
    import neuron_explorer

    path = write_trace(Path(folder) / f"synthetic_{n_steps}x{ops_per_step}_{seed}.pftrace",
                       n_steps, ops_per_step, seed=seed)
    from neuron_explorer.trace import Trace

    trace = neuron_explorer.load(path)
    assert isinstance(trace, Trace)
    return trace
