"""examples/ddp.py and examples/fsdp.py give the losses of the same script on CPU + gloo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

pytestmark = pytest.mark.slow  # four launches of two ranks each


def _losses(tmp_path: Path, script: str, device: str, steps: int) -> list[float]:
    out = tmp_path / f"{script}.{device}.json"
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
         str(EXAMPLES / script), "--device", device, "--steps", str(steps), "--losses", str(out)],
        capture_output=True, text=True, timeout=400, check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize(("script", "steps"), [("ddp.py", 20), ("fsdp.py", 8)])
def test_losses_equal_cpu_with_gloo(tmp_path, script, steps):
    neuron = _losses(tmp_path, script, "neuron", steps)
    cpu = _losses(tmp_path, script, "cpu", steps)
    assert len(neuron) == len(cpu) == steps
    assert max(abs(a - b) for a, b in zip(neuron, cpu, strict=True)) <= 1e-5
