"""The dashboard in headless Chromium: every page, a finding to its evidence, zoom, select, follow
flows, tables to timeline, compare, and bad input, all without a console error."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import pytest
from browser import browser_available, chromium, console_errors
from trace_files import load_trace, write_synthetic

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,  # a browser and a served dashboard: 65 s for the file in a CI run
    pytest.mark.skipif(not browser_available(),
                       reason="needs chromium and chromedriver (scripts/install_browser.sh)"),
]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from neuron_explorer.webapp.app import AppContext, create_app
    from neuron_explorer.webapp.server import DashboardServer
    from neuron_explorer.webapp.trace_store import TraceStore

    folder = tmp_path_factory.mktemp("traces")
    write_synthetic(folder / "run_a.pftrace")
    write_synthetic(folder / "run_b.pftrace", steps=4, ops=48, seed=1)
    (folder / "corrupt.json").write_bytes(b"\x00\x01 not a trace")
    store = TraceStore(folder, max_upload_bytes=1 << 20)
    server = DashboardServer(create_app(AppContext(store)).server).start()
    yield server.url.rstrip("/"), folder
    server.stop()
    store.close()


@pytest.fixture(scope="module")
def driver():
    with chromium() as d:
        yield d


def wait_for(driver, css: str, timeout: float = 10.0, text: str | None = None):
    """The first element matching `css` (and containing `text`) once it shows up."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for element in driver.find_elements(By.CSS_SELECTOR, css):
            with contextlib.suppress(StaleElementReferenceException):  # re-rendered under us
                if element.is_displayed() and (text is None or text in element.text):
                    return element
        time.sleep(0.1)
    raise AssertionError(f"{css!r} {'with ' + repr(text) if text else ''} did not appear; page: "
                         f"{driver.find_element(By.TAG_NAME, 'body').text[:500]}")


def x_range(driver, timeout: float = 10.0) -> list[float]:
    """The timeline's x range once the graph is drawn."""
    script = ("const g = document.querySelector('#timeline-graph .js-plotly-plot');"
              "return g && g.layout && g.layout.xaxis ? g.layout.xaxis.range : null;")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = driver.execute_script(script)
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("the timeline graph was not drawn")


def no_console_errors(driver, refused: str | None = None) -> None:
    """No console error, except the browser's note of a request the server refused on purpose."""
    errors = [e for e in console_errors(driver)
              if not (refused and refused in e and "status of 4" in e)]
    assert not errors, errors


def test_every_page_loads_without_console_errors(served, driver):
    url, _ = served
    pages = {"/": "Findings", "/timeline": "Zoom in", "/tables": "Ops (",
             "/engines": "Utilisation over time", "/roofline": "Ops against the roofline",
             "/memory": "HBM in use", "/compile": "torch.compile",
             "/compare": "Pick a second trace"}
    for path, marker in pages.items():
        driver.get(f"{url}{path}?trace=run_a.pftrace")
        wait_for(driver, "#page", text=marker)
        no_console_errors(driver)
        fetched = driver.execute_script(
            "return performance.getEntriesByType('resource').map(e => e.name);")
        # offline: nothing external
        assert fetched and all(u.startswith(url) for u in fetched), fetched


def test_finding_opens_the_timeline_at_its_evidence(served, driver):
    url, _ = served
    driver.get(f"{url}/?trace=run_a.pftrace")
    card = wait_for(driver, ".finding", text="Host waits on the device")
    card.find_element("css selector", ".finding-link").click()
    # the page changes once the server has the timeline's first view of the trace (its
    # index): beside the suite's other worker recording a program, over 10 s once
    details = wait_for(driver, "#slice-fields", text="sync", timeout=30)
    assert "aten::item" in details.text and "train.py:50" in details.text
    assert "/timeline" in driver.current_url
    no_console_errors(driver)


