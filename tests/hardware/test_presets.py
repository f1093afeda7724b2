"""Presets hold the published figures and derive peaks from array size x clock."""

from __future__ import annotations

import json

import pytest
from neuron_explorer.backend.hardware import PRESETS, UnknownPresetError, get_preset
from neuron_explorer.common.errors import NeuronExplorerError

GB = 1e9


def test_three_presets_with_chip_and_core_names():
    assert set(PRESETS) == {"trn1", "trn2", "trn3"}
    assert (get_preset("trn1").chip_name, get_preset("trn1").core_name) == (
        "Trainium", "NeuronCore-v2")
    assert (get_preset("trn2").chip_name, get_preset("trn2").core_name) == (
        "Trainium2", "NeuronCore-v3")
    assert (get_preset("trn3").chip_name, get_preset("trn3").core_name) == (
        "Trainium3", "NeuronCore-v4")
    assert [PRESETS[n].cores_per_chip for n in ("trn1", "trn2", "trn3")] == [2, 8, 8]


@pytest.mark.parametrize(
    ("name", "bf16_tflops", "fp8_tflops", "fp32_tflops"),
    [("trn1", 91.75, 91.75, 22.94), ("trn2", 78.64, 157.29, 19.66),
     ("trn3", 78.64, 314.57, 19.66)],
)
def test_tensor_engine_peaks_from_array_and_clock(name, bf16_tflops, fp8_tflops, fp32_tflops):
    p = get_preset(name)
    assert p.te_peak_flops("bfloat16") == pytest.approx(2 * 128 * 128 * p.te_clock_ghz * 1e9)
    assert p.te_peak_flops("bfloat16") / 1e12 == pytest.approx(bf16_tflops, rel=1e-3)
    assert p.te_peak_flops("float16") == p.te_peak_flops("bfloat16")
    assert p.te_peak_flops("float8_e4m3fn") / 1e12 == pytest.approx(fp8_tflops, rel=1e-3)
    assert p.te_peak_flops("float32") / 1e12 == pytest.approx(fp32_tflops, rel=1e-3)


@pytest.mark.parametrize(
    ("name", "hbm_gib", "hbm_gbs", "dma_gbs", "sbuf_mib"),
    [("trn1", 16, 410, 272, 24), ("trn2", 12, 362.5, 368, 28), ("trn3", 18, 612.5, 528, 32)],
)
def test_memory_figures_per_core(name, hbm_gib, hbm_gbs, dma_gbs, sbuf_mib):
    p = get_preset(name)
    assert p.hbm_bytes == hbm_gib * 2**30 == p.chip_hbm_bytes // p.cores_per_chip
    assert p.hbm_bytes_per_ns == pytest.approx(hbm_gbs)
    assert p.dma_bytes_per_ns == pytest.approx(dma_gbs)
    assert p.sbuf_bytes == sbuf_mib * 2**20
    assert p.psum_bytes == 2 * 2**20 and p.psum_banks == 8 and p.psum_bank_fp32 == 512
    assert p.dma_engines == 16 and p.dma_queues_per_engine == 16


def test_engine_lanes_and_clocks_differ_by_generation():
    trn1, trn2, trn3 = (get_preset(n) for n in ("trn1", "trn2", "trn3"))
    assert (trn1.vector_lanes_16bit, trn2.vector_lanes_16bit, trn3.vector_lanes_16bit) == (
        128, 512, 512)
    assert (trn1.vector_clock_ghz, trn2.vector_clock_ghz, trn3.vector_clock_ghz) == (
        1.12, 0.96, 1.2)
    assert trn3.scalar_lanes_16bit == 256 and trn2.scalar_lanes_16bit == 128
    assert trn1.te_throttle_start == 1.0 and trn2.te_throttle_start == 0.5


def test_figures_are_json_and_carry_the_peaks():
    p = get_preset("trn2")
    figures = json.loads(json.dumps(p.figures()))
    assert figures["preset"] == "trn2"
    assert figures["tensor_peak_flops"]["bfloat16"] == pytest.approx(p.te_peak_flops())
    assert figures["hbm_bytes_per_s"] == pytest.approx(362.5 * GB)
    assert figures["sbuf_bytes"] == p.sbuf_bytes and figures["psum_bytes"] == p.psum_bytes
    assert figures["clocks_ghz"]["tensor"] == 2.4
    assert figures["memory_bytes_per_s"] == pytest.approx(362.5 * GB)


def test_unknown_preset_names_the_valid_ones():
    with pytest.raises(UnknownPresetError) as info:
        get_preset("trn9")
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, NeuronExplorerError)
    message = str(info.value)
    assert "'trn9'" in message and "trn1, trn2, trn3" in message
