"""Dashboard speed: a 1-million-event trace (overview, zoom/pan, payload) and 20 clients at once.

Writes a synthetic eager-training trace with the project's Perfetto writer, loads it
with the explorer, serves it, and measures:
  * overview: opening the trace (load included) until the overview is built, in the
    server and, when Chromium is installed, until it is on screen in a browser;
  * timeline: server answers to zoom and pan requests over HTTP, and their size.
  * load: `neuron-explorer view sample_traces/` in its own process, every sample trace
    open, 20 clients (threads, loopback) each opening pages, findings and timeline
    windows of random traces; latency p50/p95 and the server's peak memory. The baseline
    is the same requests from one client in the same run.
Targets: overview <= 3 s, zoom/pan <= 300 ms, payload < 2 MB, load p95 <= 500 ms. Ratios
compare each figure with its target and with a baseline measured in the same run:
sending every visible event without level of detail; one client instead of 20.

    .venv/bin/python benchmarks/bench_dashboard.py [--events 1000000] [--no-browser]
    .venv/bin/python benchmarks/bench_dashboard.py --load-only [--clients 20] [--seconds 60]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "webapp"))

OVERVIEW_TARGET_S = 3.0
ZOOM_TARGET_S = 0.300
PAYLOAD_TARGET_B = 2_000_000
LOAD_P95_TARGET_S = 0.500


def write_trace(path: Path, events: int) -> int:
    """A Perfetto trace with about `events` events: steps > modules > ops, kernels, engines,
    DMA, HBM."""
    from synthetic_trace import events_in
    from synthetic_trace import write_trace as write_synthetic

    # instructions per kernel; each op gives op + kernel + k instructions + DMA + 2 counter samples
    k = 3
    n_steps = 20
    ops_per_step = max(events // (n_steps * (k + 5)), 1)
    write_synthetic(path, n_steps, ops_per_step, instructions_per_kernel=k)
    return events_in(n_steps, ops_per_step, k)


def overview_in_server(path: Path) -> tuple[float, float, float]:
    """Seconds to load the trace, to build and serialise the overview, then its findings."""
    import neuron_explorer
    import plotly.io.json as pio_json
    from neuron_explorer.webapp.pages import overview

    t0 = time.perf_counter()
    trace = neuron_explorer.load(path)
    t1 = time.perf_counter()
    pio_json.to_json_plotly(overview.layout(trace, path.name, {}, None))
    t2 = time.perf_counter()
    pio_json.to_json_plotly(overview.findings(trace, path.name))
    return t1 - t0, t2 - t1, time.perf_counter() - t2


def overview_in_browser(url: str) -> tuple[float, float] | None:
    """Seconds from asking a browser for the overview until it shows, and until its findings do."""
    from browser import browser_available, chromium

    if not browser_available():
        return None
    from selenium.webdriver.common.by import By

    with chromium() as driver:
        driver.get(url + "_favicon.ico")  # start the browser before the clock does
        start = time.perf_counter()
        driver.get(url)
        shown = None
        while time.perf_counter() - start < 300:
            if shown is None and driver.find_elements(By.CSS_SELECTOR, "#page .metrics"):
                shown = time.perf_counter() - start
            if driver.find_elements(By.CSS_SELECTOR,
                                    "#overview-findings .finding, #overview-findings .notice"):
                return shown or time.perf_counter() - start, time.perf_counter() - start
            time.sleep(0.02)
    return None


class TimelineClient:
    """Sends the browser's zoom/pan requests for the timeline callback over HTTP."""

    def __init__(self, url: str, trace: str) -> None:
        self.url = url
        self.trace = trace
        deps = json.load(urllib.request.urlopen(url + "_dash-dependencies"))
        self.spec = next(d for d in deps if "timeline-graph.figure" in d["output"])

    def window(self, state: dict, t0_us: float, t1_us: float) -> tuple[float, int]:
        """(seconds, response bytes) for a relayout to [t0_us, t1_us]."""
        values = {
            "timeline-relayout.data": {"xaxis.range[0]": t0_us, "xaxis.range[1]": t1_us},
            "timeline-state.data": state,
        }

        def items(kind):
            return [[] if i["id"].startswith("{") else
                    {"id": i["id"], "property": i["property"],
                     "value": values.get(f"{i['id']}.{i['property']}")}
                    for i in self.spec[kind]]
        body = json.dumps({
            "output": self.spec["output"],
            "outputs": [{"id": o.split(".")[0], "property": o.split(".")[1]}
                        for o in self.spec["output"].strip(".").split("...")],
            "inputs": items("inputs"),
            "changedPropIds": ["timeline-relayout.data"],
            "state": items("state"),
        }).encode()
        request = urllib.request.Request(self.url + "_dash-update-component", data=body,
                                         headers={"Content-Type": "application/json"})
        start = time.perf_counter()
        payload = urllib.request.urlopen(request).read()
        return time.perf_counter() - start, len(payload)


