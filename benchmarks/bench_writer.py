"""Trace writer throughput: events per second into a .pftrace, and memory as events grow.

Writes an engine-level mix as the recorder writes it, in the proportions of a
recorded training step (per 100 events: 1 host slice such as a module or a sync,
written one call each; 5 op slices, 3 kernel slices, 74 instructions and 17 counter
values, written in numpy batches) until N events, and reports:
- events/s for the mix and for each kind (target: >= 1,000,000 events/s);
- resident memory after 10% and after 100% of the events (flat: the writer streams);
- the ratio against a baseline measured in the same run: the same instruction events
  built as perfetto `TracePacket` message objects and serialised one by one.

    python benchmarks/bench_writer.py [--events 1000000]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import psutil
from neuron_explorer.collectors.perfetto_writer import PerfettoWriter

BATCH = 16384  # what the device sink buffers before writing a batch
OPCODES = ["MultiplyMoving", "LoadStationary", "TensorTensor", "Activation", "TensorCopy",
           "DmaLoad", "DmaStore"]
ENGINES = ["tensor", "vector", "scalar", "gpsimd", "dma.0", "dma.1"]


class Mix:
    """Synthetic events in the proportions of a recorded step."""

    def __init__(self, writer: PerfettoWriter) -> None:
        self.w = writer
        proc = writer.process(1, "python train.py", ["python", "train.py"])
        self.thread = writer.thread(1, 1, "MainThread")
        dev = writer.process(2, "neuron:0 (trn2)")
        self.kernels_track = writer.track("Kernels", dev)
        self.engine_tracks = np.array([writer.track(e, dev) for e in ENGINES], np.int64)
        self.counter_tracks = np.array([writer.counter_track(n, dev, "bytes") for n in
                                        ("HBM in use (bytes)", "SBUF occupancy (bytes)")])
        self.rng = np.random.default_rng(0)
        self.t = 10**9
        self.op_id = 0
        self.prepared = writer.prepare_args({"shapes": "[[64, 512], [512, 512]]",
                                             "dtypes": "[float32, float32]", "flops": 1 << 25,
                                             "bytes": 1 << 20, "module": "model.layers.3.mlp",
                                             "source": "train.py:42", "fallback": False,
                                             "device": 0})
        del proc

    def per_call(self, n: int) -> int:
        """Host slices (modules, syncs), one call each, as they happen."""
        w = self.w
        for _ in range(n):
            self.t += 1000
            w.slice(self.thread, self.t, 500, "model.layers.3.mlp", "module",
                    {"module": "model.layers.3.mlp", "phase": "forward", "step": 3})
        return n

    def ops(self, n: int) -> int:
        """Op slices in one batch, as the device sink writes them (views have no kernel)."""
        ids = np.arange(self.op_id + 1, self.op_id + n + 1)
        self.op_id += n
        kernel_ids = np.where(ids % 3 == 0, -1, ids)
        self.w.slices(np.full(n, self.thread), self.t + np.arange(n) * 1000, np.full(n, 500),
                      ["aten::addmm", "aten::view"], (kernel_ids < 0).astype(np.int64), "op",
                      {"op_id": ids, "step": np.full(n, 3),
                       "kernel_id": (kernel_ids, kernel_ids >= 0)},
                      flow_out=np.where(kernel_ids >= 0, ids, 0).astype(np.uint64),
                      prepared=([self.prepared], np.zeros(n, np.int64)))
        self.t += n * 1000
        return n

    def kernels(self, n: int) -> int:
        """Kernel slices in one batch, as the device sink writes them."""
        ids = np.arange(self.op_id - n + 1, self.op_id + 1)
        self.w.slices(np.full(n, self.kernels_track), self.t + np.arange(n) * 700,
                      np.full(n, 300), ["matmul_fp32_64x512x512"], np.zeros(n, np.int64),
                      "kernel", {"kernel_id": ids, "op_id": ids, "step": np.full(n, 3)},
                      flow_out=np.zeros((n, 2), np.uint64), flow_in=ids,
                      prepared=([self.prepared], np.zeros(n, np.int64)))
        return n

    def instructions(self, n: int) -> int:
        rng = self.rng
        engine = rng.integers(0, len(ENGINES), n)
        ts = self.t + np.cumsum(rng.integers(10, 200, n))
        flows = np.where(rng.random(n) < 0.05, rng.integers(1, 1 << 40, n), 0)
        self.w.slices(self.engine_tracks[engine], ts, rng.integers(5, 150, n), OPCODES,
                      rng.integers(0, len(OPCODES), n), "instruction",
                      {"kernel_id": rng.integers(1, 1 << 20, n),
                       "bytes": rng.integers(0, 1 << 16, n),
                       "flops": rng.integers(0, 1 << 24, n)},
                      {"engine": (ENGINES, engine)}, flow_in=flows)
        return n

    def counters(self, n: int) -> int:
        rng = self.rng
        self.w.counters(self.counter_tracks[rng.integers(0, 2, n)],
                        self.t + np.cumsum(rng.integers(10, 500, n)), rng.integers(0, 1 << 34, n))
        return n


def run_mix(path: str, total: int) -> tuple[float, int, int, int]:
    """Write the mix; return (seconds, events, rss at 10%, rss at the end)."""
    proc = psutil.Process()
    w = PerfettoWriter(path)
    mix = Mix(w)
    events = 0
    rss_10 = 0
    start = time.perf_counter()
    while events < total:
        events += mix.instructions(BATCH)
        events += mix.counters(BATCH * 17 // 74)
        events += mix.ops(BATCH * 5 // 74)
        events += mix.kernels(BATCH * 3 // 74)
        events += mix.per_call(BATCH // 74)
        if not rss_10 and events >= total // 10:
            rss_10 = proc.memory_info().rss
    w.close()
    return time.perf_counter() - start, events, rss_10, proc.memory_info().rss


def rate_of(path: str, kind: str, total: int) -> float:
    w = PerfettoWriter(path)
    mix = Mix(w)
    events = 0
    start = time.perf_counter()
    while events < total:
        if kind == "instructions":
            events += mix.instructions(BATCH)
        elif kind == "counters":
            events += mix.counters(BATCH)
        elif kind == "ops":
            events += mix.ops(4096)
        else:
            events += mix.per_call(1000)
    w.close()
    return events / (time.perf_counter() - start)


def protobuf_object_rate(path: str, total: int) -> float:
    """Baseline: one TracePacket message object per instruction begin/end, serialised."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    rng = np.random.default_rng(0)
    start = time.perf_counter()
    with open(path, "wb") as f:
        for i in range(total):
            out = []
            for kind, ts in ((pb.TrackEvent.TYPE_SLICE_BEGIN, 1000 * i),
                             (pb.TrackEvent.TYPE_SLICE_END, 1000 * i + 50)):
                packet = pb.TracePacket(timestamp=ts, trusted_packet_sequence_id=1,
                                        sequence_flags=2)
                packet.track_event.type = kind
                packet.track_event.track_uuid = 3
                if kind == pb.TrackEvent.TYPE_SLICE_BEGIN:
                    packet.track_event.name_iid = 1 + i % 7
                    packet.track_event.category_iids.append(1)
                    for iid, value in ((1, i), (2, int(rng.integers(0, 1 << 16))), (3, i * 3)):
                        a = packet.track_event.debug_annotations.add()
                        a.name_iid = iid
                        a.int_value = value
                    a = packet.track_event.debug_annotations.add()
                    a.name_iid = 4
                    a.string_value = "tensor"
                trace = pb.Trace()
                trace.packet.append(packet)
                out.append(trace.SerializeToString())
            f.write(b"".join(out))
    return total / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "bench.pftrace")
        seconds, events, rss_10, rss_end = run_mix(path, args.events)
        size = os.path.getsize(path)
        mix_rate = events / seconds
        instr = rate_of(path, "instructions", args.events // 2)
        counters = rate_of(path, "counters", args.events // 4)
        ops = rate_of(path, "ops", args.events // 4)
        per_call = rate_of(path, "per_call", 50_000)
        baseline = protobuf_object_rate(path, 20_000)
    print(f"mix: {events:,} events in {seconds:.2f}s = {mix_rate:,.0f} events/s "
          f"({mix_rate / 1e6:.2f}x the 1M events/s target), {size / events:.0f} bytes/event")
    print(f"memory: {rss_10 / 2**20:.0f} MiB after 10% of the events, {rss_end / 2**20:.0f} MiB "
          f"after all ({rss_end / rss_10:.2f}x)")
    print(f"per kind: instructions {instr:,.0f}/s, counters {counters:,.0f}/s, "
          f"op slices in batches {ops:,.0f}/s, host slices one call each {per_call:,.0f}/s")
    print(f"baseline (protobuf message objects, one per event): {baseline:,.0f} events/s; "
          f"hand-encoded mix {mix_rate / baseline:.1f}x, batched instructions "
          f"{instr / baseline:.1f}x, per-call slices {per_call / baseline:.1f}x")


if __name__ == "__main__":
    main()
