"""An eager NKI kernel costs the host what a real stack charges: a compile on the first
call of each signature (a `neuron_compile` span), then one launch per call. Tracing and
simulating the kernel is the emulator's work, never the program's host time."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import neuron_explorer
import numpy as np
import pytest
import torch
from neuron_explorer import nki
from neuron_explorer.backend.hardware import get_preset
from neuron_explorer.nki import launch as nki_launch

# an example kernel over many row tiles, so that its simulation takes milliseconds
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "nki"))
from norms import softmax

ROWS, WIDTH, CALLS, STEPS = 128 * 24, 256, 3, 4


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_HOST_CLOCK", "modelled")
    # the kernel's first call compiles, as in a new process: not if another test in this
    # one already called it at these shapes
    monkeypatch.setattr(nki_launch, "_compiled", set())
    path = tmp_path / "nki.pftrace"
    with neuron_explorer.record(path, quiet=True):
        x = torch.randn(ROWS, WIDTH).to("neuron")
        for _ in range(STEPS):
            for _ in range(CALLS):
                softmax(x)
            neuron_explorer.step()
        torch.neuron.synchronize()
    return neuron_explorer.load(path)


def test_the_first_call_compiles_once_and_later_calls_only_launch(recorded):
    slices = recorded.slices
    compiles = slices[slices["name"].str.startswith("nki::softmax (")]
    assert len(compiles) == 1, compiles[["name", "ts", "dur"]]
    assert compiles.iloc[0]["category"] == "compile"
    ops = recorded.ops.sort_values("ts")
    nki_ops = ops[ops["name"] == "nki::softmax"]
    assert len(nki_ops) == CALLS * STEPS
    launch_ns = get_preset("trn2").host_launch_overhead_ns
    # Between two launches of the kernel the host does nothing but the next launch's
    # own per-op charge: the gap is the modelled Python of one op, never a simulation.
    starts = nki_ops["ts"].to_numpy()
    gaps = np.diff(starts)[1:]  # after the first (compiling) call
    from neuron_explorer.backend.host_costs import BACKEND_OP_NS, MODELLED_PYTHON_PER_OP_NS
    per_call = launch_ns + MODELLED_PYTHON_PER_OP_NS + BACKEND_OP_NS
    assert gaps.max() <= per_call, (gaps, per_call)


def test_a_real_measured_clock_charges_no_simulation(tmp_path):
    a = torch.randn(ROWS, WIDTH)
    start = time.perf_counter_ns()
    nki.simulate_kernel(softmax, a.numpy())
    simulation_ns = time.perf_counter_ns() - start
    path = tmp_path / "measured.pftrace"
    with neuron_explorer.record(path, quiet=True):
        x = a.to("neuron")
        softmax(x)  # compiles
        neuron_explorer.step()
        for _ in range(CALLS):
            softmax(x)
        neuron_explorer.step()
        torch.neuron.synchronize()
    trace = neuron_explorer.load(path)
    steps = trace.steps.sort_values("ts")
    later = steps.iloc[1]
    # Three calls, each simulated for `simulation_ns` in this process: the step charges
    # three launches and the host's own Python, far below a single simulation.
    assert later["dur"] < simulation_ns / 2, (later["dur"], simulation_ns)


def test_a_kernel_call_costs_the_measured_host_what_an_aten_ops_launch_costs(tmp_path):
    """On the measured clock, a later call's checks, input copies and the freeing of its
    trace are the emulator's too: they once charged this kernel 200-300 us a call more
    than an aten op's launch, growing with the kernel's size."""
    path = tmp_path / "measured.pftrace"
    with neuron_explorer.record(path, level="op", quiet=True):
        x = torch.randn(ROWS, WIDTH).to("neuron")
        softmax(x)  # compiles
        neuron_explorer.step()
        for _ in range(3):
            for _ in range(8):
                softmax(x)
            for _ in range(8):
                torch.add(x, 1.0)
            neuron_explorer.step()
        torch.neuron.synchronize()
    ops = neuron_explorer.load(path).ops
    ops = ops[ops["step"] > 0].sort_values("ts")

    def per_call(name: str) -> float:  # from one call's start to the next's, in a run
        mine = ops["name"].to_numpy() == name
        starts = ops["ts"].to_numpy()
        pairs = mine[:-1] & mine[1:]
        return float(np.median(np.diff(starts)[pairs]))

    kernel, aten = per_call("nki::softmax"), per_call("aten::add")
    # was 4.3x; under 1.5x on a quiet machine, 1.52x and 1.58x in two runs of the whole
    # suite beside this file on 2026-12-07 (the measured clock's inflation after the
    # emulator's memory traffic, docs/recording.md)
    assert kernel < 2 * aten, (kernel, aten)
