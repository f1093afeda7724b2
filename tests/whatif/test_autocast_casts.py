"""A bf16 what-if of float32 matmuls includes the casts autocast adds around them. Without
them, `whatif --dtype bf16` of an eager CNN predicted 484 us a step less device time and
`fp32_matmul` advised autocast, while the run under autocast measured 203 us a step more
(its 31 casts a step cost 627 us)."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
from neuron_explorer.backend.hardware import DeviceTimeline
from neuron_explorer.backend.replay import (
    HostEvent,
    ReplayOptions,
    autocast_casts,
    lower_key,
    replay_one,
)

CONV = ("aten::convolution", (((64, 48, 32, 32), "float32"), ((48, 48, 3, 3), "float32")),
        (((64, 48, 32, 32), "float32"),), (("stride", (1, 1)), ("padding", (1, 1))))
CONV_BACKWARD = ("aten::convolution_backward",
                 (((64, 48, 32, 32), "float32"), ((64, 48, 32, 32), "float32"),
                  ((48, 48, 3, 3), "float32")),
                 (((64, 48, 32, 32), "float32"), ((48, 48, 3, 3), "float32")), ())


def test_autocast_casts_a_forward_matmuls_inputs_down_and_its_output_up() -> None:
    casts = autocast_casts(CONV, "bf16")
    assert [(c[1][0][1], c[2][0][1]) for c in casts] == [
        ("float32", "bfloat16"), ("float32", "bfloat16"), ("bfloat16", "float32")]
    assert [c[1][0][0] for c in casts] == [(64, 48, 32, 32), (48, 48, 3, 3), (64, 48, 32, 32)]
    assert autocast_casts(CONV, None) == []
    assert autocast_casts(("aten::relu", CONV[1][:1], CONV[2], ()), "bf16") == []


def test_in_the_backward_only_the_incoming_gradient_is_cast_down() -> None:
    casts = autocast_casts(CONV_BACKWARD, "bf16", backward=True)
    assert [c[1][0] for c in casts] == [((64, 48, 32, 32), "float32"),
                                        ((64, 48, 32, 32), "bfloat16"),
                                        ((48, 48, 3, 3), "bfloat16")]


def test_a_bf16_replay_launches_the_casts_before_the_matmul() -> None:
    options = ReplayOptions("trn2", dtype="bf16")
    preset = options.preset()
    new = replay_one(HostEvent(0, 50_000, 0, CONV), 0, DeviceTimeline(preset), options, preset)
    assert len(new.kernels) == 4 and new.kernels[-1].kernel.name.startswith("convolution")
    assert new.dur == 4 * preset.host_launch_overhead_ns
    casts = sum(lower_key(c, preset)[0].duration_ns for c in autocast_casts(CONV, "bf16"))
    plain = replay_one(HostEvent(0, 50_000, 0, CONV), 0, DeviceTimeline(preset),
                       ReplayOptions("trn2"), preset)
    assert new.kernels[-1].end_ns - new.kernels[0].start_ns >= casts
    assert plain.dur == preset.host_launch_overhead_ns and len(plain.kernels) == 1


def test_a_compiled_graphs_saving_stops_at_its_other_engines_busy_time() -> None:
    """A compiled CNN's backward graph: 2.51 ms, 1.23 ms of it on the Tensor Engine but
    2.13 ms of DMA: at the BF16 rate it can shorten by 0.38 ms, not 0.92 ms. A graph the
    Tensor Engine sets keeps the rate's saving down to its DMA time."""
    from neuron_explorer.rules.fp32_matmul import _compiled_saving_ns

    kernels = pd.DataFrame({"id": [1, 2], "dur": [2_511_000, 7_602_000],
                            "busy_tensor": [1_226_000, 5_053_000],
                            "busy_vector": [600_000, 900_000], "busy_scalar": [0, 0],
                            "busy_gpsimd": [0, 0], "busy_dma": [2_130_000, 4_542_000]})
    trace = SimpleNamespace(kernels=kernels)
    inside = pd.DataFrame({"id": [1], "device_dur": [1_226_000]})
    assert _compiled_saving_ns(trace, inside, 4.0) == 2_511_000 - 2_130_000
    inside = pd.DataFrame({"id": [2], "device_dur": [5_053_000]})
    assert _compiled_saving_ns(trace, inside, 4.0) == 7_602_000 - 4_542_000
    assert _compiled_saving_ns(trace, inside.iloc[:0], 4.0) == 0.0