def naive_window(index, t0: int, t1: int) -> tuple[float, int]:
    """Baseline: every visible slice sent as JSON, no merging."""
    start = time.perf_counter()
    rows = []
    for i, r in enumerate(index.slice_rows):
        lo = int(np.searchsorted(r.end_max, t0, side="right"))
        hi = int(np.searchsorted(r.ts, t1, side="left"))
        rows.append({"row": i, "ts": r.ts[lo:hi].tolist(),
                     "dur": (r.end[lo:hi] - r.ts[lo:hi]).tolist(),
                     "id": r.ids[lo:hi].tolist(), "name": r.names_at(slice(lo, hi)).tolist()})
    size = len(json.dumps(rows))
    return time.perf_counter() - start, size


def start_view(folder: Path):
    """`neuron-explorer view FOLDER` in its own process; (process, port)."""
    import subprocess

    proc = subprocess.Popen([sys.executable, "-m", "neuron_explorer", "view", str(folder),
                             "--no-browser", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if "http://127.0.0.1:" not in line:
        proc.kill()
        raise SystemExit(f"the dashboard did not start: {line}{proc.stderr.read()}")
    return proc, int(line.split("http://127.0.0.1:", 1)[1].split("/", 1)[0])


class PageClient:
    """The requests a browser makes when a user opens a page, its findings, or a timeline window."""

    def __init__(self, port: int) -> None:
        self.server = type("Server", (), {"port": port})
        from dash_requests import dependencies

        self.deps = dependencies(self.server)

    def _call(self, output: str, values: dict, changed: str) -> int:
        import http.client

        spec = next(d for d in self.deps if output in d["output"])
        def items(kind):
            return [[] if i["id"].startswith("{") else
                    {"id": i["id"], "property": i["property"],
                     "value": values.get(f"{i['id']}.{i['property']}")}
                    for i in spec[kind]]
        outputs = [{"id": o.split(".")[0], "property": o.split(".")[1]}
                   for o in spec["output"].strip(".").split("...")]
        body = json.dumps({"output": spec["output"],
                           "outputs": outputs if len(outputs) > 1 else outputs[0],
                           "inputs": items("inputs"), "state": items("state"),
                           "changedPropIds": [changed]})
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=120)
        conn.request("POST", "/_dash-update-component", body=body,
                     headers={"Content-Type": "application/json",
                              "Host": f"127.0.0.1:{self.server.port}"})
        response = conn.getresponse()
        response.read()
        conn.close()
        return response.status

    def page(self, path: str, trace: str) -> int:
        return self._call("page.children", {"url.pathname": path, "url.search": f"?trace={trace}"},
                          "url.search")

    def findings(self, trace: str) -> int:
        return self._call("overview-findings.children", {"overview-trace.data": trace},
                          "overview-trace.data")

    def window(self, trace: str, lo_frac: float, width_frac: float, span_ns: int) -> int:
        t0 = int(lo_frac * span_ns)
        t1 = t0 + width_frac * span_ns
        values = {"timeline-relayout.data": {"xaxis.range[0]": t0 / 1e3,
                                             "xaxis.range[1]": t1 / 1e3},
                  "timeline-state.data": {"trace": trace, "t0": 0, "t1": span_ns, "selected": None,
                                          "fold": True}}
        return self._call("timeline-graph.figure", values, "timeline-relayout.data")


def one_action(client: PageClient, rng, traces: list[str],
               spans: dict[str, int]) -> tuple[float, int]:
    """A random user action on a random trace: (seconds, HTTP status)."""
    trace = traces[int(rng.integers(len(traces)))]
    kind = rng.choice(["overview", "findings", "timeline", "window", "tables"])
    start = time.perf_counter()
    if kind == "findings":
        status = client.findings(trace)
    elif kind == "window":
        width = float(10 ** rng.uniform(-4, 0))
        status = client.window(trace, float(rng.uniform(0, 1 - width)), width, spans[trace])
    else:
        path = {"overview": "/", "timeline": "/timeline", "tables": "/tables"}[kind]
        status = client.page(path, trace)
    return time.perf_counter() - start, status


def load_test(folder: Path, clients: int, seconds: float, actions_per_client: int) -> bool:
    """20 clients against `view FOLDER` with every trace open; p50/p95 against one client's."""
    import threading

    import psutil
    from dash_requests import request

    proc, port = start_view(folder)
    server = psutil.Process(proc.pid)
    peak = [server.memory_info().rss]
    stop = threading.Event()

    def sample_memory():
        while not stop.wait(0.05):
            peak[0] = max(peak[0], server.memory_info().rss)

    sampler = threading.Thread(target=sample_memory, daemon=True)
    sampler.start()
    try:
        client = PageClient(port)
        request(client.server, "GET", "/_dash-layout")
        traces = sorted(p.relative_to(folder).as_posix() for p in folder.glob("*.pftrace"))
        start = time.perf_counter()
        for trace in traces:  # open every trace once: the pages and findings the clients ask for
            client.page("/", trace)
            client.findings(trace)
            client.page("/timeline", trace)
            client.page("/tables", trace)
        print(f"load: {len(traces)} traces opened in {time.perf_counter() - start:.1f} s; "
              f"server memory {server.memory_info().rss / 2**20:.0f} MiB")
        import neuron_explorer

        spans = {}
        for trace in traces:
            t = neuron_explorer.load(folder / trace)
            slices = t.table("slices")
            spans[trace] = int((slices["ts"] + slices["dur"]).max() - slices["ts"].min())

        def run_clients(n: int, per_client: int) -> tuple[list[float], list[int]]:
            times, statuses = [], []
            lock = threading.Lock()
            deadline = time.perf_counter() + seconds

            def worker(seed: int):
                rng = np.random.default_rng(seed)
                mine = PageClient(port)
                for _ in range(per_client):
                    if time.perf_counter() > deadline:
                        break
                    seconds_taken, status = one_action(mine, rng, traces, spans)
                    with lock:
                        times.append(seconds_taken)
                        statuses.append(status)

            threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            return times, statuses

        base_times, _ = run_clients(1, 3 * actions_per_client)
        times, statuses = run_clients(clients, actions_per_client)
    finally:
        stop.set()
        proc.terminate()
        proc.communicate(timeout=30)
    p = lambda xs, q: float(np.percentile(xs, q)) * 1e3
    errors = sum(1 for s in statuses if s >= 500)
    print(f"load, 1 client ({len(base_times)} actions): p50 {p(base_times, 50):.0f} ms, "
          f"p95 {p(base_times, 95):.0f} ms")
    print(f"load, {clients} clients ({len(times)} actions, {errors} server errors): "
          f"p50 {p(times, 50):.0f} ms, p95 {p(times, 95):.0f} ms, max {max(times) * 1e3:.0f} ms "
          f"(target p95 {LOAD_P95_TARGET_S * 1e3:.0f} ms, "
          f"ratio {p(times, 95) / 1e3 / LOAD_P95_TARGET_S:.2f}; "
          f"ratio to 1 client {p(times, 95) / p(base_times, 95):.1f})")
    print(f"load: server peak memory {peak[0] / 2**20:.0f} MiB")
    return errors == 0 and p(times, 95) / 1e3 <= LOAD_P95_TARGET_S


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--no-browser", action="store_true")
    parser.add_argument("--load-only", action="store_true", help="run only the 20-client load test")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=60.0,
                        help="time limit of each load phase")
    parser.add_argument("--actions", type=int, default=25,
                        help="actions per client in the load test")
    args = parser.parse_args()
    load_ok = load_test(REPO / "sample_traces", args.clients, args.seconds, args.actions)
    if args.load_only:
        return 0 if load_ok else 1

    from neuron_explorer.webapp.pages.timeline import timeline_index
    from neuron_explorer.webapp.view_command import start_dashboard

    folder = Path(tempfile.mkdtemp(prefix="bench-dashboard-"))
    path = folder / "million.pftrace"
    start = time.perf_counter()
    n = write_trace(path, args.events)
    print(f"trace: {n:,} events, {path.stat().st_size / 2**20:.1f} MiB, "
          f"written in {time.perf_counter() - start:.1f} s")

    load_s, page_s, findings_s = overview_in_server(path)
    server_s = load_s + page_s
    print(f"overview in the server: load {load_s:.2f} s + page {page_s:.2f} s = {server_s:.2f} s "
          f"(target {OVERVIEW_TARGET_S:.0f} s, ratio {server_s / OVERVIEW_TARGET_S:.2f}); "
          f"findings follow in {findings_s:.2f} s")

    start = time.perf_counter()
    server, store = start_dashboard(path, port=0)  # `view TRACE` loads the trace before serving
    startup_s = time.perf_counter() - start
    try:
        browser_s = None if args.no_browser else overview_in_browser(server.url)
        if browser_s is not None:
            shown_s = startup_s + browser_s[0]
            print(f"`view TRACE` to overview on screen in Chromium: load {startup_s:.2f} s + page "
                  f"{browser_s[0]:.2f} s = {shown_s:.2f} s "
                  f"(ratio to target {shown_s / OVERVIEW_TARGET_S:.2f}); "
                  f"findings on screen after {startup_s + browser_s[1]:.2f} s")
            browser_s = shown_s
        start = time.perf_counter()
        index = timeline_index(store, path.name)
        print(f"timeline index built once per trace: {time.perf_counter() - start:.2f} s, "
              f"{index.n_events:,} events, {len(index.labels)} rows")
        client = TimelineClient(server.url, path.name)
        span_us = (index.end_ns - index.start_ns) / 1e3
        rng = np.random.default_rng(0)
        windows = [(0.0, span_us)]
        for zoom in (0.5, 0.1, 0.01, 1e-3, 1e-4, 1e-5):
            width = span_us * zoom
            for _ in range(3):  # a zoom, then two pans at that zoom
                left = float(rng.uniform(0, span_us - width))
                windows.append((left, left + width))
        state = {"trace": path.name, "t0": index.start_ns, "t1": index.end_ns, "selected": None}
        client.window(state, *windows[0])  # warm up the HTTP path
        times, sizes = [], []
        for lo, hi in windows:
            seconds, size = client.window(state, lo, hi)
            times.append(seconds)
            sizes.append(size)
        naive_s, naive_b = naive_window(index, index.start_ns, index.end_ns)
    finally:
        server.stop()
        store.close()
        shutil.rmtree(folder, ignore_errors=True)
    worst, median = max(times), statistics.median(times)
    print(f"zoom/pan over HTTP ({len(times)} windows from the whole trace down to "
          f"{span_us * 1e-5:.1f} µs): "
          f"median {median * 1e3:.0f} ms, worst {worst * 1e3:.0f} ms "
          f"(target {ZOOM_TARGET_S * 1e3:.0f} ms, ratio {worst / ZOOM_TARGET_S:.2f})")
    print(f"payload per update: median {statistics.median(sizes) / 1e3:.0f} kB, "
          f"largest {max(sizes) / 1e3:.0f} kB "
          f"(target {PAYLOAD_TARGET_B / 1e6:.0f} MB, ratio {max(sizes) / PAYLOAD_TARGET_B:.3f})")
    print(f"baseline without level of detail, whole trace: {naive_s * 1e3:.0f} ms to build, "
          f"{naive_b / 1e6:.1f} MB; whole-trace update with it: {times[0] * 1e3:.0f} ms, "
          f"{sizes[0] / 1e3:.0f} kB "
          f"(size ratio {sizes[0] / naive_b:.4f})")
    ok = (load_ok and server_s <= OVERVIEW_TARGET_S and (browser_s or 0) <= OVERVIEW_TARGET_S
          and worst <= ZOOM_TARGET_S and max(sizes) < PAYLOAD_TARGET_B)
    print("all targets met" if ok else "SOME TARGETS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
