"""`neuron-explorer demo` records the reference MLP into a real trace the dashboard opens."""

from __future__ import annotations

import json

import plotly.io.json as pio_json
import pytest
from neuron_explorer.webapp.app import PAGES
from neuron_explorer.webapp.pages import overview
from neuron_explorer.webapp.view_command import start_dashboard

pytestmark = pytest.mark.slow


def test_demo_trace_opens_on_every_page(recorded_demo):
    server, store = start_dashboard(recorded_demo, port=0)
    try:
        from neuron_explorer.webapp.app import AppContext

        ctx = AppContext(store)
        name = recorded_demo.name
        trace = store.get(name)
        for page in PAGES:
            layout = page.layout(trace, name, {}, ctx)
            text = json.dumps(json.loads(pio_json.to_json_plotly(layout)))
            assert "Could not compute" not in text, page.TITLE
        cards = json.dumps(json.loads(pio_json.to_json_plotly(overview.findings(trace, name))))
        assert "host" in cards.lower() and "/timeline?trace=" in cards  # eager MLP: host-bound
    finally:
        server.stop()
        store.close()


def test_demo_reports_a_folder_it_cannot_create(tmp_path):
    from neuron_explorer.common.errors import NeuronExplorerError
    from neuron_explorer.webapp.demo_command import record_demo

    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(NeuronExplorerError, match="--output-dir"):
        record_demo(blocker / "demo")
