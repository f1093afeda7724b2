"""examples/ddp.py and examples/fsdp.py give the losses of the same script on CPU + gloo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
IN_TURN = Path(__file__).with_name("examples_in_turn.py")
STEPS = {"ddp.py": 20, "fsdp.py": 8}

pytestmark = pytest.mark.slow  # four runs of two ranks each, in one launch


@pytest.fixture(scope="module")
def losses(tmp_path_factory) -> dict[tuple[str, str], list[float]]:
    """Rank 0's losses of each script on each device. One torchrun launch runs the four in
    turn (`examples_in_turn.py`), each script in a process group and store of its own:
    the ranks' imports are paid once, not four times. The CPU runs go first, so that no
    state the device's runs leave in the process can reach the reference."""
    folder = tmp_path_factory.mktemp("losses")
    runs = {(script, device): folder / f"{script}.{device}.json"
            for device in ("cpu", "neuron") for script in STEPS}
    words: list[str] = []
    for (script, device), out in runs.items():
        if words:
            words.append(";;")
        words += [str(EXAMPLES / script), "--device", device, "--steps", str(STEPS[script]),
                  "--losses", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", str(IN_TURN),
         *words],
        capture_output=True, text=True, timeout=400, check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return {run: json.loads(out.read_text()) for run, out in runs.items()}


@pytest.mark.parametrize("script", list(STEPS))
def test_losses_equal_cpu_with_gloo(losses, script):
    neuron, cpu = losses[script, "neuron"], losses[script, "cpu"]
    assert len(neuron) == len(cpu) == STEPS[script]
    assert max(abs(a - b) for a, b in zip(neuron, cpu, strict=True)) <= 1e-5
