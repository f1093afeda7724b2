"""The Kernel page on a recorded trace of the example NKI kernels
(sample_traces/nki_kernels.pftrace): the line profile next to the engine timeline, the
kernel picker, and a notice for traces without NKI kernels."""

from __future__ import annotations

import json
from pathlib import Path

import plotly.io.json as pio_json
import pytest
from browser import browser_available, chromium, console_errors
from neuron_explorer.webapp.app import AppContext
from neuron_explorer.webapp.pages import kernel
from neuron_explorer.webapp.trace_store import TraceStore

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "nki_kernels.pftrace"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The sample trace copied into a folder of its own (its source paths, recorded from
    sample_traces/, resolve under the working directory)."""
    folder = tmp_path_factory.mktemp("kernels")
    (folder / SAMPLE.name).write_bytes(SAMPLE.read_bytes())
    (folder / "other.pftrace").write_bytes(SAMPLE.with_name("odd_dims.pftrace").read_bytes())
    return folder


@pytest.fixture(scope="module")
def context(folder):
    store = TraceStore(folder)
    yield AppContext(store)
    store.close()


def _text(component) -> str:
    return json.dumps(json.loads(pio_json.to_json_plotly(component)))


def test_the_page_shows_each_line_with_its_engine_next_to_the_timeline(context):
    trace = context.store.get(SAMPLE.name)
    page = kernel.layout(trace, SAMPLE.name, {"kernel": "matmul_tiled"}, context)
    text = _text(page)
    assert '"value": "matmul_tiled"' in text and "matmul_fully_optimized" in text
    assert "nisa.nc_matmul(dst=res_psum" in text and "DMA bound" in text
    figure = json.loads(text)
    graphs = []
    stack = [figure]
    while stack:  # the kernel figure, wherever it sits in the layout
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("props", {}).get("id") == "kernel-figure":
                graphs.append(node["props"]["figure"])
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    (fig,) = graphs
    bars = [d for d in fig["data"] if d["type"] == "bar"]
    timeline = [d for d in fig["data"] if d.get("xaxis") == "x2"]
    assert {b["name"] for b in bars} == {"tensor", "vector", "dma"}
    assert any(y == "dma" for d in timeline for y in d["y"])
    assert any(y == "tensor" for d in timeline for y in d["y"])
    assert any("nisa.nc_matmul" in d["name"] for d in timeline)  # coloured by line


def test_a_trace_without_nki_kernels_says_how_to_get_them(context):
    text = _text(kernel.layout(context.store.get("other.pftrace"), "other.pftrace", {}, context))
    assert "No NKI kernel in this trace" in text and "--level engine" in text


@pytest.mark.slow  # a browser: 10 s in a CI run
@pytest.mark.browser
@pytest.mark.skipif(not browser_available(), reason="needs chromium and chromedriver")
def test_picking_a_kernel_in_the_browser(context):
    from neuron_explorer.webapp.app import create_app
    from neuron_explorer.webapp.server import DashboardServer
    from selenium.webdriver.common.by import By
    from test_browser import wait_for

    server = DashboardServer(create_app(context).server).start()
    try:
        with chromium() as driver:
            driver.get(f"{server.url.rstrip('/')}/kernel?trace={SAMPLE.name}")
            wait_for(driver, "#kernel-figure .js-plotly-plot", timeout=30)
            wait_for(driver, "#kernel-lines", text="nisa.nc_matmul", timeout=10)
            assert "DMA bound" in wait_for(driver, "#kernel-why").text
            drawn = driver.find_elements(By.CSS_SELECTOR, "#kernel-figure g.trace.bars")
            assert drawn, "the line profile's bars were not drawn"
            wait_for(driver, "#kernel-picker").click()
            wait_for(driver, ".dash-dropdown-options [role=option]",  # a portal
                     text="softmax").click()
            wait_for(driver, "#kernel-lines", text="nisa.activation(op=nl.exp", timeout=20)
            assert not console_errors(driver)
    finally:
        server.stop()
