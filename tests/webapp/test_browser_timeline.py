"""The timeline in headless Chromium on a recorded trace (#12 item 6): it opens on the recorded
steps, finds slices by name, moves with W/A/S/D and the arrows, names its rows and its colours."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from browser import browser_available, chromium, console_errors
from test_browser import wait_for, x_range

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not browser_available(),
                       reason="needs chromium and chromedriver (scripts/install_browser.sh)"),
]

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "mlp_eager.pftrace"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from neuron_explorer.webapp.view_command import start_dashboard

    folder = tmp_path_factory.mktemp("recorded")
    shutil.copy(SAMPLE, folder / SAMPLE.name)
    server, store = start_dashboard(folder / SAMPLE.name, port=0)
    yield server.url.rstrip("/"), store
    server.stop()
    store.close()


@pytest.fixture(scope="module")
def driver():
    with chromium() as d:
        yield d


def _open(driver, url: str) -> list[float]:
    driver.get(f"{url}/timeline?trace={SAMPLE.name}")
    wait_for(driver, "#timeline-graph g.trace.bars", timeout=30)
    return x_range(driver)


def _changed(driver, before: list[float], timeout: float = 15.0) -> list[float]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = x_range(driver)
        if now != before:
            return now
        time.sleep(0.1)
    raise AssertionError(
        f"the window did not move from {before}; console: {console_errors(driver)}")


def _whole_and_steps_us(store) -> tuple[float, float, float, float]:
    from neuron_explorer.webapp.pages.timeline import timeline_index

    trace = store.get(SAMPLE.name)
    index = timeline_index(store, SAMPLE.name)
    steps = trace.steps
    origin = index.start_ns
    lo, hi = int(steps["ts"].min()), int((steps["ts"] + steps["dur"]).max())
    return 0.0, (index.end_ns - origin) / 1e3, (lo - origin) / 1e3, (hi - origin) / 1e3


def test_the_timeline_opens_on_the_recorded_steps(served, driver):
    url, store = served
    shown = _open(driver, url)
    _, whole, lo, hi = _whole_and_steps_us(store)
    assert shown[0] <= lo and shown[1] >= hi  # every step is in view
    assert (shown[1] - shown[0]) <= 1.1 * (hi - lo)  # and the view is about the steps, not the run
    assert (hi - lo) < 0.2 * whole  # this recording has far more than its steps
    wait_for(driver, "#timeline-reset").click()
    everything = _changed(driver, shown)
    assert everything[1] - everything[0] == pytest.approx(whole, rel=0.01)
    wait_for(driver, "#timeline-steps").click()
    assert _changed(driver, everything) == pytest.approx(shown, rel=1e-6)


def test_keys_zoom_and_pan_as_in_perfetto(served, driver):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    url, _ = served
    start = _open(driver, url)
    width = start[1] - start[0]
    keys = ActionChains(driver)
    keys.send_keys("w").perform()
    zoomed = _changed(driver, start)
    assert zoomed[1] - zoomed[0] == pytest.approx(width / 2, rel=0.01)
    keys.send_keys("d").perform()
    right = _changed(driver, zoomed)
    assert right[0] > zoomed[0] and right[1] - right[0] == pytest.approx(width / 2, rel=0.01)
    ActionChains(driver).send_keys(Keys.ARROW_LEFT).perform()
    left = _changed(driver, right)
    assert left == pytest.approx(zoomed, rel=1e-6)
    ActionChains(driver).send_keys("s").perform()
    assert _changed(driver, left)[1] - _changed(driver, left)[0] == pytest.approx(width, rel=0.01)
    # typing in the search box does not move the timeline
    box = wait_for(driver, "#timeline-search")
    box.send_keys("wasd")
    time.sleep(1)
    now = x_range(driver)
    assert now[1] - now[0] == pytest.approx(width, rel=0.01)
    box.clear()
    assert not console_errors(driver)


def test_search_jumps_to_each_match_and_shows_it(served, driver):
    url, store = served
    trace = store.get(SAMPLE.name)
    mm = trace.table("slices")[trace.table("slices")["name"] == "aten::mm"].sort_values("ts")
    assert len(mm) > 2
    _open(driver, url)
    box = wait_for(driver, "#timeline-search")
    box.send_keys("ATEN::MM\n")  # any case
    first_status = wait_for(driver, "#timeline-search-status", text="matches", timeout=15).text
    count = int(first_status.split(" of ", 1)[1].split()[0].replace(",", ""))
    assert first_status.startswith("1 of ") and count >= len(mm)
    details = wait_for(driver, "#timeline-details h2", timeout=15)
    assert "mm" in details.text.lower()
    shown = x_range(driver)
    origin = _whole_and_steps_us(store)[2] - (int(trace.steps["ts"].min()) / 1e3)  # µs of ns 0
    first = mm.iloc[0]
    assert shown[0] <= origin + first["ts"] / 1e3 <= shown[1]  # the first match is in view
    wait_for(driver, "#timeline-search-next").click()
    wait_for(driver, "#timeline-search-status", text="2 of ", timeout=15)
    wait_for(driver, "#timeline-search-prev").click()
    wait_for(driver, "#timeline-search-status", text="1 of ", timeout=15)
    assert shown[1] - shown[0] < 1e5  # zoomed to the match (µs), not the whole run
    box.clear()
    box.send_keys("no-such-slice-anywhere\n")
    wait_for(driver, "#timeline-search-status", text="No slice named like", timeout=15)
    assert not console_errors(driver)


def test_nested_rows_are_labelled_and_every_category_has_its_own_colour(served, driver):
    url, _ = served
    _open(driver, url)
    ticks = driver.execute_script(
        "return document.querySelector('#timeline-graph .js-plotly-plot').layout.yaxis.ticktext;")
    assert ticks[0] == "MainThread" and all(t for t in ticks), ticks
    nested = [t for t in ticks if t.startswith("↳ ")]
    assert len(nested) >= 3 and any("op" in t for t in nested), ticks
    items = driver.find_elements("css selector", "#timeline-legend .legend-item")
    names = [i.text for i in items]
    colours = [i.find_element("css selector", ".swatch").value_of_css_property("background-color")
               for i in items]
    assert {"step", "op", "module", "kernel", "instruction", "dma"} <= set(names)
    assert len(set(colours)) == len(colours), dict(zip(names, colours, strict=True))
    bars = driver.execute_script(
        "return document.querySelector('#timeline-graph .js-plotly-plot').data"
        ".filter(t => t.type === 'bar').map(t => [t.name, t.marker.color]);")
    assert "merged (narrower than a pixel)" in names
    assert {name for name, _ in bars} - {"merged"} <= set(names)  # every colour drawn is explained
