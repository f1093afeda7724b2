"""`converted_uploads`: a request's NumPy images (float64) uploaded and converted to float32
on the device. The copy moves twice the bytes and the conversion is one more op a
request; a trial's CNN lost 4% of each request to it and no finding said so."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import median_step, record_variants
from neuron_explorer import load

pytestmark = pytest.mark.slow
PROGRAM = Path(__file__).parent / "programs" / "cnn_serve.py"



def test_converting_on_the_host_saves_what_the_finding_claims(tmp_path) -> None:
    paths = record_variants(tmp_path, PROGRAM, {
        "on_device": ["--eval", "--float64"], "on_host": ["--eval", "--float64-on-host"]},
        modelled=True)
    on_device, on_host = load(paths["on_device"]), load(paths["on_host"])
    (f,) = [f for f in on_device.bottlenecks() if f.rule_id == "converted_uploads"]
    assert f.title == "Uploads converted on the device (float64 -> float32)"
    assert "cnn_serve.py:" in f.recommendation and "np.float32" in f.recommendation
    saved = median_step(on_device) - median_step(on_host)
    assert saved > 0
    assert f.time_lost_ns / f.steps == pytest.approx(saved, rel=0.15)
    assert not [f for f in on_host.bottlenecks() if f.rule_id == "converted_uploads"]
