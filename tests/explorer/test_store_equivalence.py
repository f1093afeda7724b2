"""Every analysis and the report give the same results from the trace cache as from the
trace file parsed afresh: on sample recordings of each kind (eager, compiled, engine-level
with NKI kernels, a data-loader stall), on the real PyTorch-profiler traces and on the
fuzz corpus's traces that load. The store's tables are compared in `test_store.py`; this
compares what users read from them, so a store that kept a table's values but changed a
dtype, an order or a lazily read column would show here."""

from __future__ import annotations

import copy
import math
import warnings
from pathlib import Path
from typing import Any

import neuron_explorer
import pandas as pd
import pytest
from fuzz_inputs import ANALYSES
from neuron_explorer.common.errors import TraceFormatError
from neuron_explorer.loaders import read_trace
from neuron_explorer.loaders.args import LazyArgs
from neuron_explorer.report import render_report

ROOT = Path(__file__).parents[2]
SAMPLES = ["gpt_compiled.pftrace", "nki_kernels.pftrace", "slow_dataloader.pftrace",
           "odd_dims.pftrace", "serve.pftrace"]
TRACES = ([ROOT / "sample_traces" / name for name in SAMPLES]
          + sorted((ROOT / "tests" / "data" / "real_traces").glob("*.json.gz"))
          + sorted((ROOT / "tests" / "data" / "fuzz_corpus").glob("*.pftrace")))


def _everything(trace: neuron_explorer.Trace) -> dict[str, Any]:
    """What a user reads: each analysis, the findings and the report (Markdown)."""
    out: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in ANALYSES:
            value = getattr(trace, name)()
            out[name] = [f.to_dict() for f in value] if name == "bottlenecks" else value
        out["report"] = render_report(trace, "md")
    return out


def _load(path: Path, **kw: Any) -> neuron_explorer.Trace | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return neuron_explorer.load(path, **kw)
        except TraceFormatError:
            return None


def _assert_same(fresh: Any, cached: Any, where: str = "") -> None:
    """Equal through dicts, lists and tuples; frames and series by pandas' own check;
    NaN equals NaN."""
    if isinstance(fresh, pd.DataFrame):
        pd.testing.assert_frame_equal(fresh, cached, obj=where)
    elif isinstance(fresh, pd.Series):
        pd.testing.assert_series_equal(fresh, cached, obj=where)
    elif isinstance(fresh, dict):
        assert isinstance(cached, dict) and fresh.keys() == cached.keys(), where
        for key, value in fresh.items():
            _assert_same(value, cached[key], f"{where}.{key}")
    elif isinstance(fresh, (list, tuple)):
        assert type(fresh) is type(cached) and len(fresh) == len(cached), where
        for i, (a, b) in enumerate(zip(fresh, cached, strict=True)):
            _assert_same(a, b, f"{where}[{i}]")
    elif isinstance(fresh, float) and math.isnan(fresh):
        assert isinstance(cached, float) and math.isnan(cached), where
    else:
        assert fresh == cached, where


# a large real trace (3 MB gzip, 17 s) runs with the slow tests
CASES = [pytest.param(p, id=p.name, marks=[pytest.mark.slow] if p.stat().st_size > 1 << 20
                      and p.suffix == ".gz" else []) for p in TRACES]


def _parsed_once(read: Any) -> Any:
    """`read_trace` that parses the file at its first call, for the load that writes the
    cache, and gives each later call a deep copy of that parse as it came from the parser:
    the fresh load then has tables of its own without a second parse (7 s of the large
    real trace's 17). Only for a parse of plain tables: a .pftrace's args and flows are
    built on first use by closures over state the copies would share (its args' decoder
    appends to the trace's warnings), so the samples and the fuzz corpus parse twice."""
    kept: list[Any] = []

    def parse(*args: Any, **kwargs: Any) -> Any:
        if kept:
            return copy.deepcopy(kept[0])
        raw = read(*args, **kwargs)
        assert not callable(raw.flows) and not isinstance(raw.args, LazyArgs), \
            "a parse with parts built on first use: parse it for each load"
        kept.append(copy.deepcopy(raw))
        return raw

    return parse


@pytest.mark.slow  # the large samples: 10-13 s each
@pytest.mark.parametrize("path", CASES)
def test_the_cache_gives_what_a_fresh_parse_gives(path: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURON_EXPLORER_CACHE", str(tmp_path / "cache"))
    with monkeypatch.context() as m:
        if path.suffix == ".gz":  # a real PyTorch-profiler trace (JSON)
            m.setattr("neuron_explorer.trace.read_trace", _parsed_once(read_trace))
        first = _load(path)  # parses the file and writes the cache
        fresh = _load(path, cache=False)
    if first is None:  # a fuzz input that is no trace: refused alike from either side
        assert fresh is None
        return
    assert fresh is not None and fresh.store_folder is None
    assert first.store_folder
    with monkeypatch.context() as m:
        m.setattr("neuron_explorer.trace.read_trace",
                  lambda *a, **k: pytest.fail("the trace was parsed again"))
        cached = _load(path)
    assert cached is not None
    expected = _everything(fresh)
    _assert_same(expected, _everything(first))
    _assert_same(expected, _everything(cached))
