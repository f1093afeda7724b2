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
    what: str = "kernel duration"  # or "dma data phase", "initiation interval"
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
    Published("fused Mamba v3, seq_len 2048", MAMBA_TUTORIAL + ", 'Increasing input seq_len "
              "size', scaling table", "trn1", "float32",
              "batch 1, seq_len 2048, channels 4096, state 16", 6.6e6, "kernel",
              ("mamba", {"version": "v3", "channels": 4096, "seq_len": 2048})),
    Published("fused Mamba v3, seq_len 4096", MAMBA_TUTORIAL + ", scaling table", "trn1",
              "float32", "batch 1, seq_len 4096, channels 4096, state 16", 13.3e6, "kernel",
              ("mamba", {"version": "v3", "channels": 4096, "seq_len": 4096})),
    Published("fused Mamba v3, seq_len 8192", MAMBA_TUTORIAL + ", seq_len tiling ('the "
              "kernel now takes 27.8 ms')", "trn1", "float32",
              "batch 1, seq_len 8192, channels 4096, state 16", 27.8e6, "kernel",
              ("mamba", {"version": "v3", "channels": 4096, "seq_len": 8192})),
    Published("DMA HBM -> SBUF, 32 KiB on one engine", DMA_OVERVIEW, "trn2", "bfloat16",
              "[4, 4096] (4 partitions, 8 KiB each)", 1416.0, "instruction",
              ("dma_load_rows", {"partitions": 4, "free_bytes": 8192}),
              what="dma data phase",
              notes="'the first DMA engine takes 1416 ns to load 32 KiB'; the ~1.3 us "
                    "semaphore-to-start latency is not part of the engine's bar"),
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
    ("fused Mamba v2, seq_len 8192: 53.33 ms, and the v2 column of the scaling table",
     MAMBA_TUTORIAL,
     ("dominated by the compiler's SBUF spill/reload decisions for a kernel that does not "
     "fit, which the tutorial does not describe instruction by instruction")),
    ("Mamba PyTorch reference: 151.83 ms", MAMBA_TUTORIAL,
     "a whole compiled PyTorch graph, not a kernel whose instructions are known"),
    ("hardware DGE DMA instruction ~600 ns", "aws-neuron-sdk nki/deep-dives/nki-dge.rst",
     ("descriptor generation on the issuing engine is not modelled (the ~1.3 us DMA fixed "
     "cost stands for the whole start latency)")),
)
