"""An op key arg that does not decode (a damaged or hand-made trace) once made `report`
and `bottlenecks` raise a raw JSONDecodeError through the what-if replay and
`fp32_matmul`: the op keeps its recorded times, with a warning naming it."""

from __future__ import annotations

import warnings

import neuron_explorer
import pytest
import scenarios
from neuron_explorer.cli import main
from neuron_explorer.what_if.replay import predicted_step_ns, recorded_ops

GOOD = '[[[[8, 8], "float32"]]]'
BROKEN = ("[[[", '[[["x"]]]', "[]", '[[[8, 8]]]', "null")


def _trace(tmp_path, key: str) -> neuron_explorer.Trace:
    sc = scenarios.Scenario()
    for n in range(3):
        t = sc.step(n)
        sc.op(t + 1000, 1000, "aten::mm", 10 * n + 1, n, kernel=(t + 2500, 5000),
              busy={"tensor": 5000}, flops=2_000_000, dtypes="[float32, float32]",
              shapes="[[8, 8], [8, 8]]", key=key if n == 1 else GOOD)
    return neuron_explorer.load(sc.write(tmp_path, "keys"))


@pytest.mark.parametrize("key", BROKEN)
def test_a_key_that_does_not_decode_is_a_warning_not_a_crash(tmp_path, key, capsys):
    trace = _trace(tmp_path, key)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ops = recorded_ops(trace)
        trace.bottlenecks()
        predicted_step_ns(trace)
    assert ops["key"].isna().sum() == 1  # that op only; the others decode
    assert any("does not decode" in str(w.message) and "op slice" in str(w.message)
               for w in caught)
    assert main(["report", str(trace.path)]) == 0
