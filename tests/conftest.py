"""Shared test setup: the real traces kept in tests/data and the repository root."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# The suite loads thousands of throw-away traces: it runs without the trace cache (and
# never writes into the user's), except the tests of the cache, which turn it on.
os.environ.setdefault("NEURON_EXPLORER_CACHE", "off")
# One intra-op thread per process, here and in every program a test starts: pytest-xdist
# runs a worker per core already, and torch's default of a thread per core then has four
# threads spin against each other on two cores (the compiled-transformer test took 59 s
# of wall time and 29 s of CPU beside a busy neighbour, 21 s and 8.5 s with one thread).
# Set before torch is imported (it reads the variable as its thread pool starts); a value
# already in the environment is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")
if "torch" in sys.modules:  # imported before this file (a plugin): set it there too
    sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

REPO = Path(__file__).resolve().parents[1]
# helpers every test folder imports by name (cli_runner)
sys.path.insert(0, str(Path(__file__).resolve().parent))
# Real PyTorch-profiler traces from other tools, kept in the repository (origin and license
# in their README), so a clone needs nothing beside it.
REAL_TRACES = Path(__file__).resolve().parent / "data" / "real_traces"


@pytest.fixture(scope="module", autouse=True)
def _fresh_dynamo_per_file():
    """Each test file starts with Dynamo as in a new process. Its caches and automatic-
    dynamic frame state are keyed by code object, and every `torch.compile(module)` runs
    the same one (`external_utils.wrap_inline`'s `inner`): a module compiled in one file
    made the next file's first compile of another module a recompile with symbolic sizes
    (so one more `neuron_compile` span, at its first launch). Per file, not per test: a
    file's tests share compiled models (module fixtures) and expect them compiled once.
    Under xdist (--dist loadfile) a worker runs whole files in any order."""
    _reset_dynamo()
    yield


@pytest.fixture
def fresh_dynamo():
    """Dynamo as in a new process for one test: for tests that count the compiles of a
    function from its first call, which another test in the file may have compiled at
    other sizes (its automatic-dynamic state would make the first compile symbolic)."""
    _reset_dynamo()
    yield


def _reset_dynamo() -> None:
    if "torch._dynamo" in sys.modules:  # nothing compiled yet otherwise; don't import it
        sys.modules["torch._dynamo"].reset()
        # reset() drops Dynamo's compile callbacks too: the backend's compile-event
        # recorder registers them again only when the next graph reaches the backend,
        # after a graph break in that frame was traced (and would go unrecorded).
        events = sys.modules.get("neuron_explorer.backend.compiler.compile_events")
        if events is not None:
            events.recorder.install()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def real_traces_dir() -> Path:
    return REAL_TRACES


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--full", action="store_true",
                     help="also run the `full` tests: the larger versions of checks the "
                          "suite makes at a smaller size or on a sample")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without --full, the `full` tests are deselected. Under pytest-xdist, the files
    holding `slow` tests run first (each file whole, in collection order otherwise): the
    long files start at once and the many short ones fill the workers in at the end,
    instead of one long file running alone last."""
    if not config.getoption("--full"):
        full = [item for item in items if item.get_closest_marker("full")]
        if full:
            config.hook.pytest_deselected(items=full)
            items[:] = [item for item in items if not item.get_closest_marker("full")]
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # a stable sort


# A test (its call, or its setup: a module fixture that records) taking longer than this
# belongs under the `slow` marker, which schedules its file first; the run's summary
# lists those that lack it.
SLOW_TEST_S = 10.0
_unmarked_slow: list[tuple[float, str, str]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if (report.when in ("setup", "call") and report.duration > SLOW_TEST_S
            and "slow" not in report.keywords):
        _unmarked_slow.append((report.duration, report.when, report.nodeid))


def pytest_terminal_summary(terminalreporter) -> None:
    if not _unmarked_slow:
        return
    terminalreporter.section(f"tests over {SLOW_TEST_S:g} s without the slow marker")
    for duration, when, nodeid in sorted(_unmarked_slow, reverse=True):
        terminalreporter.write_line(f"{duration:6.1f} s  {when:5}  {nodeid}")
