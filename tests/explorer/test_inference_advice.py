"""Advice fits the run: a run without an optimizer (inference, serving) gets no advice about
optimizers, FP32 master weights, gradients or activations kept for backward; a training
run keeps it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import neuron_explorer
import pytest
from cli_runner import run_cli

SAMPLES = Path(__file__).parents[2] / "sample_traces"
TRAINING_WORDS = re.compile(r"optimizer|master cop|gradient|checkpoint", re.IGNORECASE)

INFER = '''
import torch
from torch import nn

device = torch.device("neuron")
total = torch.neuron.get_device_properties(device).total_memory
# a KV cache reserving 90% of HBM, as a server sizes it up front
cache = torch.empty(int(total * 0.9) // 2, dtype=torch.bfloat16, device=device)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(2048, 4096), nn.GELU(), nn.Linear(4096, 2048)).to(device).eval()
x = torch.randn(512, 2048).to(device)
with torch.inference_mode():
    for _ in range(4):
        model(x).sum().item()
'''


def _advice(findings: list) -> str:
    return " ".join(f.title + " " + f.explanation + " " + f.recommendation for f in findings)


@pytest.mark.slow
def test_an_inference_run_gets_no_training_advice(tmp_path: Path) -> None:
    script = tmp_path / "infer.py"
    script.write_text(INFER)
    out = tmp_path / "infer.pftrace"
    for args in (["record", "--level", "op", "-o", str(out), "--", "python", str(script)],
                 ["report", str(out)]):
        run_cli(*args, cwd=tmp_path, modelled=True)
    report = json.loads(run_cli("report", "--format", "json", str(out), cwd=tmp_path,
                                modelled=True))
    fired = {f["rule_id"] for f in report["findings"]}
    # the fp32 matmuls and the full HBM are still found, with advice for inference
    assert {"fp32_matmul", "memory_near_capacity"} <= fired
    assert not TRAINING_WORDS.search(json.dumps(report["findings"]))
    findings = neuron_explorer.load(out).bottlenecks()
    fp32 = next(f for f in findings if f.rule_id == "fp32_matmul")
    assert "model.to(torch.bfloat16)" in fp32.recommendation
    memory = next(f for f in findings if f.rule_id == "memory_near_capacity")
    assert "torch.neuron.mem_get_info()" in memory.recommendation
    assert not TRAINING_WORDS.search(_advice(findings))


@pytest.mark.parametrize("name", ["generate.pftrace", "serve.pftrace"])
def test_generation_and_serving_samples_get_no_training_advice(name: str) -> None:
    findings = neuron_explorer.load(SAMPLES / name).bottlenecks()
    assert findings  # host_bound and short_kernel_sequence among them: their advice too
    assert not TRAINING_WORDS.search(_advice(findings)), _advice(findings)


def test_training_runs_keep_the_optimizer_advice() -> None:
    fp32 = next(f for f in neuron_explorer.load(SAMPLES / "fp32_matmul.pftrace").bottlenecks()
                if f.rule_id == "fp32_matmul")
    # a master copy, said how: autocast keeps one; a bf16 model needs an optimizer's own
    assert "autocast keeps the weights in FP32, the FP32 master copy of weights" in \
        fp32.recommendation
    memory = next(f for f in neuron_explorer.load(SAMPLES / "near_memory.pftrace").bottlenecks()
                  if f.rule_id == "memory_near_capacity")
    assert "gradient accumulation" in memory.recommendation


def test_an_inference_loop_reading_each_result_is_told_when_to_keep_the_read() -> None:
    """An inference loop that reads each step's result once (a decode loop's token, a
    batch's predictions) was told only to read after the loop, which would hold a server's
    every answer to the end: the advice says which fix fits which use."""
    (f,) = [f for f in neuron_explorer.load(SAMPLES / "generate.pftrace").bottlenecks()
            if f.rule_id == "sync_in_step"]
    assert f.recommendation.startswith("Each step reads its result ("), f.recommendation
    assert "(offline inference), remove the sync at " in f.recommendation
    # the host waited 44 us at these reads in all, of 1.34 ms: hiding them hides nothing
    assert "(a server), keep that read; the host waited 43.9 us" in f.recommendation
    (f,) = [f for f in neuron_explorer.load(SAMPLES / "item_in_loop.pftrace").bottlenecks()
            if f.rule_id == "sync_in_step"]  # training: read the losses less often
    assert "read losses and metrics (.item(), .cpu(), print) every N steps" in f.recommendation
