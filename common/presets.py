"""Hardware presets: the published figures of one NeuronCore of trn1, trn2 and trn3.

Every figure the cost model uses lives here and nowhere else. Sources: the AWS
Neuron SDK architecture guides (NKI `trainium*_arch`, `neuron-core-v2/v3/v4`),
the NKI performance and DMA guides. Where two sources disagree the choice is
noted next to the field. Peak rates are built from array size x clock, never
copied from chip totals (chip TFLOPS are not exactly cores x per-core TFLOPS).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from neuron_explorer.common.errors import NeuronExplorerError

GiB = 1 << 30
MiB = 1 << 20
KiB = 1 << 10


class UnknownPresetError(NeuronExplorerError, ValueError):
    """A hardware preset name that is not one of PRESETS."""

    def __init__(self, name: str) -> None:
        self.name = name
        valid = ", ".join(sorted(PRESETS))
        super().__init__(f"unknown hardware preset {name!r}: choose one of {valid}")


@dataclass(frozen=True)
class HardwarePreset:
    """The figures of one NeuronCore (one `neuron` device) and of the chip it sits on."""

    name: str  # "trn2"
    chip_name: str  # "Trainium2"
    core_name: str  # "NeuronCore-v3"
    cores_per_chip: int
    partitions: int  # SBUF/PSUM rows = engine lanes of the Tensor Engine array
    te_rows: int  # systolic array (contraction dim, on partitions)
    te_cols: int  # systolic array (stationary free dim = output partitions)
    te_clock_ghz: float
    te_fp32_slowdown: float  # FP32 matmuls cost this many times a BF16 one
    te_fp8_speedup: float  # FP8 matmuls run this many times a BF16 one
    te_min_issue_cycles: int  # issue interval = max(N, this) cycles
    te_moving_free_max: int  # moving tile free size (columns) per MultiplyMoving
    te_load_speedup: float  # LoadStationary is this many times faster than a matmul
    te_throttle_start: float  # Tensor Engine rate at the start of activity (1.0: no ramp)
    te_throttle_ramp_ns: float  # activity time to reach full rate
    te_throttle_idle_ns: float  # an idle gap this long re-engages the throttle
    vector_clock_ghz: float
    vector_lanes: int  # for 32-bit and other dtypes
    vector_lanes_16bit: int  # for BF16/FP16 (and FP8 where supported)
    scalar_clock_ghz: float
    scalar_lanes: int
    scalar_lanes_16bit: int
    gpsimd_clock_ghz: float
    gpsimd_cores: int
    gpsimd_simd_bits: int
    engine_fixed_cycles: int  # fixed cost of a Vector/Scalar/GpSimd instruction
    engine_access_cycles: int  # cost of each SBUF/PSUM operand access
    sbuf_bytes: int
    psum_bytes: int
    psum_banks: int
    dma_engines: int
    dma_queues_per_engine: int
    dma_engine_bytes_per_ns: float  # per DMA engine; x engines = the core's DMA bandwidth
    dma_fixed_ns: float  # latency of one transfer from its trigger to its first byte
    dma_descriptor_ns: float  # a DMA engine's cost per descriptor (contiguous row) it moves
    # Hardware descriptor generation (DGE): time one DMA instruction holds its DGE block
    # before it triggers; 0 where descriptors are pre-computed (no DGE block)
    dma_issue_ns: float
    # Software descriptor generation on GpSimd: cycles per descriptor written
    swdge_descriptor_cycles: float
    dma_saturation_bytes: int  # bytes per partition at which a transfer reaches full rate
    # (bytes per descriptor row, fraction of the engine's rate) points, increasing
    dma_efficiency_curve: tuple[tuple[int, float], ...]
    hbm_bytes: int  # this core's share of the chip's HBM
    hbm_bytes_per_ns: float  # this core's share of the chip's HBM bandwidth (GB/s == B/ns)
    sbuf_to_hbm_bandwidth_ratio: float
    chip_hbm_bytes: int
    chip_hbm_bytes_per_ns: float
    neuronlink_bytes_per_ns: float
    launch_latency_ns: int  # device-side delay from a launch to the earliest kernel start
    host_launch_overhead_ns: int  # host time the runtime spends per kernel launch
    host_link_bytes_per_ns: float  # host <-> device transfers (host fallback)
    host_fallback_fixed_ns: int  # host round trip per fallback op (sync, runtime)
    host_compute_bytes_per_ns: float  # host memory rate assumed for fallback compute

    # --- derived figures -------------------------------------------------------------
    @property
    def sbuf_partition_bytes(self) -> int:
        return self.sbuf_bytes // self.partitions

    @property
    def psum_partition_bytes(self) -> int:
        return self.psum_bytes // self.partitions

    @property
    def psum_bank_fp32(self) -> int:
        """FP32 accumulators per partition in one PSUM bank (512)."""
        return self.psum_partition_bytes // self.psum_banks // 4

    @property
    def dma_bytes_per_ns(self) -> float:
        return self.dma_engine_bytes_per_ns * self.dma_engines

    @property
    def memory_bytes_per_ns(self) -> float:
        """What a streaming kernel can reach: the lower of HBM and DMA bandwidth."""
        return min(self.hbm_bytes_per_ns, self.dma_bytes_per_ns)

    def te_peak_flops(self, dtype: str = "bfloat16") -> float:
        """Dense Tensor Engine peak in FLOP/s for `dtype` (multiply-add = 2)."""
        base = 2.0 * self.te_rows * self.te_cols * self.te_clock_ghz * 1e9
        return base * te_rate_factor(self, dtype)

    def figures(self) -> dict:
        """JSON-able peak figures, for trace metadata and the explorer's roofline."""
        return {
            "preset": self.name,
            "chip": self.chip_name,
            "core": self.core_name,
            "cores_per_chip": self.cores_per_chip,
            "tensor_peak_flops": {
                dt: self.te_peak_flops(dt)
                for dt in ("bfloat16", "float16", "float8_e4m3fn", "float32")
            },
            "hbm_bytes_per_s": self.hbm_bytes_per_ns * 1e9,
            "hbm_bytes": self.hbm_bytes,
            "dma_bytes_per_s": self.dma_bytes_per_ns * 1e9,
            "memory_bytes_per_s": self.memory_bytes_per_ns * 1e9,
            "sbuf_bytes": self.sbuf_bytes,
            "psum_bytes": self.psum_bytes,
            "psum_banks": self.psum_banks,
            "partitions": self.partitions,
            "dma_engines": self.dma_engines,
            "dma_queues_per_engine": self.dma_queues_per_engine,
            # a transfer's fixed cost: its descriptors' generation, then trigger to first byte
            "dma_fixed_ns": self.dma_issue_ns + self.dma_fixed_ns,
            "clocks_ghz": {
                "tensor": self.te_clock_ghz,
                "vector": self.vector_clock_ghz,
                "scalar": self.scalar_clock_ghz,
                "gpsimd": self.gpsimd_clock_ghz,
            },
            "vector_lanes": {"16bit": self.vector_lanes_16bit, "other": self.vector_lanes},
            "scalar_lanes": {"16bit": self.scalar_lanes_16bit, "other": self.scalar_lanes},
            "launch_latency_ns": self.launch_latency_ns,
            "host_launch_overhead_ns": self.host_launch_overhead_ns,
            "chip_hbm_bytes": self.chip_hbm_bytes,
            "chip_hbm_bytes_per_s": self.chip_hbm_bytes_per_ns * 1e9,
            "neuronlink_bytes_per_s": self.neuronlink_bytes_per_ns * 1e9,
        }


