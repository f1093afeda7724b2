"""The Compare page's what-if control renders a prediction of a real recording."""

from __future__ import annotations

import json
import shutil

import plotly.io.json as pio_json
import pytest
from neuron_explorer.trace_diff import diff
from neuron_explorer.webapp.app import AppContext
from neuron_explorer.webapp.pages import compare
from neuron_explorer.webapp.trace_store import TraceStore
from neuron_explorer.webapp.whatif_control import prediction

pytestmark = pytest.mark.slow  # records a workload in its own process


def _text(component) -> str:
    return json.dumps(json.loads(pio_json.to_json_plotly(component)))


def test_control_shows_the_predicted_breakdown_and_diff(recordings, tmp_path):
    shutil.copy(recordings("device_bound", "trn1"), tmp_path / "run.pftrace")
    store = TraceStore(tmp_path)
    try:
        ctx = AppContext(store, differ=diff)
        page = _text(compare.layout(store.get("run.pftrace"), "run.pftrace", {}, ctx))
        assert "whatif-run" in page
        shown = _text(prediction(ctx, "run.pftrace", "trn3", "eager", "bf16"))
        assert "What if: time per step" in shown and "predicted (trn3, eager, bf16)" in shown
        assert "Could not predict" not in shown
        refused = _text(prediction(ctx, "run.pftrace", "trn3", "eager", "int4"))
        assert "unknown dtype" in refused
    finally:
        store.close()
