"""A program that raises in its first step: on the modelled clock, which counts no
compiling, a failed torch.compile leaves a step of 0 ns. Its report ranked the model's
upload as a bottleneck (a small-DMA finding of "0.0% of the analysed steps") beside a step
time of 0 ns; now it says the steps ran nothing, and why."""

from __future__ import annotations

import os

import neuron_explorer
from cli_runner import run_cli, run_command

CRASHES = """
import torch


def broken_backend(gm, example_inputs):
    raise RuntimeError("this backend cannot compile")


# many small weights: their uploads are small transfers, which a finding once ranked
model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(24)]).to("neuron").eval()
compiled = torch.compile(model, backend=broken_backend)
with torch.no_grad():
    for _ in range(4):
        print(compiled(torch.randn(8, 16, device="neuron")).sum().item())
"""


def test_a_run_that_crashed_before_any_step_ran_work_has_no_findings(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_HOST_CLOCK", "modelled")
    script = tmp_path / "crashes.py"
    script.write_text(CRASHES)
    out = tmp_path / "crashes.pftrace"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("NEURON_EXPLORER_RECORD", None)
    done = run_command("record", "-o", str(out), "--", "python", str(script), cwd=tmp_path,
                       env=env)
    assert done.returncode == 1, done.stderr[-2000:]
    trace = neuron_explorer.load(out)
    assert trace.steps["dur"].tolist() == [0]  # the premise: one step, of no length
    assert not trace.bottlenecks()
    report = run_cli("report", str(out), cwd=tmp_path)
    assert "program             exited with code 1" in report
    assert ("findings: the analysed steps ran for 0 ns (the program exited with code 1 "
            "before any step ran work): no cause to weigh") in report
