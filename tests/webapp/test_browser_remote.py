"""A dashboard served with --allow-remote works in a browser once opened with its token, and
not without it (#20 item 2)."""

from __future__ import annotations

import pytest
from browser import browser_available, chromium, console_errors
from test_browser import wait_for
from trace_files import load_trace

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,  # its one test: 11-12 s in a CI run
    pytest.mark.skipif(not browser_available(),
                       reason="needs chromium and chromedriver (scripts/install_browser.sh)"),
]


def test_the_token_url_opens_every_page_and_no_token_opens_nothing(trace_folder):
    from neuron_explorer.webapp.view_command import start_dashboard

    server, store = start_dashboard(trace_folder, host="0.0.0.0", port=0, loader=load_trace,
                                    allow_remote=True)
    base = f"http://127.0.0.1:{server.port}"
    try:
        with chromium() as driver:
            driver.get(f"{base}/timeline?trace=run_a.pftrace")
            assert "needs its token" in driver.find_element("tag name", "body").text
            driver.get(f"{base}/timeline?trace=run_a.pftrace&token={server.token}")
            # a fresh browser's first page: its scripts parsed and the trace loaded, which
            # took over 20 s with the suite's other worker and two recordings beside it
            wait_for(driver, "#timeline-graph g.trace.bars", timeout=60)
            assert "token" not in driver.current_url  # swapped for a cookie
            wait_for(driver, "#timeline-zoom-in").click()  # a callback, with the cookie
            wait_for(driver, "#timeline-status", text="window")
            driver.get(f"{base}/?trace=run_a.pftrace")
            wait_for(driver, ".finding", timeout=60)
            errors = [e for e in console_errors(driver) if "status of 403" not in e]
            assert not errors, errors
    finally:
        server.stop()
        store.close()