FP8_DTYPES = frozenset({"float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"})
HALF_DTYPES = frozenset({"bfloat16", "float16"})


def te_rate_factor(preset: HardwarePreset, dtype: str) -> float:
    """Tensor Engine throughput for `dtype` relative to BF16."""
    if dtype in HALF_DTYPES:
        return 1.0
    if dtype in FP8_DTYPES:
        return preset.te_fp8_speedup
    return 1.0 / preset.te_fp32_slowdown  # FP32 and anything else runs on the FP32 path


# Figures shared by all three generations (HARDWARE.md: "same" across the row).
_COMMON = {
    "partitions": 128,
    "te_rows": 128,
    "te_cols": 128,
    "te_fp32_slowdown": 4.0,
    "te_min_issue_cycles": 64,
    "te_moving_free_max": 512,
    "te_load_speedup": 4.0,
    "te_throttle_ramp_ns": 3000.0,
    # The throttle re-engages only after the Tensor Engine has been idle this long
    # (HARDWARE.md), not at every kernel start.
    "te_throttle_idle_ns": 3000.0,
    "engine_fixed_cycles": 100,
    "engine_access_cycles": 60,
    "gpsimd_cores": 8,
    "gpsimd_simd_bits": 512,
    "psum_bytes": 2 * MiB,
    "psum_banks": 8,
    "dma_engines": 16,
    "dma_queues_per_engine": 16,
    # A DMA engine's cost per descriptor (one contiguous row): the NKI DMA overview's
    # profile of a [128, 128] bf16 load on trn2 shows each engine's 2 KiB (8 rows x 256 B)
    # taking 97 ns, of which 89 ns is 2 KiB at 23 B/ns: about 1 ns per descriptor.
    "dma_descriptor_ns": 1.0,
    # Software DGE (descriptors written by GpSimd, as in the DMA overview's examples,
    # triggered from qGpSimdDynamic): fitted to the overview's throughput curve of [128, F]
    # loads (relative 0.10 / 0.21 / 0.42 / 0.81 / 0.97 at F = 256 B .. 4 KiB), which is
    # flat in time per transfer (~860 ns on trn2) until the data phase takes longer:
    # 128 descriptors x 8 cycles at 1.2 GHz = 853 ns.
    "swdge_descriptor_cycles": 8.0,
    "dma_saturation_bytes": 4 * KiB,
    "sbuf_to_hbm_bandwidth_ratio": 20.0,
    # A kernel's descriptors reach the engines a couple of microseconds after the
    # runtime call returns; no published figure, a modelling choice.
    "launch_latency_ns": 2_000,
    # Published traces of single NKI kernels on trn1 show 40-60 us of host overhead per
    # launch; 50 us is used for every generation (no later figure is published).
    "host_launch_overhead_ns": 50_000,
    # Host fallback: PCIe Gen4/5 x16 class link and a host memory rate; modelling choices.
    "host_link_bytes_per_ns": 25.0,
    "host_fallback_fixed_ns": 20_000,
    "host_compute_bytes_per_ns": 10.0,
}


