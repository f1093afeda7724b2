"""Timings AWS has published for real Trainium runs, to calibrate the simulator against.

Only figures the documentation reports as measured on the chip (profiles, benchmark
latencies) are in MEASURED; DOCUMENTED holds the guides' per-instruction cost rules
(cycle counts AWS publishes for the hardware, not a run we can reproduce), and
NOT_SIMULATED the measured figures found but not checked, with why. Sources are the
AWS Neuron SDK documentation (github.com/aws-neuron/aws-neuron-sdk, published at
awsdocs-neuron.readthedocs-hosted.com) and the NKI samples
(github.com/aws-neuron/nki-samples, the tutorial kernels' source).

`kernel` names the builder function in tutorial_kernels.py that issues the same
instruction stream, with its arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MATMUL_TUTORIAL = ("NKI tutorial 'Matrix multiplication', section 'Testing Correctness and "
                   "Benchmarking' (aws-neuron-sdk general/nki/tutorials/"
                   "matrix_multiplication.rst, Neuron SDK 2.20)")
MAMBA_TUTORIAL = ("NKI tutorial 'Fused Mamba' (aws-neuron-sdk nki/guides/tutorials/"
                  "fused_mamba.rst)")
DMA_OVERVIEW = ("NKI 'DMA overview', Example 1: Move A[4,4096] HBM -> SBUF, section 'Profile' "
                "(aws-neuron-sdk nki/get-started/about/nki-dma-overview.rst)")
PERF_GUIDE = ("NKI performance guide, Opt #5a 'Use sufficiently large input tiles in free "
              "dimension' (aws-neuron-sdk nki/deep-dives/nki_perf_guide.rst)")
ARCH_GUIDE = ("Trainium/Inferentia2 architecture guide, Tensor Engine 'Cost Model' "
              "(aws-neuron-sdk nki/guides/architecture/trainium_inferentia2_arch.rst)")
DMA_OVERVIEW_URL = ("https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/about/"
                    "nki-dma-overview.html")
DMA_CURVE = ("NKI DMA bandwidth guide, achieved DMA throughput against bytes per partition "
             "for [128, F] transfers, relative to peak (https://awsdocs-neuron.readthedocs-"
             "hosted.com/en/latest/nki/deep-dives/nki-dma-bandwidth-guide.html; the same "
             "sweep is the DMA overview's figure, " + DMA_OVERVIEW_URL + ")")
DMA_PROFILE = ("NKI 'DMA overview', Example 2: Move A[128,128] HBM -> SBUF, profile screenshots "
               "(" + DMA_OVERVIEW_URL + "; descriptors written by GpSimd, the transfer "
               "triggered from qGpSimdDynamic)")
DGE_GUIDE = ("NKI 'Descriptor Generation Engine (DGE) Reference', hwdge trade-offs "
             "(https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/deep-dives/"
             "nki-dge.html)")
KERNEL_OPT = ("NKI 'Introduction to NKI Kernel Optimization', the matrix multiply kernel's "
              "profiles on trn2, fp32 lhsT [8192, 4096] x rhs [8192, 8192] (https://awsdocs-"
              "neuron.readthedocs-hosted.com/en/latest/nki/how-to-guides/"
              "kernel-optimization.html; durations from the profile screenshots)")
MAMBA_V2_SPILLS = ("its profile: 'The new profile now takes 53.33 ms', VectorE active 58.93%, "
                   "new DMA rows qSyncSpillReload0 and qVectorSpillReload0 ('intermediate "
                   "data spill from SBUF into device memory or reload back to SBUF'), VectorE "
                   "idle on a semaphore wait for them")
TRN2_DMA_PEAK = 16 * 23.0  # B/ns: the DMA bandwidth guide's trn2 aggregate, the curve's 1.0


def _per_transfer_ns(free_bytes: int, relative: float) -> float:
    """A [128, free_bytes] transfer's time at `relative` of trn2's DMA peak."""
    return 128 * free_bytes / (relative * TRN2_DMA_PEAK)


@dataclass(frozen=True)
class Published:
    """One published timing and how to simulate it."""

    name: str
    source: str
    hardware: str  # preset: trn1 | trn2
    dtype: str
    shape: str
    measured_ns: float
    kind: str  # "kernel" (25% tolerance) or "instruction" (10%)
    kernel: tuple  # (tutorial_kernels function name, kwargs)
    # or "dma data phase", "trigger to completion", "time per transfer",
    # "initiation interval"
    what: str = "kernel duration"
    notes: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def tolerance(self) -> float:
        return 0.25 if self.kind == "kernel" else 0.10


MEASURED: tuple[Published, ...] = (
    Published("matmul tutorial, original tiled", MATMUL_TUTORIAL, "trn1", "bfloat16",
              "lhsT [8192, 4096] x rhs [8192, 8192]", 51.80e6, "kernel",
              ("matmul_tutorial", {"version": "tiled", "m_size": 4096, "k_size": 8192,
                                   "n_size": 8192}),
              notes="Trn1.32xlarge; HFU 10.98%"),
    Published("matmul tutorial, optimization 1 (hoisted loads)", MATMUL_TUTORIAL, "trn1",
              "bfloat16", "lhsT [8192, 4096] x rhs [8192, 8192]", 42.96e6, "kernel",
              ("matmul_tutorial", {"version": "hoist_load", "m_size": 4096, "k_size": 8192,
                                   "n_size": 8192}),
              notes="HFU 13.24%"),
    Published("matmul tutorial, optimization 2 (blocked free dims)", MATMUL_TUTORIAL, "trn1",
              "bfloat16", "lhsT [8192, 4096] x rhs [8192, 8192]", 22.07e6, "kernel",
              ("matmul_tutorial", {"version": "block_free", "m_size": 4096, "k_size": 8192,
                                   "n_size": 8192}),
              notes="HFU 26.51%"),
    Published("matmul tutorial, optimization 3 (fully optimized)", MATMUL_TUTORIAL, "trn1",
              "bfloat16", "lhsT [8192, 4096] x rhs [8192, 8192]", 6.97e6, "kernel",
              ("matmul_fully_optimized", {"m_size": 4096, "k_size": 8192, "n_size": 8192}),
              notes="HFU 85.24%; blocks M 16, N 2, K 8 tiles"),
    Published("fused Mamba v1, toy shape", MAMBA_TUTORIAL + ", 'Mapping Mamba Layer'", "trn1",
              "float32", "batch 1, seq_len 512, channels 256, state 16", 172.93e3, "kernel",
              ("mamba", {"version": "v1", "channels": 256, "seq_len": 512}),
              notes="'172.93 usec'; the tutorial's kernels target Trn1/Inf2"),
    Published("fused Mamba v1, 4096 channels", MAMBA_TUTORIAL + ", 'Increasing input "
              "channels size'", "trn1", "float32", "batch 1, seq_len 512, channels 4096, "
              "state 16", 2.34e6, "kernel",
              ("mamba", {"version": "v1", "channels": 4096, "seq_len": 512})),
    Published("fused Mamba v2, 4096 channels", MAMBA_TUTORIAL + ", loop reordering ('The "
              "device execution time is now 1.61 ms')", "trn1", "float32",
              "batch 1, seq_len 512, channels 4096, state 16", 1.61e6, "kernel",
              ("mamba", {"version": "v2", "channels": 4096, "seq_len": 512})),
    # the tutorial's scaling table, v3 (seq_len tiled by 512) at each seq_len
    *(Published(f"fused Mamba v3, seq_len {seq}", MAMBA_TUTORIAL + where, "trn1", "float32",
                f"batch 1, seq_len {seq}, channels 4096, state 16", ms * 1e6, "kernel",
                ("mamba", {"version": "v3", "channels": 4096, "seq_len": seq}), notes=notes)
      for seq, ms, where, notes in (
          (1024, 3.3, ", scaling table", ""),
          (2048, 6.6, ", 'Increasing input seq_len size', scaling table", ""),
          (3072, 10.1, ", scaling table", ""), (4096, 13.3, ", scaling table", ""),
          (5120, 17.3, ", scaling table", ""), (6144, 19.6, ", scaling table", ""),
          (7168, 24.2, ", scaling table", ""),
          (8192, 27.8, ", seq_len tiling ('the kernel now takes 27.8 ms')",
           "VectorE 94.85% active, 'no longer ... spilling related DMA activities'"))),
    # v2 at every seq_len of the scaling table: from 7168 on its live tiles do not fit
    # in SBUF and it spills (the model's allocation spills from 5120 on)
    *(Published(f"fused Mamba v2, seq_len {seq}", MAMBA_TUTORIAL + ", scaling table", "trn1",
                "float32", f"batch 1, seq_len {seq}, channels 4096, state 16", ms * 1e6,
                "kernel", ("mamba", {"version": "v2", "channels": 4096, "seq_len": seq}),
                notes=MAMBA_V2_SPILLS if seq == 8192 else "")
      for seq, ms in ((1024, 4.4), (2048, 8.9), (3072, 13.1), (4096, 17.6), (5120, 23.7),
                      (6144, 27.5), (7168, 41.3), (8192, 52.2))),
    Published("DMA HBM -> SBUF, 32 KiB on one engine", DMA_OVERVIEW, "trn2", "bfloat16",
              "[4, 4096] (4 partitions, 8 KiB each)", 1416.0, "instruction",
              ("dma_load_rows", {"partitions": 4, "free_bytes": 8192, "software_dge": True}),
              what="dma data phase",
              notes="'the first DMA engine takes 1416 ns to load 32 KiB'; the time from "
                    "trigger to first byte is not part of the engine's bar"),
    Published("DMA HBM -> SBUF, 2 KiB on one engine (8 rows x 256 B)", DMA_PROFILE, "trn2",
              "bfloat16", "[128, 128] (16 engines, 8 partitions x 256 B each)", 97.0,
              "instruction",
              ("dma_load_rows", {"partitions": 128, "free_bytes": 256, "software_dge": True}),
              what="dma data phase",
              notes="each engine's 2 KiB read in the profile; calibrates dma_descriptor_ns "
                    "(about 1 ns per row beyond 2 KiB at 23 B/ns)"),
    Published("DMA trigger to completion, [128, 128] bf16 load", DMA_PROFILE, "trn2",
              "bfloat16", "[128, 128] (16 engines, 2 KiB each)", 1200.0, "instruction",
              ("dma_load_rows", {"partitions": 128, "free_bytes": 256, "software_dge": True}),
              what="trigger to completion",
              notes="about 1.2 us from the GpSimd trigger to the semaphore; calibrates "
                    "dma_fixed_ns (trigger to first byte)"),
    *(Published(f"DMA throughput, [128, {free}] loads back to back ({rel:.2f} of peak)",
                DMA_CURVE, "trn2", "uint8", f"[128, {free} B] per transfer",
                _per_transfer_ns(free, rel), "instruction",
                ("dma_stream", {"free_bytes": free, "software_dge": True}),
                what="time per transfer",
                notes=f"relative throughput {rel} of {TRN2_DMA_PEAK:.0f} GB/s, as a time per "
                      "transfer; calibrates swdge_descriptor_cycles (GpSimd writes 128 "
                      "descriptors per transfer), the longer rows check the data phase")
      for free, rel in ((256, 0.10), (512, 0.21), (1024, 0.42), (2048, 0.81), (4096, 0.97))),
    Published("kernel-optimisation matmul v2 (tiled)", KERNEL_OPT, "trn2", "float32",
              "lhsT [8192, 4096] x rhs [8192, 8192]", 39.9e6, "kernel",
              ("matmul_tutorial", {"version": "tiled", "m_size": 4096, "k_size": 8192,
                                   "n_size": 8192, "dtype": "float32", "fold": 1}),
              notes="DMA-bound: 'DMA engines were active 99.93%', 'TensorE was only active "
                    "about 69.83%'; two loads ([128, 128] and [128, 512] fp32: 512 B and "
                    "2 KiB rows) per 853 ns matmul"),
    Published("kernel-optimisation matmul v3 (hoisted loads)", KERNEL_OPT, "trn2", "float32",
              "lhsT [8192, 4096] x rhs [8192, 8192]", 28.2e6, "kernel",
              ("matmul_tutorial", {"version": "hoist_load", "m_size": 4096, "k_size": 8192,
                                   "n_size": 8192, "dtype": "float32", "fold": 1}),
              notes="'the TensorE is busy 99.85% of the time', DMA 99.73%: the Tensor "
                    "Engine's fp32 rate bounds it"),
    Published("ScalarE tiny dependent instructions", PERF_GUIDE, "trn1", "float32",
              "activation (identity, scale/bias tensors) on [128, 1], each reading the "
              "previous output", 189.0, "instruction",
              ("dependent_tiny_activations", {"count": 16}), what="initiation interval",
              notes="'around 189 ns (264 ScalarE cycles on NC-v2)'"),
)

# The guides' published per-instruction costs (closed forms, 10%).
DOCUMENTED: tuple[Published, ...] = (
    Published("MultiplyMoving issue interval, N=512", ARCH_GUIDE, "trn1", "bfloat16",
              "moving [128, 512]", 512 / 2.8, "instruction", ("matmul_ns", {"n": 512}),
              what="initiation interval", notes="max(N, 64) cycles at 2.8 GHz"),
    Published("MultiplyMoving issue interval, N=32", ARCH_GUIDE, "trn1", "bfloat16",
              "moving [128, 32]", 64 / 2.8, "instruction", ("matmul_ns", {"n": 32}),
              what="initiation interval", notes="MM_INIT_LATENCY = 64 cycles"),
    Published("hardware DGE DMA instruction", DGE_GUIDE, "trn2", "uint8",
              "[128, 256 B] loads back to back", 600.0, "instruction",
              ("dma_stream", {"free_bytes": 256, "software_dge": False}),
              what="time per transfer",
              notes="'each hardware-DGE DMA instruction takes approximately 600 ns'"),
    Published("LoadStationary issue interval", PERF_GUIDE.replace("Opt #5a 'Use sufficiently "
              "large input tiles in free dimension'", "TensorE section"), "trn1", "bfloat16",
              "stationary [128, 128]", 32 / 2.8, "instruction", ("load_stationary_ns", {}),
              what="initiation interval", notes="'LS_II ~= 128/4 = 32 cycles'"),
)

# Measured figures found but not simulated, and why.
NOT_SIMULATED: tuple[tuple[str, str, str], ...] = (
    ("LayerNorm tutorial v1 / v2, (300, 1000) fp32 on trn1: p50 2311 us / 1969 us",
     ("aws-neuron-sdk general/nki/tutorials/layernorm.rst (SDK 2.20), 'Performance in "
     "Version 1 and Version 2'"),
     ("the kernel's own work is ~15 us of Vector Engine cycles and 2.4 MB of DMA; the "
     "benchmark's NCLatency evidently includes per-execution overhead the guide does not "
     "break down, so no instruction stream can be checked against it")),
    (("NKIBench's best SiLU kernel, [4096, 7168] fp32, said to stream 294 GB/s on one "
      "trn1 core (issue 31)"),
     ("NKIBench (github.com/zhang677/AccelOpt, NKIBench/kernels/silu_M4096_N7168_0.py); "
      "the runs found of it are third-party notes on trn2"),
     ("no AWS or NKIBench publication of a trn1 time was found; the notes found report "
      "0.2938 ms on one trn2 core (235 MB, 800 GB/s: over any per-core DMA or HBM "
      "figure), so the 294 GB/s may be that 0.2938 ms misread. The model streams "
      "SiLU at 271 GB/s on trn1 (capped by 16 x 17 B/ns, the DMA bandwidth guide)")),
    ("Mamba PyTorch reference: 151.83 ms", MAMBA_TUTORIAL,
     "a whole compiled PyTorch graph, not a kernel whose instructions are known"),
)


NCCOM_TEST = ("AWS 'NCCOM-TEST User Guide', examples (https://awsdocs-neuron.readthedocs-hosted."
              "com/en/latest/tools/neuron-sys-tools/nccom-test.html; aws-neuron-sdk tools/"
              "neuron-sys-tools/nccom-test.rst). Run on trn1.32xlarge: the page covers trn1 and "
              "inf2, its 32-rank example needs trn1.32xlarge's 32 NeuronCores, and its "
              "two-instance example is Trainium only. time(us) is the p50 of the collectives")


@dataclass(frozen=True)
class PublishedCollective:
    """One published collective timing (nccom-test) and the group it ran on."""

    collective: str  # interconnect.ALL_REDUCE, ALL_GATHER, ...
    ranks: int
    instances: int
    dtype: str
    nbytes: int
    measured_ns: float
    source: str = NCCOM_TEST
    hardware: str = "trn1"
    # why the model misses this point by more than 15%, and the bound it is held to then
    gap: str = ""
    bound: float = 0.15

    @property
    def name(self) -> str:
        where = "2 instances" if self.instances > 1 else "1 instance"
        return f"{self.collective.replace('_', '-')}, {self.ranks} ranks ({where})"


_OVERLAP = ("the 58 us start partly overlaps the first chunks' transfer at a few MiB; the "
            "model adds the two")
_TWO_INSTANCES = ("between 256 B and 64 MiB the measured time climbs from the tiny messages' "
                  "520 us to a ~1.3 ms plateau (64 KiB-2 MiB) before it turns bandwidth-bound: "
                  "Neuron's algorithm for two instances is not published, and the model has "
                  "only its 520 us tree and the bandwidth term, so it is fast there")


def _sweep(collective: str, ranks: int, instances: int, dtype: str, first: int, factor: int,
           times_us: tuple[float, ...], gaps: dict[int, tuple[str, float]] | None = None
           ) -> tuple[PublishedCollective, ...]:
    gaps = gaps or {}
    out = []
    for i, t in enumerate(times_us):
        nbytes = first * factor ** i
        gap, bound = gaps.get(nbytes, ("", 0.15))
        out.append(PublishedCollective(collective, ranks, instances, dtype, nbytes, t * 1e3,
                                       gap=gap, bound=bound))
    return tuple(out)


COLLECTIVES: tuple[PublishedCollective, ...] = (
    # "nccom-test -r 2 allr": 32 MB, 768 us, 40.69 GB/s bus bandwidth (GiB/s: 2^25 B / 768 us)
    PublishedCollective("all_reduce", 2, 1, "uint8", 1 << 25, 768e3),
    # "-r 2 --minbytes 1kb --maxbytes 1gb --stepfactor 4 --datatype fp32 allr"
    *_sweep("all_reduce", 2, 1, "float32", 1 << 10, 4,
            (58, 58, 58, 58, 60, 68, 107, 332, 1214, 4750, 18930),
            {4 << 20: (_OVERLAP, 0.25)}),
    # "-r 32 --minbytes 1kb --maxbytes 1mb --stepfactor 8 --datatype fp32 --check allg"
    *_sweep("all_gather", 32, 1, "float32", 1 << 10, 8, (151, 149, 150, 179)),
    # "-r 64 -N 2 -b 8 -e 1GB -f 2 -n 50 -w 5 -d fp32 allr": two trn1.32xlarge over EFA
    *_sweep("all_reduce", 64, 2, "float32", 8, 2,
            (520, 520, 523, 525, 553, 709, 782, 840, 881, 916, 1013, 1031, 1174, 1315, 1315,
             1311, 1312, 1328, 1329, 1378, 1419, 2138, 2711, 3963, 6279, 11954, 21803, 41806),
            {8 << k: (_TWO_INSTANCES, 0.65) for k in range(5, 24)}),
)