def test_zoom_select_and_follow_flows(served, driver):
    from selenium.webdriver.common.by import By

    url, _ = served
    driver.get(f"{url}/timeline?trace=run_a.pftrace")
    status = wait_for(driver, "#timeline-status", text="window").text
    before = x_range(driver)
    wait_for(driver, "#timeline-graph g.trace.bars")
    wait_for(driver, "#timeline-zoom-in").click()
    wait_for(driver, "#timeline-status", text="window", timeout=10)
    for _ in range(100):
        after = x_range(driver)
        if after != before:
            break
        time.sleep(0.1)
    assert after != before, (status, driver.find_element(By.ID, "timeline-status").text,
                             console_errors(driver))
    assert (after[1] - after[0]) == pytest.approx((before[1] - before[0]) / 2, rel=0.01)
    bars = driver.find_elements(By.CSS_SELECTOR, "#timeline-graph g.trace.bars g.point path")
    assert bars, "no bars"
    from selenium.webdriver.common.action_chains import ActionChains

    # Plotly listens on its drag layer: hover the bar's spot, then click there
    target = _bar_of_category(driver, "op")
    ActionChains(driver).move_to_element(target).pause(0.3).click().perform()
    wait_for(driver, "#slice-fields", text="op_id")
    # follow the flow op -> kernel, then kernel -> instruction, then back
    wait_for(driver, ".link-button", text="leads to kernel").click()
    wait_for(driver, "#slice-fields", text="kernel")
    wait_for(driver, ".link-button", text="leads to instruction").click()
    wait_for(driver, "#slice-fields", text="instruction")
    wait_for(driver, ".link-button", text="comes from kernel").click()
    wait_for(driver, "#slice-fields", text="kernel_")
    no_console_errors(driver)


