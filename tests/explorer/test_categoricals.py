"""The tables' categorical text columns: categories are the values used, in lexical order,
however the loader coded them, so a fresh parse and the trace cache give equal frames
(the whole-trace comparison is test_store_equivalence.py; these are the helpers' cases)."""

from __future__ import annotations

from pathlib import Path

import neuron_explorer
import numpy as np
import pandas as pd
import pytest
from neuron_explorer.loaders.args import categorical, categorical_of, tidy_categoricals

ROOT = Path(__file__).parents[2]


def test_categorical_from_codes() -> None:
    # duplicate values, a None value, an unused one and missing codes (-1)
    cat = categorical(np.array([3, 0, -1, 4, 2, 0]), ["b", "x", "a", "b", None])
    assert cat.categories.tolist() == ["a", "b"]  # used, lexical; x unused
    assert cat.tolist()[:2] == ["b", "b"] and pd.isna(cat[2]) and pd.isna(cat[3])
    assert cat.tolist()[4:] == ["a", "b"]
    assert categorical(np.zeros(0, np.int64), ["a"]).categories.tolist() == []


def test_categorical_of_strings_and_categoricals() -> None:
    cat = categorical_of(np.array(["z", None, "a", "z"], object))
    assert cat.categories.tolist() == ["a", "z"] and pd.isna(cat[1])
    odd = pd.Categorical(["m", "c"], categories=["m", "q", "c"])
    assert categorical_of(odd).categories.tolist() == ["c", "m"]


def test_tidy_categoricals_subset_and_order() -> None:
    frame = pd.DataFrame({"name": categorical_of(np.array(["b", "a", "c"], object)),
                          "n": [1, 2, 3]})
    part = tidy_categoricals(frame[frame["n"] > 1].copy())
    assert part["name"].cat.categories.tolist() == ["a", "c"]  # b: not in the subset
    assert part["name"].sort_values().tolist() == ["a", "c"]
    shuffled = pd.DataFrame({"name": pd.Categorical(["b", "a"], categories=["b", "a"])})
    assert tidy_categoricals(shuffled)["name"].cat.categories.tolist() == ["a", "b"]
    kept = tidy_categoricals(frame)
    assert kept["name"].cat.categories.tolist() == ["a", "b", "c"]


@pytest.mark.parametrize("name", ["gpt_eager.pftrace", "nki_kernels.pftrace"])
def test_fresh_and_cached_text_columns(name: str, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURON_EXPLORER_CACHE", str(tmp_path / "cache"))
    path = ROOT / "sample_traces" / name
    fresh = neuron_explorer.load(path, cache=False)
    first = neuron_explorer.load(path)  # writes the entry, the derived tables into it
    assert all(len(getattr(first, t)) >= 0 for t in ("ops", "kernels", "instructions"))
    cached = neuron_explorer.load(path)
    assert cached.store_folder is not None
    for table in ("slices", "ops", "kernels", "instructions"):
        a, b = fresh.table(table), cached.table(table)
        pd.testing.assert_frame_equal(a, b)
        for column in ("name", "category", "kind", "engine", "opcode"):
            if column in a and len(a):
                cats = a[column].cat.categories
                assert cats.is_monotonic_increasing and cats.is_unique
    assert isinstance(fresh.table("slices")["name"].dtype, pd.CategoricalDtype)
    # SQL sees strings, from the frames as from the Parquet
    query = "SELECT name, count(*) AS n FROM slices GROUP BY 1 ORDER BY 1"
    pd.testing.assert_frame_equal(fresh.sql(query), cached.sql(query))