def _preset(**kw: Any) -> HardwarePreset:
    fields: dict[str, Any] = dict(_COMMON)
    fields.update(kw)
    cores = fields["cores_per_chip"]
    fields["hbm_bytes"] = fields["chip_hbm_bytes"] // cores
    fields["hbm_bytes_per_ns"] = fields["chip_hbm_bytes_per_ns"] / cores
    return HardwarePreset(**fields)


PRESETS: dict[str, HardwarePreset] = {
    "trn1": _preset(
        name="trn1",
        chip_name="Trainium",
        core_name="NeuronCore-v2",
        cores_per_chip=2,
        te_clock_ghz=2.8,  # 2 * 128 * 128 * 2.8 GHz = 91.8 TFLOPS BF16
        te_fp8_speedup=1.0,  # FP8 runs at the BF16 rate on NeuronCore-v2
        te_throttle_start=1.0,  # throttling is documented for trn2/trn3 only
        vector_clock_ghz=1.12,
        vector_lanes=128,
        vector_lanes_16bit=128,
        scalar_clock_ghz=1.4,
        scalar_lanes=128,
        scalar_lanes_16bit=128,
        gpsimd_clock_ghz=1.4,
        sbuf_bytes=24 * MiB,
        # 272 GB/s per core, the DMA bandwidth guide's sustained per-engine figure. The
        # NKI DMA overview gives 27.2 GB/s for NeuronCore-v2 and -v3 alike, but its own
        # trn2 profile moves 32 KiB in 1416 ns on one engine (23.1 B/ns): the guide's
        # NeuronCore-v3 figure, not 27.2. So the guide's 17 B/ns is kept for v2, and a
        # streaming kernel on trn1 is capped at 272 GB/s, below the core's 410 GB/s of HBM.
        dma_engine_bytes_per_ns=17.0,
        # NeuronCore-v2 has no DGE block (hardware DGE needs NeuronCore-v3, NKI DGE
        # reference): descriptors are pre-computed in HBM, so an instruction waits for
        # no generator, and its start latency is the DMA bandwidth guide's ~1300 ns
        # (descriptor fetch, synchronisation, semaphore to start).
        dma_issue_ns=0.0,
        dma_fixed_ns=1300.0,
        # Efficiency by contiguous bytes per descriptor row, calibrated on AWS's measured
        # NKI matmul tutorial (bf16 [4096,8192]@[8192,8192]): its unoptimised versions load
        # 128-partition tiles with 256 B and 1 KiB rows and reach 100-104 GB/s (0.37 of
        # 272) whatever the row size in that range and whatever the count of transfers
        # (the tiled version issues twice as many as hoist_load for 25% more bytes); the
        # guides say >= 2 KiB "approaches peak" and >= 4 KiB saturates. Below 256 B a row
        # is overhead-bound (proportional).
        dma_efficiency_curve=((256, 0.37), (1 * KiB, 0.37), (2 * KiB, 0.70), (4 * KiB, 1.0)),
        chip_hbm_bytes=32 * GiB,
        chip_hbm_bytes_per_ns=820.0,
        neuronlink_bytes_per_ns=384.0,
    ),
    "trn2": _preset(
        name="trn2",
        chip_name="Trainium2",
        core_name="NeuronCore-v3",
        cores_per_chip=8,
        te_clock_ghz=2.4,  # 2 * 128 * 128 * 2.4 GHz = 78.6 TFLOPS BF16
        te_fp8_speedup=2.0,  # 158 TFLOPS FP8
        te_throttle_start=0.5,
        vector_clock_ghz=0.96,
        vector_lanes=256,
        vector_lanes_16bit=512,
        scalar_clock_ghz=1.2,
        scalar_lanes=128,
        scalar_lanes_16bit=128,
        gpsimd_clock_ghz=1.2,
        sbuf_bytes=28 * MiB,
        dma_engine_bytes_per_ns=23.0,  # 368 GB/s per core
        # Hardware DGE: "each hardware-DGE DMA instruction takes approximately 600 ns"
        # (NKI DGE reference; NeuronCore-v3 and later). The kernel-optimisation tutorial's
        # fp32 tiled matmul on trn2 (39.9 ms) issues two loads per 853 ns matmul and runs
        # at 1.22 us per pair: one DGE issuing its loads back to back.
        dma_issue_ns=600.0,
        # Trigger to completion of the DMA overview's [128, 128] bf16 load is about 1.2 us,
        # 97 ns of it the data phase: 1.1 us from trigger to first byte (the DMA bandwidth
        # guide rounds descriptor setup, synchronisation and semaphore-to-start to ~1300).
        dma_fixed_ns=1100.0,
        # A single transfer of 256 B rows moves at the engine's full rate (97 ns for 2 KiB,
        # DMA overview); what the guides call small-transfer inefficiency is the cost of
        # each instruction (DGE) and descriptor, not the data phase. Below 256 B a row
        # is overhead-bound (proportional).
        dma_efficiency_curve=((256, 1.0),),
        chip_hbm_bytes=96 * GiB,
        # The Trainium2 guide says 2.9 TB/s, another guide 3 TB/s: 2.9 TB/s is used
        # (362.5 GB/s per core).
        chip_hbm_bytes_per_ns=2900.0,
        neuronlink_bytes_per_ns=1280.0,
    ),
    "trn3": _preset(
        name="trn3",
        chip_name="Trainium3",
        core_name="NeuronCore-v4",
        cores_per_chip=8,
        te_clock_ghz=2.4,
        te_fp8_speedup=4.0,  # 315 TFLOPS MXFP8
        te_throttle_start=0.5,
        vector_clock_ghz=1.2,
        vector_lanes=256,
        vector_lanes_16bit=512,
        scalar_clock_ghz=1.2,
        scalar_lanes=128,
        scalar_lanes_16bit=256,
        gpsimd_clock_ghz=1.2,
        sbuf_bytes=32 * MiB,
        dma_engine_bytes_per_ns=33.0,  # 528 GB/s per core
        # No Trainium3 DMA timings are published: trn2's DGE, latency and row efficiency.
        dma_issue_ns=600.0,
        dma_fixed_ns=1100.0,
        dma_efficiency_curve=((256, 1.0),),
        chip_hbm_bytes=144 * GiB,
        # The Trainium3 guide says 4.9 TB/s, another guide 4.7 TB/s: 4.9 TB/s is used.
        chip_hbm_bytes_per_ns=4900.0,
        neuronlink_bytes_per_ns=2560.0,
    ),
}


