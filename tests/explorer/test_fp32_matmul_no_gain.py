"""fp32_matmul stays silent where its own what-if replay says bf16 would not help: tiny
matmuls (a LoRA adapter's rank-4 products) are bound by fixed costs and DMA, and the
finding said "0 ns lost ... predicts -43.5 us less device time" before."""

from __future__ import annotations

from pathlib import Path

import neuron_explorer
import pytest
import torch
from neuron_explorer.rules import fp32_matmul
from neuron_explorer.rules.host_bound import is_host_bound
from neuron_explorer.what_if.lower_precision import predicted_bf16_saving_ns


def _record(tmp_path: Path, inner: int, rows: int = 64,
            dtype: torch.dtype = torch.float32) -> neuron_explorer.Trace:
    torch.manual_seed(0)
    x = torch.randn(rows, rows, device="neuron", dtype=dtype)
    down = torch.randn(rows, inner, device="neuron", dtype=dtype)
    path = tmp_path / f"mm{inner}_{str(dtype).removeprefix('torch.')}.pftrace"
    with neuron_explorer.record(path, level="op", quiet=True):
        for _ in range(4):
            for _ in range(20):
                x.matmul(down).sum().item()
            neuron_explorer.step()
    return neuron_explorer.load(path, cache=False)


def _fp32_findings(trace: neuron_explorer.Trace) -> list:
    return fp32_matmul.check(trace)


def test_no_finding_when_the_bf16_replay_saves_nothing(tmp_path: Path) -> None:
    trace = _record(tmp_path, inner=4)
    ops = trace.ops
    mm = ops[ops["name"] == "aten::mm"]
    saving = predicted_bf16_saving_ns(trace, mm["id"].to_numpy())
    assert saving is not None and saving < 0.05 * mm["device_dur"].sum()  # the premise
    assert _fp32_findings(trace) == []


def test_matmuls_that_gain_from_bf16_are_still_flagged(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """[1024, 1024] @ [1024, 1024]: the replay predicts bf16 saves about a fifth of the
    matmuls' device time, autocast's casts of both inputs and the output included. (A
    [128, 128] @ [128, 1024] product gains 24% at the BF16 rate but its three casts cost
    twice its time: autocast makes it slower. A [64, 64] @ [64, 1024] product gained 2%:
    its time is the transfers' fixed cost, which bf16 does not shorten.) But each cast is
    also an op the host launches: in this loop, which reads a result every matmul, the
    host's casts outweigh the device's gain (recorded under autocast: 5.6 ms a step
    before, 9.1 ms after). This loop trains nothing, so its tensors can be made bfloat16
    whole, without a cast: the finding states that saving, which a recording of the loop in
    bfloat16 measures.

    Recorded on the modelled host clock: on the measured one the loop's launch gaps (3-7 ms
    of a 22-27 ms window, from one recording to the next on a busy machine) put the run on
    either side of the host-bound rule's bound, and on a host-bound run the finding rightly
    reads as what comes after that fix instead."""
    monkeypatch.setenv("NEURON_HOST_CLOCK", "modelled")
    trace = _record(tmp_path, inner=1024, rows=1024)
    assert not is_host_bound(trace)  # the premise
    findings = _fp32_findings(trace)
    assert len(findings) == 1 and "predicts" in findings[0].explanation
    (f,) = findings
    assert "can be cast to bfloat16 whole" in f.explanation
    bf16 = _record(tmp_path, inner=1024, rows=1024, dtype=torch.bfloat16)
    saved = trace.summary()["step_time_ns"] - bf16.summary()["step_time_ns"]
    assert f.time_lost_ns / f.steps == pytest.approx(saved, rel=0.15), (f.time_lost_ns, saved)
