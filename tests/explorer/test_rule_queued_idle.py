"""queued_idle: a device queue idles although work was already launched to it; the saving
is the part of those gaps on the steps' critical path."""

from __future__ import annotations

from pathlib import Path

import neuron_explorer
import pytest
from neuron_explorer.rules import dependency_idle, queued_idle
from scenarios import Scenario

STEP_NS = 1_000_000
STEPS = 4
SAMPLED_0 = "trace_filter__sampled_rank-0.json.gz"
MTIA = "mtia_trace_single_rank__mtia_rank_0.json.gz"


def _trace(tmp: Path, wait_ns: int, b_launch: int = 20_000) -> neuron_explorer.Trace:
    """Per 1 ms step: op a launches kernel a [30, 230) us; op b (launched at `b_launch`)
    kernel b, which starts `wait_ns` after a ends; op c kernel c right after b; the host
    then syncs until c ends and idles (Python) to the step's end."""
    sc = Scenario()
    for n in range(STEPS):
        t = n * STEP_NS
        sc.b.slice(sc.host, t, STEP_NS, f"step {n}", "step", {"step": n})
        b0 = t + 230_000 + wait_ns
        c_end = b0 + 200_000
        sc.op(t, 20_000, "aten::a", 10 * n + 1, n, kernel=(t + 30_000, 200_000))
        sc.op(t + b_launch, 20_000, "aten::b", 10 * n + 2, n, kernel=(b0, 100_000))
        c_launch = max(t + 40_000, t + b_launch + 20_000)
        sc.op(c_launch, 20_000, "aten::c", 10 * n + 3, n, kernel=(b0 + 100_000, 100_000))
        sync0 = c_launch + 20_000
        sc.b.slice(sc.host, sync0, c_end + 10_000 - sync0, "sync", "sync",
                   {"kind": "item", "source": "train.py:42", "device": 0, "step": n})
    return neuron_explorer.load(sc.write(tmp, f"queued_{wait_ns}_{b_launch}"))


def _analysed(trace: neuron_explorer.Trace) -> int:
    from neuron_explorer.analyses.steady_state import analysed_steps

    return len(analysed_steps(trace).steps)


def test_a_queue_idle_with_work_queued_costs_its_wait_on_the_path(tmp_path):
    """b and c are queued while a runs; the queue then idles 50 us before b, a wait the
    host's sync pays: 5% of each step, under dependency_idle's 10%."""
    trace = _trace(tmp_path, 50_000)
    assert not dependency_idle.check(trace)
    gaps = queued_idle.queued_gaps(trace)
    steps = _analysed(trace)
    assert len(gaps) == steps and (gaps["depth"] == 2).all()
    (f,) = queued_idle.check(trace)
    assert f.time_lost_ns == 50_000 * steps == f.symptom_ns
    assert f.severity == "medium" and f.share_of_step == pytest.approx(0.05)
    assert f.saving_basis.startswith("critical path")
    assert "median 2 kernels waiting" in f.title


def test_a_host_late_to_launch_is_no_queued_idle(tmp_path):
    """b launched after a ended: the queue was empty, the idle is the host's (host_wait)."""
    trace = _trace(tmp_path, 50_000, b_launch=240_000)
    assert not len(queued_idle.queued_gaps(trace))
    assert not queued_idle.check(trace)


def test_a_launch_still_running_as_the_queue_idles_is_no_queued_idle(tmp_path):
    """b's launch began before a ended but returned after (an NKI kernel's 50 us of
    dispatch after a sync): HTA calls the gap `other`, yet nothing was queued while the
    queue idled; the host was still launching."""
    trace = _trace(tmp_path, 50_000, b_launch=220_000)  # its op: [220, 240) us, a ends at 230
    from neuron_explorer.analyses.stream_idle import idle_gaps

    assert "other" in set(idle_gaps(trace)["idle_category"])
    assert not len(queued_idle.queued_gaps(trace))
    assert not queued_idle.check(trace)


def test_dependency_idle_reports_the_waits_where_it_fires(tmp_path):
    """A 150 us wait (15% of the step) is dependency_idle's: not counted twice."""
    trace = _trace(tmp_path, 150_000)
    assert dependency_idle.check(trace)
    assert len(queued_idle.queued_gaps(trace))
    assert not queued_idle.check(trace)


def test_fires_on_htas_sampled_trace(load_real):
    """HTA's sampled rank 0's queues idle 702 ms with a median 30 kernels queued, 176 ms
    of it on the critical path; but its host waits on the device (ops that wait for their
    own kernels) only 20.7 ms over the two steps: the host's work beside the path sets
    the steps otherwise, so 20.7 ms is the saving, and the finding is low."""
    from neuron_explorer.analyses.critical_path import host_waits_per_step

    trace = load_real(SAMPLED_0)
    (f,) = queued_idle.check(trace)
    assert f.symptom_ns == pytest.approx(701.8e6, rel=0.01)
    assert f.time_lost_ns == host_waits_per_step(trace).sum() == 20_706_000
    assert f.severity == "low"
    assert "median 30 kernels" in f.title and "stream 7" in f.explanation


def test_silent_on_an_empty_queue(repo_root):
    """The eager MLP's queue is empty while its device idles: it is host-bound."""
    mlp = neuron_explorer.load(repo_root / "sample_traces" / "mlp_eager.pftrace")
    assert mlp.queue_length_summary()["empty_share"].iloc[0] > 0.98
    assert not len(queued_idle.queued_gaps(mlp)) and not queued_idle.check(mlp)


@pytest.mark.slow
def test_silent_where_the_queue_is_unknown(load_real):
    """MTIA's trace names no launch calls (its waits are dependency_idle's), so its queues
    are unknown: none of its gaps counts."""
    mtia = load_real(MTIA)
    assert not len(mtia.queue_length()) and not len(queued_idle.queued_gaps(mtia))
    assert not queued_idle.check(mtia)
