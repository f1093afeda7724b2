"""common.intervals: a union's parts that another union does not cover, against a
point-by-point count on random intervals."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from neuron_explorer.common.intervals import Union

spans = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 25)), max_size=6)


def _union(pairs: list[tuple[int, int]]) -> Union:
    starts = np.array([a for a, _ in pairs], np.int64)
    return Union(starts, starts + np.array([n for _, n in pairs], np.int64))


def _points(u: Union) -> set[int]:
    return {t for a, b in zip(u.starts.tolist(), u.ends.tolist(), strict=True)
            for t in range(a, b)}


@given(spans, spans)
def test_minus_leaves_exactly_the_points_the_other_does_not_cover(ours, theirs) -> None:
    a, b = _union(ours), _union(theirs)
    left = a.minus(b)
    assert _points(left) == _points(a) - _points(b)
    assert (left.ends > left.starts).all() and (left.starts[1:] > left.ends[:-1]).all()
