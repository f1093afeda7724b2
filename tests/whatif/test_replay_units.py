"""The pieces of the what-if replay, without recording anything."""

from __future__ import annotations

from pathlib import Path

import neuron_explorer
import numpy as np
import pytest
import torch
from neuron_explorer import whatif
from neuron_explorer.backend import devices, runtime
from neuron_explorer.backend.mixed_precision import with_dtype
from neuron_explorer.backend.replay import (
    HostEvent,
    HostShift,
    ReplayOptions,
    lower_key,
    replay,
)
from neuron_explorer.collectors.device_sink import DeviceSink
from neuron_explorer.common.op_key_codec import decode
from neuron_explorer.what_if.replay import WhatIfError

SAMPLES = Path(__file__).parents[2] / "sample_traces"
REAL = Path(__file__).parents[1] / "data" / "real_traces"


def _args_of(key: tuple) -> dict:
    """The op slice args the device sink writes for an eager op with this runtime key."""
    shapes = tuple(tuple(s) for s, _ in key[1])
    dtypes = tuple(str(d).removeprefix("torch.") for _, d in key[1])
    _, args = DeviceSink._op_args((key[0], shapes, dtypes, 0, 0, "", "", False, 0, None,
                                   key[2:], ()))
    return args


@pytest.mark.parametrize("key", [
    ("aten::addmm", ((torch.Size([64]), torch.float32), (torch.Size([8, 32]), torch.float32),
                     (torch.Size([32, 64]), torch.float32)),
     ((torch.Size([8, 64]), torch.float32),), ()),
    ("aten::sum", ((torch.Size([4, 5]), torch.bfloat16),), ((torch.Size([4]), torch.bfloat16),),
     (("dim", (1,)), ("keepdim", False))),
    ("aten::_to_copy", ((torch.Size([3]), torch.int64),), ((torch.Size([3]), torch.int64),),
     (("direction", "host_to_device"),)),
    ("aten::empty", (), ((torch.Size([0, 2]), torch.float32),), ()),
])
def test_op_key_round_trips_through_the_slice_args(key):
    args = _args_of(key)
    name, ins, outs, attrs = decode(key[0], args["shapes"], args["dtypes"], args["key"])
    assert name == key[0]
    assert ins == tuple((tuple(s), str(d).removeprefix("torch.")) for s, d in key[1])
    assert outs == tuple((tuple(s), str(d).removeprefix("torch.")) for s, d in key[2])
    assert attrs == key[3]
    assert len(args["key"]) < 80  # compact: one short string per op


def test_replayed_key_lowers_to_the_runtimes_kernel():
    """The replay's lowering of a decoded key is the live runtime's, duration and all."""
    key = ("aten::mm", ((torch.Size([128, 256]), torch.float32),
                        (torch.Size([256, 512]), torch.float32)),
           ((torch.Size([128, 512]), torch.float32),), ())
    live = runtime.lower(devices.get(0), key).kernel
    args = _args_of(key)
    kernel, fallback = lower_key(decode(key[0], args["shapes"], args["dtypes"], args["key"]),
                                 devices.preset())
    assert not fallback
    assert (kernel.name, kernel.duration_ns, kernel.hbm_bytes) == (
        live.name, live.duration_ns, live.hbm_bytes)


def test_bf16_changes_matmuls_only():
    mm = ("aten::mm", (((64, 64), "float32"), ((64, 64), "float32")), (((64, 64), "float32"),), ())
    add = ("aten::add", (((64, 64), "float32"),) * 2, (((64, 64), "float32"),), ())
    assert with_dtype(mm, "bf16")[1][0][1] == "bfloat16"
    assert with_dtype(mm, "fp8")[1][0][1] == "float8_e4m3fn"
    assert with_dtype(mm, "fp8")[2][0][1] == "bfloat16"
    assert with_dtype(add, "bf16") == add and with_dtype(mm, None) == mm