DEFAULT_PRESET = "trn2"  # what a process gets with NEURON_HARDWARE unset


def get_preset(name: str) -> HardwarePreset:
    """The preset called `name` (a key of PRESETS); UnknownPresetError otherwise."""
    try:
        return PRESETS[name]
    except (KeyError, TypeError):
        raise UnknownPresetError(str(name)) from None


# --- interconnect (collectives between NeuronCores, chips and instances) ---------------
# One contained block: the distributed backend's cost model reads these and nothing else.
# Published figures, with their sources:
# - NeuronLink, chip to chip (HARDWARE.md, from the Trainium/Trainium2/Trainium3
#   architecture guides): `neuronlink_bytes_per_ns` above. A ring step leaving a chip is
#   charged at the chip's NeuronLink figure (Neuron's collectives drive every link of the
#   chip at once).
# - Chips per instance: trn1.32xlarge has 16 Trainium chips joined as a 2D torus by
#   NeuronLink-v2 (AWS Trn1 instance page, "Trainium architecture" guide); trn2.48xlarge has
#   16 Trainium2 chips in a 2D torus of NeuronLink-v3 (Trainium2 architecture guide);
#   a Trn3 UltraServer joins up to 144 Trainium3 chips through NeuronSwitch (AWS Trn3
#   announcement, December 2025), modelled as one 144-chip instance.
# - EFA between instances: trn1.32xlarge 800 Gbps (100 GB/s), trn2.48xlarge 3.2 Tbps
#   (400 GB/s) (AWS EC2 instance pages). No per-instance EFA figure is published for Trn3
#   here: trn2's 3.2 Tbps is used.
# Measured, on trn1 (AWS's nccom-test user guide, examples run on trn1.32xlarge: the page
# covers trn1 and inf2, its 32-rank example needs trn1.32xlarge's 32 NeuronCores and its
# two-instance example is Trainium only; tests/hardware/published.py lists each point):
# - two ranks (the two NeuronCores of one chip) all-reduce in 58 us whatever the size up to
#   256 KiB: a collective's start (56 us) and two ring steps between the cores (1 us each,
#   a modelling choice that cannot be told apart from the start);
# - their 1 GiB fp32 all-reduce takes 18.93 ms and a 32 MiB uint8 one 768 us: 61 GB/s
#   between the cores of a chip, far below the 272 GB/s of the DMA engines, and 105
#   elements reduced per ns, which makes a narrow dtype slower per byte;
# - 32 ranks (16 chips) all-gather in about 150 us up to 512 KiB: 3.4 us a NeuronLink step;
# - 64 ranks on two instances all-reduce 8-128 B in 520 us (a tree of 12 steps: 39 us an
#   EFA step) and 128 MiB-1 GiB at 47 GiB/s of bus bandwidth: 55 GB/s per instance, a
#   little over half of its 800 Gbps.
# trn2 and trn3 have no published collective timings: their core and EFA links are their
# nominal figures (DMA bandwidth, EFA) scaled by the fraction trn1 reaches of its own, and
# they share trn1's start, step latencies and reduction rate.
_TRN1_CORE_LINK = 61.0  # GB/s, two cores of one chip (nccom-test)
_TRN1_EFA_LINK = 55.4  # GB/s per instance (nccom-test, two instances)
_CORE_LINK_SHARE = _TRN1_CORE_LINK / PRESETS["trn1"].dma_bytes_per_ns
_EFA_SHARE = _TRN1_EFA_LINK / 100.0  # of trn1.32xlarge's 800 Gbps


