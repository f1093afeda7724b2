"""A bf16 what-if of float32 matmuls includes the casts autocast adds, and runs the ops
around them in the dtypes autocast gives them (backend/mixed_precision.py). Without
them, `whatif --dtype bf16` of an eager CNN predicted 484 us a step less device time and
`fp32_matmul` advised autocast, while the run under autocast measured 203 us a step more
(its 31 casts a step cost 627 us)."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
from neuron_explorer.backend.hardware import DeviceTimeline
from neuron_explorer.backend.mixed_precision import autocast_casts, with_dtype
from neuron_explorer.backend.replay import HostEvent, ReplayOptions, lower_key, replay_one

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


def test_a_bf16_replay_launches_the_casts_around_the_matmul() -> None:
    preset = ReplayOptions("trn2").preset()
    down, up = autocast_casts(CONV, "bf16")[:2], autocast_casts(CONV, "bf16")[2:]
    event = HostEvent(0, 50_000, 0, with_dtype(CONV, "bf16"), casts_before=tuple(down),
                      casts_after=tuple(up))
    new = replay_one(event, 0, DeviceTimeline(preset), preset)
    assert len(new.kernels) == 4 and new.kernels[2].kernel.name.startswith("convolution")
    assert new.dur == 4 * preset.host_launch_overhead_ns
    casts = sum(lower_key(c, preset)[0].duration_ns for c in autocast_casts(CONV, "bf16"))
    plain = replay_one(HostEvent(0, 50_000, 0, CONV), 0, DeviceTimeline(preset), preset)
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
    # the estimate, where the backend did not build the program cast whole to bf16
    def saved(inside: pd.DataFrame) -> tuple[dict, int]:
        per_run, timed = _compiled_saving_ns(trace, inside, 4.0, False)
        return per_run.to_dict(), timed

    assert saved(inside) == ({1: 2_511_000 - 2_130_000}, 0)
    inside = pd.DataFrame({"id": [2], "device_dur": [5_053_000]})
    assert saved(inside) == ({2: 7_602_000 - 4_542_000}, 0)
    assert saved(inside.iloc[:0]) == ({}, 0)


def _key(name: str, inputs: list, outputs: list) -> tuple:
    return (name, tuple((s, d) for s, d in inputs), tuple((s, d) for s, d in outputs), ())


def test_autocast_carries_each_tensors_dtype_along_the_data_flow() -> None:
    """Forward: the matmul's float32 inputs cast down; the GELU after it runs in bf16 (no
    casts around it); softmax, a float32 op, casts its input back up; a subtraction of its
    float32 output and a bf16 value runs in float32, reading each as it is."""
    from neuron_explorer.backend.mixed_precision import plan

    x, b, h = (8, 16), (32,), (8, 32)
    f32 = "float32"
    keys = [
        _key("aten::addmm", [(b, f32), (x, f32), ((16, 32), f32)], [(h, f32)]),
        _key("aten::gelu", [(h, f32)], [(h, f32)]),
        _key("aten::_softmax", [(h, f32)], [(h, f32)]),
        _key("aten::sub", [(h, f32), (h, f32)], [(h, f32)]),
    ]
    producers = [(-1, -1, -1), (0,), (1,), (2, 1)]
    readers = {0: {1}, 1: {2, 3}, 2: {3}}
    addmm, gelu, softmax, sub = plan(keys, [False] * 4, "bf16", producers, readers)
    assert [c[1][0] for c in addmm.before] == [(b, f32), (x, f32), ((16, 32), f32)]
    assert addmm.key[2] == ((h, "bfloat16"),)
    assert gelu.before == () and gelu.key[1:3] == (((h, "bfloat16"),), ((h, "bfloat16"),))
    assert [(c[1][0][1], c[2][0][1]) for c in softmax.before] == [("bfloat16", f32)]
    assert softmax.key[2] == ((h, f32),)
    assert sub.before == () and sub.key[1] == ((h, f32), (h, "bfloat16"))
    assert sub.key[2] == ((h, f32),)


def test_a_gradient_is_cast_once_where_it_is_made_and_a_parameters_goes_back_up() -> None:
    """Backward of a bf16 linear layer whose output went into a float32 loss: the loss's
    float32 gradient is cast down once, before the first matmul that reads it (the bias's
    sum reads that cast too); the matmul reads the bf16 copies the forward saved, no casts;
    the weight's and the bias's gradients, read by no backward op, go back to float32."""
    from neuron_explorer.backend.mixed_precision import plan

    f32, bf = "float32", "bfloat16"
    x, h, wt = (8, 16), (8, 32), (32, 16)
    keys = [
        _key("aten::addmm", [((32,), f32), (x, f32), ((16, 32), f32)], [(h, f32)]),
        _key("aten::mse_loss", [(h, f32), (h, f32)], [((), f32)]),
        _key("aten::ones_like", [((), f32)], [((), f32)]),  # where backward() starts
        _key("aten::mse_loss_backward", [((), f32), (h, f32), (h, f32)], [(h, f32)]),
        _key("aten::mm", [(h[::-1], f32), (x, f32)], [(wt, f32)]),  # the weight's gradient
        _key("aten::sum", [(h, f32)], [((32,), f32)]),  # the bias's
    ]
    producers = [(-1, -1, -1), (0, -1), (1,), (2, 0, -1), (3, -1), (3,)]
    readers = {0: {1, 3}, 1: {2}, 2: {3}, 3: {4, 5}}
    backward = [False, False, False, True, True, True]
    _, loss, _, loss_back, mm, bias = plan(keys, backward, "bf16", producers, readers)
    assert [(c[1][0][1], c[2][0][1]) for c in loss.before] == [(bf, f32)]
    assert loss_back.before == () and loss_back.key[2] == ((h, f32),)  # its forward's float32
    assert [(c[1][0], c[2][0]) for c in mm.before] == [((h[::-1], f32), (h[::-1], bf))]
    assert mm.key[1] == ((h[::-1], bf), (x, bf))
    assert bias.before == () and bias.key[1] == ((h, bf),)
    assert [(c[1][0][1], c[2][0][1]) for c in mm.after] == [(bf, f32)]
    assert [(c[1][0][1], c[2][0][1]) for c in bias.after] == [(bf, f32)]


def test_a_tensor_an_op_without_a_key_made_keeps_its_recorded_dtype() -> None:
    """A collective (`c10d::all_reduce`: no op key) made what a later op reads: the plan
    takes it as recorded, float32, rather than failing on the missing key."""
    from neuron_explorer.backend.mixed_precision import plan

    f32, g = "float32", (32, 16)
    keys = [None, _key("aten::mul_", [(g, f32), ((), f32)], [(g, f32)])]
    planned = plan(keys, [True, True], "bf16", [(), (0, -1)], {0: {1}})
    assert planned[0] is None and planned[1].key == keys[1] and planned[1].before == ()