def test_host_shift_moves_later_times_and_collapses_graph_spans():
    shift = HostShift(np.array([100, 300]), np.array([50, -20]))
    assert shift(np.array([0, 100, 150, 300, 400])).tolist() == [0, 150, 200, 330, 430]
    collapsed = HostShift(np.array([500]), np.array([-300]), collapsed=[(100, 500)])
    assert collapsed(np.array([50, 100, 300, 500, 600])).tolist() == [50, 100, 100, 200, 300]


def test_sync_waits_for_the_new_device_and_launches_pay_the_new_overhead():
    mm = ("aten::mm", (((1024, 1024), "float32"),) * 2, (((1024, 1024), "float32"),), ())
    events = [HostEvent(0, 50_000, 0, mm), HostEvent(60_000, 0, 0, None)]
    options = ReplayOptions("trn1", launch_overhead_ns=10_000)
    (op, sync), shift = replay(events, options)
    assert op.dur == 10_000 and op.kernels[0].launch_ns == 10_000
    assert sync.ts == 20_000  # 40 us earlier: the launch got shorter
    assert sync.ts + sync.dur == op.kernels[0].end_ns  # the host waits for the kernel
    assert shift(np.array([59_000]))[0] == 19_000  # before the sync: moved by the launch
    assert shift(np.array([60_000]))[0] == sync.ts + sync.dur  # at it: after the wait


def test_trace_from_before_op_keys():
    old = Path(__file__).resolve().parents[1] / "data" / "before_op_keys.pftrace"
    with pytest.raises(WhatIfError, match="before op slices carried op keys"):
        whatif(old, "trn3")


def test_kineto_trace_is_refused():
    with pytest.raises(WhatIfError, match="Kineto"):
        whatif(REAL / "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz", "trn3")


def test_bad_options_are_refused():
    with pytest.raises(WhatIfError, match="unknown hardware"):
        whatif(SAMPLES / "mlp_eager.pftrace", "trn9")
    with pytest.raises(WhatIfError, match="unknown mode"):
        whatif(SAMPLES / "mlp_eager.pftrace", mode="lazy")


@pytest.mark.parametrize("name", ["mlp_eager", "gpt_compiled", "item_in_loop", "serve"])
def test_a_replay_of_nothing_removed_times_the_steps_as_the_report_does(name: str) -> None:
    """A claim is the report's total less the replay's, so the replay's timing of the
    recording itself must be the report's `total_ns`: counting the last step's device
    work past its window too, a compiled CNN's fused optimizer was claimed 635 us where
    the fix's analysed steps took 739 us less."""
    from neuron_explorer.what_if.counterfactual import _replayed_span

    trace = neuron_explorer.load(SAMPLES / f"{name}.pftrace")
    replayed = _replayed_span(trace, "as recorded", np.zeros(0, np.int64))
    assert replayed == trace.summary()["total_ns"]


@pytest.mark.parametrize(("saved", "expected"), [
    ([300, 200, 200, 200], 100),  # the first step saves 100 more: a state made once
    ([-300, 200, 200, 200], -500),  # 500 less: it had no wait from the step before
    ([210, 200, 200, 195], 0),  # under a tenth of the saving apart: steps alike
])
def test_the_first_steps_difference_is_told_either_way(saved: list[int],
                                                       expected: int) -> None:
    """Of a replay's per-step savings, what the first analysed step saves more or less
    than the others. Only more was told: a compiled LSTM's first step after its compile
    had no `.item()` wait from the step before, and the syncs were claimed 57 us a step
    where each later step saved 138."""
    from neuron_explorer.memo import memoised
    from neuron_explorer.what_if.counterfactual import first_step_extra_ns

    trace = neuron_explorer.load(SAMPLES / "mlp_eager.pftrace")
    recorded = np.full(4, 1000.0)
    memoised(trace, "counterfactual:as recorded", lambda: (recorded.sum(), recorded))
    steps = recorded - np.asarray(saved, np.float64)  # each step's replayed length
    memoised(trace, "counterfactual:cause", lambda: (steps.sum(), steps))
    assert first_step_extra_ns(trace, "cause") == expected