@dataclass(frozen=True)
class InterconnectFigures:
    """The links a collective of one preset can use, slowest tier last."""

    chips_per_instance: int
    topology: str  # how the chips of an instance are joined
    core_link_bytes_per_ns: float  # between the cores of one chip, in a collective
    instance_link_bytes_per_ns: float  # EFA per instance, in a collective
    reduce_elements_per_ns: float  # elements a reducing collective combines per ns
    core_step_ns: int  # latency of one algorithm step between cores of one chip
    chip_step_ns: int  # ... between chips (one NeuronLink hop)
    instance_step_ns: int  # ... between instances (EFA)
    collective_start_ns: int  # fixed cost of starting a collective


def _interconnect(name: str, chips: int, topology: str, efa_bytes_per_ns: float
                  ) -> InterconnectFigures:
    return InterconnectFigures(
        chips, topology, _CORE_LINK_SHARE * PRESETS[name].dma_bytes_per_ns,
        _EFA_SHARE * efa_bytes_per_ns, 104.6, 1_000, 3_400, 38_700, 56_000)


INTERCONNECTS: dict[str, InterconnectFigures] = {
    "trn1": _interconnect("trn1", 16, "2D torus (NeuronLink-v2)", 100.0),
    "trn2": _interconnect("trn2", 16, "2D torus (NeuronLink-v3)", 400.0),
    "trn3": _interconnect("trn3", 144, "NeuronSwitch (UltraServer)", 400.0),
}


def interconnect_for(preset: HardwarePreset) -> InterconnectFigures:
    """The interconnect figures of a preset's chips and instances."""
    return INTERCONNECTS[preset.name]
