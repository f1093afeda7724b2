"""Fuzzed traces in both formats: a load raises TraceFormatError or nothing, and a trace that
loads survives every analysis and the report; memory and time stay bounded.

Seeded and derandomized (the same inputs every run), about a minute in all. Inputs that
ever failed are kept in tests/data/fuzz_corpus/ and loaded by `test_fuzz_corpus`.
"""

from __future__ import annotations

import gzip
import json
import resource
import time
import tracemalloc
from pathlib import Path

import fuzz_inputs as fz
import neuron_explorer
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from neuron_explorer.common.errors import TraceFormatError
from neuron_explorer.loaders import inflate

CORPUS = Path(__file__).resolve().parents[1] / "data" / "fuzz_corpus"
EXPECTED: dict[str, str] = json.loads((CORPUS / "expected.json").read_text())
SECONDS_PER_INPUT = 20  # the bounds on any one input (a load takes milliseconds here)
BYTES_PER_INPUT = 2 << 30

FUZZ = settings(derandomize=True, database=None, deadline=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    return fz.seeds(str(tmp_path_factory.mktemp("fuzz_seeds")))


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _check(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    start, peak = time.monotonic(), _peak_rss()
    fz.check_load(path)
    assert time.monotonic() - start < SECONDS_PER_INPUT
    assert _peak_rss() - peak < BYTES_PER_INPUT  # the process's high-water mark


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fuzz_corpus(name: str) -> None:
    trace = fz.check_load(CORPUS / name)
    assert (trace is not None) == (EXPECTED[name] == "loads")


def test_every_analysis_is_fuzzed() -> None:
    """Each Trace method that takes no argument is an analysis the fuzz inputs go through."""
    import inspect

    public = {name for name, member in inspect.getmembers(neuron_explorer.Trace)
              if not name.startswith("_") and callable(member)
              and not [p for p in list(inspect.signature(member).parameters.values())[1:]
                       if p.default is inspect.Parameter.empty
                       and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]}
    assert public == set(fz.ANALYSES)


def test_corpus_lists_every_file() -> None:
    assert sorted(p.name for p in CORPUS.glob("*trace*")) == sorted(EXPECTED)


@pytest.mark.slow
@settings(FUZZ, max_examples=50)
@given(data=st.data())
def test_fuzz_pftrace_bytes(seeds: dict[str, bytes], tmp_path: Path, data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(["basic.pftrace", "recorded.pftrace"]))
    _check(tmp_path / "fuzz.pftrace", data.draw(fz.byte_mutations(seeds[name])))


@pytest.mark.slow
@settings(FUZZ, max_examples=50)
@given(data=st.data())
def test_fuzz_json(seeds: dict[str, bytes], tmp_path: Path, data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(["basic.json", "kineto.json"]))
    if data.draw(st.booleans()):
        mutated = data.draw(fz.wrong_fields(seeds[name]))
    else:
        mutated = data.draw(fz.byte_mutations(seeds[name]))
    if data.draw(st.integers(0, 3)) == 0:  # some gzipped, some with the gzip bytes mutated
        mutated = fz.gzipped(mutated)
        if data.draw(st.booleans()):
            mutated = data.draw(fz.byte_mutations(mutated))
        _check(tmp_path / "fuzz.json.gz", mutated)
    else:
        _check(tmp_path / "fuzz.json", mutated)


@pytest.mark.slow
@settings(FUZZ, max_examples=150)
@given(data=fz.random_bytes())
def test_fuzz_random_bytes(tmp_path: Path, data: bytes) -> None:
    _check(tmp_path / "random.pftrace", data)


@pytest.mark.slow
@settings(FUZZ, max_examples=8)
@given(inflated_mib=st.integers(4, 48), limit_mib=st.integers(1, 3),
       head=st.sampled_from([b'{"traceEvents": [', b"[", b"\x0a\x05"]))
def test_fuzz_gzip_bombs(tmp_path: Path, inflated_mib: int, limit_mib: int,
                         head: bytes) -> None:
    block = gzip.compress(b" " * (1 << 20), 9)  # 1 MiB of spaces in about 1 KiB
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(gzip.compress(head) + block * inflated_mib)
    limit = limit_mib << 20
    tracemalloc.start()
    try:
        with pytest.raises(TraceFormatError, match="inflates to more than"):
            neuron_explorer.load(path, max_bytes=limit)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < limit + 3 * inflate._CHUNK
