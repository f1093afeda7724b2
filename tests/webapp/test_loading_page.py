"""The dashboard while a big trace loads (#16 item 5): `view` answers at once with a loading page
whose bar follows the loader's own progress, then shows the trace; a bad file still fails fast."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest
from browser import browser_available, chromium, console_errors
from dash_requests import request
from test_browser import wait_for

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "mlp_eager.pftrace"
STEPS = 4


class SlowLoader:
    """A loader that reports STEPS steps through the loader's progress bars and takes each
    only when the test lets it (a big trace's load, made slow and step by step)."""

    def __init__(self) -> None:
        self.gates = [threading.Event() for _ in range(STEPS)]

    def __call__(self, path: str):
        import neuron_explorer
        from neuron_explorer.progress import steps

        with steps(STEPS, f"loading {Path(path).name}", enabled=False) as bar:
            for gate in self.gates:
                assert gate.wait(60), "the test never let the load go on"
                bar.update()
        return neuron_explorer.load(path)

    def release(self, upto: int) -> None:
        for gate in self.gates[:upto]:
            gate.set()


@pytest.fixture
def slow_dashboard(tmp_path):
    from neuron_explorer.webapp.view_command import start_dashboard

    shutil.copy(SAMPLE, tmp_path / SAMPLE.name)
    loader = SlowLoader()
    started = time.monotonic()
    server, store = start_dashboard(tmp_path / SAMPLE.name, port=0, loader=loader)
    startup_s = time.monotonic() - started
    yield server, store, loader, startup_s
    loader.release(STEPS)
    server.stop()
    store.close()


def test_the_server_answers_while_the_trace_loads(slow_dashboard):
    server, store, loader, startup_s = slow_dashboard
    assert startup_s < 10  # it did not wait for the load (which waits for the test)
    progress = store.load_progress(SAMPLE.name)
    assert progress is not None and not progress.finished.is_set()
    status, _, body = request(server, "GET", "/")
    assert status == 200 and b"Neuron Explorer" in body
    loader.release(1)
    deadline = time.monotonic() + 10
    while progress.done < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (progress.done, progress.total) == (1, STEPS)
    assert progress.fraction() == pytest.approx(1 / STEPS)
    loader.release(STEPS)
    assert progress.finished.wait(30) and progress.error is None
    assert store.get(SAMPLE.name) is not None


def test_a_file_that_is_not_a_trace_still_fails_before_serving(tmp_path):
    from neuron_explorer.common.errors import NeuronExplorerError
    from neuron_explorer.webapp.view_command import start_dashboard

    bad = tmp_path / "bad.json"
    bad.write_bytes(b"\x00\x01garbage")
    with pytest.raises(NeuronExplorerError, match="bad.json"):
        start_dashboard(bad, port=0)


@pytest.mark.browser
@pytest.mark.skipif(not browser_available(),
                    reason="needs chromium and chromedriver (scripts/install_browser.sh)")
def test_the_page_shows_the_load_progress_then_the_trace(slow_dashboard):
    server, _, loader, _ = slow_dashboard
    with chromium() as driver:
        driver.get(server.url.rstrip("/") + f"/?trace={SAMPLE.name}")
        wait_for(driver, "#loading-bar", timeout=30)
        assert wait_for(driver, "#loading-text", text=f"0 of {STEPS}", timeout=15)
        loader.release(2)
        wait_for(driver, "#loading-text", text=f"2 of {STEPS}", timeout=15)
        width = driver.execute_script(
            "const f = document.querySelector('#loading-fill'); return f.style.width;")
        assert width == "50%"
        loader.release(STEPS)
        wait_for(driver, ".metric-value", timeout=30)  # the overview of the loaded trace
        assert not driver.find_elements("css selector", "#loading-bar")
        assert not console_errors(driver)