def _bar_of_category(driver, category: str):
    """A visible bar of the trace named `category` (Plotly draws one trace per category)."""
    from selenium.webdriver.common.by import By

    names = driver.execute_script(
        "return document.querySelector('#timeline-graph .js-plotly-plot').data.map(t => t.name);")
    index = names.index(category)
    traces = driver.find_elements(By.CSS_SELECTOR, "#timeline-graph g.trace.bars")
    points = traces[index].find_elements(By.CSS_SELECTOR, "g.point path")
    return points[len(points) // 2]


def grid_column(driver, grid: str, column: str, until, timeout: float = 10.0) -> list[str]:
    """The shown cells of a grid's column, top to bottom, once `until(cells)` holds. AG Grid
    sorts by moving rows on screen (their order in the DOM is not the order shown) and fades
    filtered-out rows before it removes them; a row not yet drawn reads as ''."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    cells: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(StaleElementReferenceException):  # re-rendered under us
            rows = driver.find_elements(
                By.CSS_SELECTOR, f"#{grid} .ag-center-cols-container .ag-row:not(.ag-opacity-zero)")
            rows.sort(key=lambda row: int(row.get_attribute("row-index")))
            cells = [row.find_element(By.CSS_SELECTOR, f'.ag-cell[col-id="{column}"]').text
                     for row in rows]
            if cells and all(cells) and until(cells):
                return cells
        time.sleep(0.1)
    raise AssertionError(f"{grid}'s {column} column shows {cells}")


def test_table_row_opens_in_the_timeline(served, driver):
    url, _ = served
    driver.get(f"{url}/tables?trace=run_a.pftrace")
    search = wait_for(driver, "#tables-search")
    search.send_keys("addmm\n")  # the search box filters the table to matching names
    names = grid_column(driver, "stats-table", "name", lambda names: "aten::add" not in names)
    assert names == ["aten::addmm"]
    row = wait_for(driver, "#stats-table .ag-row:not(.ag-opacity-zero)", text="aten::addmm")
    row.find_element("css selector", ".ag-selection-checkbox").click()
    wait_for(driver, "#tables-open-timeline").click()
    fields = wait_for(driver, "#slice-fields", text="op", timeout=30)  # as from a finding
    assert "aten::addmm" in fields.text
    no_console_errors(driver)


def test_table_sorts_filters_and_exports_what_it_shows(served, driver, tmp_path):
    """A header click sorts, the box under a number's header keeps rows at or above it (and
    the name search keeps that filter), and Export CSV writes the rows shown, full numbers
    under the headers shown."""
    import csv

    url, folder = served
    driver.execute_cdp_cmd("Browser.setDownloadBehavior",
                           {"behavior": "allow", "downloadPath": str(tmp_path)})
    driver.get(f"{url}/tables?trace=run_a.pftrace")
    first = [int(c) for c in grid_column(driver, "stats-table", "count", lambda cells: True)]
    assert first != sorted(first)  # opened by share of the step, not by count
    wait_for(driver, '#stats-table .ag-header-cell[col-id="count"] .ag-header-cell-label').click()
    grid_column(driver, "stats-table", "count",
                lambda cells: [int(c) for c in cells] == sorted(first))
    floor = sorted(first)[len(first) // 2]
    wait_for(driver, '#stats-table .ag-floating-filter[col-id="count"] input').send_keys(str(floor))
    kept = [c for c in sorted(first) if c >= floor]
    grid_column(driver, "stats-table", "count", lambda cells: [int(c) for c in cells] == kept)
    wait_for(driver, "#tables-search").send_keys("m\n")
    names = grid_column(driver, "stats-table", "name", lambda cells: all("m" in n for n in cells))
    counts = [int(c) for c in grid_column(driver, "stats-table", "count", lambda cells: True)]
    assert counts and all(c >= floor for c in counts) and counts == sorted(counts)

    wait_for(driver, 'button.grid-export[data-grid="stats-table"]').click()
    exported = tmp_path / "stats-table.csv"
    deadline = time.monotonic() + 10
    while not exported.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert exported.exists(), "Export CSV wrote no file"
    rows = list(csv.DictReader(exported.read_text(encoding="utf-8-sig").splitlines()))
    assert [r["name"] for r in rows] == names and [int(r["count"]) for r in rows] == counts
    ops = load_trace(folder / "run_a.pftrace").op_stats().set_index("name")
    device_us = [ops.loc[name, "device_ns"] / 1e3 for name in names]
    # the file has the full µs, the cells show them to 0.1 µs ("131.8")
    assert [float(r["device (µs)"]) for r in rows] == pytest.approx(device_us)
    shown = grid_column(driver, "stats-table", "device_us", lambda cells: True)
    assert shown == [f"{us:,.1f}" for us in device_us]
    no_console_errors(driver)


def test_compare_two_traces(served, driver):
    from selenium.webdriver.common.by import By

    url, _ = served
    driver.get(f"{url}/compare?trace=run_a.pftrace")
    wait_for(driver, "#compare-other").click()
    # the options open in a portal, outside the dropdown
    option = wait_for(driver, ".dash-dropdown-options [role=option]", text="run_b.pftrace")
    option.click()
    table = wait_for(driver, ".compare-table", text="run_b.pftrace")
    assert "step time" in table.text
    assert driver.find_elements(By.CSS_SELECTOR, "#diff-ops")
    no_console_errors(driver)


def test_bad_traces_show_a_banner_and_the_app_keeps_working(served, driver):
    url, folder = served
    driver.get(f"{url}/?trace=corrupt.json")
    banner = wait_for(driver, ".error-banner", text="corrupt.json")
    assert "cannot read trace" in banner.text
    for evil in ("../../../../etc/passwd", "/etc/passwd", str(Path(folder).parent / "x.json")):
        driver.get(f"{url}/timeline?trace={evil}")
        banner = wait_for(driver, ".error-banner", text="served folder")
        assert "root:x:0:0" not in driver.page_source
    # an upload of a foreign file is refused the same way, and the page still works after it
    bad = Path(folder).parent / "foreign.json"
    bad.write_text('{"not": "a trace"}')
    driver.find_element("css selector", "#trace-upload input[type=file]").send_keys(str(bad))
    wait_for(driver, ".error-banner", text="foreign.json")
    driver.get(f"{url}/?trace=run_b.pftrace")
    wait_for(driver, ".finding")
    assert not driver.find_elements("css selector", ".error-banner")
    no_console_errors(driver, refused="/_upload")


def test_an_upload_over_the_limit_is_refused_with_a_message(served, driver, tmp_path):
    url, _ = served
    big = tmp_path / "huge.json"
    big.write_bytes(b" " * (3 << 20 >> 1))  # 1.5 MiB, over the 1 MiB limit of this server
    driver.get(f"{url}/?trace=run_a.pftrace")
    wait_for(driver, "#page .metrics")
    driver.find_element("css selector", "#trace-upload input[type=file]").send_keys(str(big))
    toast = wait_for(driver, "#upload-toast", text="upload limit")
    assert "huge.json is 1.5 MiB" in toast.text
    assert "upload:huge.json" not in driver.page_source
    no_console_errors(driver)


def test_upload_opens_the_trace(served, driver, tmp_path):
    url, _ = served
    good = write_synthetic(tmp_path / "uploaded_run.pftrace", steps=2, ops=16)
    driver.get(f"{url}/?trace=run_a.pftrace")
    wait_for(driver, ".finding")
    driver.find_element("css selector", "#trace-upload input[type=file]").send_keys(str(good))
    wait_for(driver, ".page-subtitle", text="upload:uploaded_run.pftrace")
    wait_for(driver, ".finding")
    no_console_errors(driver)


@pytest.mark.slow
def test_a_recorded_trace_from_finding_to_evidence(recorded_demo, driver):
    """The real thing: the demo's trace, its first finding, the slice it points at, every page."""
    from neuron_explorer.webapp.view_command import start_dashboard

    server, store = start_dashboard(recorded_demo, port=0)
    try:
        url = server.url.rstrip("/")
        driver.get(f"{url}/?trace={recorded_demo.name}")
        wait_for(driver, "#overview-findings .finding", timeout=30).find_element(
            "css selector", ".finding-link").click()
        # an idle gap's kernel
        wait_for(driver, "#slice-fields", timeout=20, text="category kernel")
        assert "/timeline" in driver.current_url and "select=" in driver.current_url
        # back to the op that launched it
        wait_for(driver, ".link-button", text="comes from op").click()
        wait_for(driver, "#slice-fields", text="category op")
        rows = ("return document.querySelector('#timeline-graph .js-plotly-plot')"
                ".layout.yaxis.ticktext.length;")
        folded = driver.execute_script(rows)
        driver.execute_script("window.scrollTo(0, 0);")  # the sticky header must not cover the box
        wait_for(driver, "#timeline-dma input").click()  # unfold the DMA queues
        for _ in range(100):
            if driver.execute_script(rows) > folded:
                break
            time.sleep(0.1)
        assert driver.execute_script(rows) > folded + 1
        for path in ("/tables", "/engines", "/roofline", "/memory", "/compile"):
            driver.get(f"{url}{path}?trace={recorded_demo.name}")
            wait_for(driver, ".panel", timeout=20)
            assert not driver.find_elements("css selector", ".error-banner")
        no_console_errors(driver)
    finally:
        server.stop()
        store.close()


def test_view_of_one_trace_opens_it_without_asking(served, driver):
    from neuron_explorer.webapp.view_command import start_dashboard

    _, folder = served
    server, store = start_dashboard(Path(folder) / "run_b.pftrace", port=0, loader=load_trace)
    try:
        driver.get(server.url)
        wait_for(driver, "#page .metrics")
        assert "trace=run_b.pftrace" in driver.current_url
        wait_for(driver, ".trace-picker", text="run_b.pftrace")
        no_console_errors(driver)
    finally:
        server.stop()
        store.close()
