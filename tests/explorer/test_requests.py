"""Per request figures: `neuron_explorer.request` marks which requests each model call
serves; `Trace.requests()` and the report give each one's queueing, time to first token and
time per output token, recorded from examples/serve.py (continuous batching) and by hand."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import neuron_explorer
import numpy as np
import pandas as pd
import pytest
from cli_runner import run_cli
from neuron_explorer.analyses.requests import call_phases, request_marks, served
from neuron_explorer.render import fmt_ns

EXAMPLES = Path(__file__).parents[2] / "examples"


def make_requests(n: int, every: float, seed: int, vocab: int) -> list:
    """The requests examples/serve.py makes for these arguments (its own function)."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        import serve
    finally:
        sys.path.remove(str(EXAMPLES))
    return serve.make_requests(n, every, seed, vocab)


def _cli(*args: str, cwd: Path) -> str:
    # the modelled host clock: the same times every run, whatever shares the machine
    return run_cli(*args, cwd=cwd, modelled=True)


@pytest.fixture(scope="module")
def serve_trace(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("serve")
    done: dict[tuple[str, ...], Path] = {}

    def record(*args: str) -> Path:
        if args not in done:
            out = folder / f"serve{len(done)}.pftrace"
            _cli("record", "--level", "op", "-o", str(out), "--", "python",
                 str(EXAMPLES / "serve.py"), *args, cwd=folder)
            done[args] = out
        return done[args]

    return record


@pytest.mark.slow
def test_requests_arriving_at_once(serve_trace) -> None:
    """Four requests at once, four slots: each prefill waits for the ones before it, then
    every decode step serves the requests still running."""
    path = serve_trace("--requests", "4", "--max-batch", "4", "--arrive-every", "0")
    wanted = make_requests(4, 0, 0, 512)
    lengths = [r.max_tokens for r in wanted]
    trace = neuron_explorer.load(path)
    p = trace.phases()
    prefill, decode = p[p["phase"] == "prefill"], p[p["phase"] == "decode"]
    assert p["phase"].tolist() == ["prefill"] * 4 + ["decode"] * (max(lengths) - 1)
    assert prefill["tokens"].tolist() == [len(r.prompt) for r in wanted]
    # decode step k feeds one token for each request that wants more than k
    assert decode["tokens"].tolist() == [sum(n > k for n in lengths)
                                         for k in range(1, max(lengths))]

    rq = trace.requests()
    assert rq["request"].tolist() == [0, 1, 2, 3]
    assert rq["tokens"].tolist() == lengths
    assert rq["prompt_tokens"].tolist() == [len(r.prompt) for r in wanted]
    # each waits from its arrival mark, at the start of step 0, through the prefill steps
    # before its own, and the host's work in its own step before the call (its input)
    queue = rq["queue_ns"].to_numpy()
    waited = (prefill["ts"] - prefill["ts"].iloc[0]).to_numpy()
    assert (waited <= queue).all() and (queue < waited + prefill["dur"].to_numpy() / 10).all()
    # its first token is ready as its prefill step ends (the host waits for the device there)
    end = (prefill["ts"] + prefill["dur"]).to_numpy()
    first = (rq["arrival_ns"] + rq["ttft_ns"]).to_numpy()
    assert (end <= first).all() and (first < end + prefill["dur"].to_numpy() / 20).all()
    # then one token a step: at the decode steps' pace, with the later prefills between
    # request 0's first two tokens
    assert rq["tpot_median_ns"].to_numpy() == pytest.approx(decode["dur"].median(), rel=0.05)
    ends = (p["ts"] + p["dur"]).set_axis(p["step"])
    between = (ends[rq["last_step"]].to_numpy() - ends[rq["first_step"]].to_numpy())
    np.testing.assert_allclose(rq["e2e_ns"] - rq["ttft_ns"], between, rtol=0.01)
    # its last token: as its last step ends
    last = decode.set_index("step").reindex(rq["last_step"])
    end = (last["ts"] + last["dur"]).to_numpy()
    ready = (rq["arrival_ns"] + rq["e2e_ns"]).to_numpy()
    assert (end <= ready).all() and (ready < end + last["dur"].to_numpy() / 20).all()

    sv = trace.serving()
    assert len(sv) == 1  # the requests pooled, not a generation per prefill
    g = sv.iloc[0]
    assert (g["prompt_tokens"], g["new_tokens"], g["decode_steps"]) == (
        sum(len(r.prompt) for r in wanted), sum(lengths), max(lengths) - 1)
    assert g["ttft_ns"] == rq["ttft_ns"].median()

    text = _cli("report", str(path), cwd=path.parent)
    assert "Requests (4 marked; percentiles over requests)" in text
    row = next(line for line in text.splitlines() if line.startswith("time to first token  "))
    assert re.split(r"\s{2,}", row.strip())[1:5] == [
        "4", *(fmt_ns(np.percentile(rq["ttft_ns"], q)) for q in (50, 90, 99))]
    report = json.loads(_cli("report", "--format", "json", str(path), cwd=path.parent))
    assert [r["request"] for r in report["requests"]] == [0, 1, 2, 3]
    figures = {r["figure"]: r for r in report["request_percentiles"]}
    assert figures["per output token (median)"]["p90"] == pytest.approx(
        np.percentile(rq["tpot_median_ns"], 90))


@pytest.mark.slow
def test_continuous_batching_queues_requests_when_the_slots_are_full(serve_trace) -> None:
    path = serve_trace("--requests", "8", "--max-batch", "2")
    wanted = make_requests(8, 2.0, 0, 512)
    trace = neuron_explorer.load(path)
    p, rq = trace.phases(), trace.requests()
    assert (p["phase"] == "prefill").sum() == 8
    decode = p[p["phase"] == "decode"]
    assert decode["tokens"].max() == 2  # never more running than slots
    # every token comes from one call: a prefill's or a decode step's
    assert rq["tokens"].sum() == 8 + decode["tokens"].sum() == sum(r.max_tokens for r in wanted)
    assert rq["request"].tolist() == list(range(8))  # in the order they arrived
    step = float(p["dur"].median())
    # some arrive while two others run and wait for a slot: steps, not microseconds
    assert (rq["queue_ns"] < step / 10).any() and (rq["queue_ns"] > step).any()
    assert (rq["ttft_ns"] > rq["queue_ns"]).all() and (rq["e2e_ns"] >= rq["ttft_ns"]).all()


MARKED = '''
import sys
import neuron_explorer
import torch
from generate import Decoder

torch.manual_seed(0)
model = Decoder().to("neuron").eval()
prompt = torch.randint(0, 512, (2, 10)).to("neuron")
with torch.inference_mode():
    with neuron_explorer.request(["a", "b"]):  # row 0 serves "a", row 1 "b"
        logits, cache = model(prompt)
    for i in range(4):
        token = logits[:, -1].argmax(-1, keepdim=True)
        token.tolist()
        if i == 2:  # "a" has its 3 tokens: "b" goes on alone, with its row of the cache
            cache = [[k[1:], v[1:]] for k, v in cache]
        with neuron_explorer.request(["a", "b"] if i < 2 else "b"):
            logits, cache = model(token[-len(cache[0][0]):], cache)
'''


@pytest.mark.slow
def test_batch_rows_are_requests_and_no_arrival_means_no_queueing(tmp_path: Path) -> None:
    script = tmp_path / "marked.py"
    script.write_text(MARKED)
    out = tmp_path / "marked.pftrace"
    run_cli("record", "--level", "op", "-o", str(out), "--", "python", str(script),
            cwd=tmp_path, modelled=True, env=dict(os.environ, PYTHONPATH=str(EXAMPLES)))
    trace = neuron_explorer.load(out)
    p = trace.phases()
    assert p["phase"].tolist() == ["prefill"] + ["decode"] * 4
    assert p["tokens"].tolist() == [20, 2, 2, 1, 1]
    rq = trace.requests().set_index("request")
    assert rq["tokens"].to_dict() == {"a": 3, "b": 5}
    assert rq["prompt_tokens"].tolist() == [10, 10]
    assert rq["queue_ns"].isna().all()  # they arrive with their first call
    assert rq.at["a", "arrival_ns"] == rq.at["b", "arrival_ns"] >= p["ts"].iloc[0]
    assert rq.at["a", "ttft_ns"] == rq.at["b", "ttft_ns"]
    # "a" leaves after step 2; "b" runs on through step 4
    assert (rq.at["a", "last_step"], rq.at["b", "last_step"]) == (2, 4)
    for name in ("a", "b"):
        last = p.set_index("step").loc[rq.at[name, "last_step"]]
        assert rq.at[name, "arrival_ns"] + rq.at[name, "e2e_ns"] >= last["ts"] + last["dur"]
    assert "Requests (2 marked" in _cli("report", str(out), cwd=tmp_path)


def test_a_call_serves_the_requests_of_every_range_it_starts_in() -> None:
    marks = [(0, 100, [1]), (10, 50, [2, 3]), (50, 60, [1]), (200, 200, [4]), (300, 400, [4])]
    starts = np.array([5, 20, 55, 200, 310, 500])
    assert served(marks, starts) == [[1], [1, 2, 3], [1], [], [4], []]
    calls = pd.DataFrame({"ts": starts})
    # request 4's zero-length range is its arrival: its first call is still its prefill
    assert call_phases(marks, calls) == ["prefill", "prefill", "decode", None, "prefill", None]


def test_requests_each_answered_by_one_call_are_no_generation(tmp_path: Path) -> None:
    """A classifier serving one request a call generates nothing: its calls are eval passes,
    not prefills, and its requests have a latency, not a time to first token (a served
    classifier's report showed a Serving table of prompt tokens and decode steps)."""
    marks = [(0, 10, [1]), (20, 30, [2]), (40, 50, [3, 4])]
    assert call_phases(marks, pd.DataFrame({"ts": [5, 25, 45]})) == ["eval"] * 3
    script = tmp_path / "classify.py"
    script.write_text(CLASSIFIER)
    out = tmp_path / "classify.pftrace"
    run_cli("record", "--level", "op", "-o", str(out), "--", "python", str(script),
            cwd=tmp_path, modelled=True)
    trace = neuron_explorer.load(out)
    assert set(trace.phases()["phase"]) == {"eval"}
    assert not len(trace.serving())
    # each request's latency is its whole range: the input's upload before the model call
    # and the read of its answer after it (they were left out: every request read 346 us
    # of a 532 us range)
    marks: dict[int, tuple[int, int]] = {}  # a range split at a step boundary: pieces
    for a, b, ids in request_marks(trace):
        first, last = marks.get(ids[0], (a, b))
        marks[ids[0]] = (min(first, a), max(last, b))
    rq = trace.requests().set_index("request")
    assert rq["arrival_ns"].to_dict() == {i: a for i, (a, _) in marks.items()}
    assert rq["e2e_ns"].to_dict() == {i: b - a for i, (a, b) in marks.items()}
    report = _cli("report", str(out), cwd=tmp_path)
    assert "Requests (6 marked" in report and "end to end" in report
    assert "time to first token" not in report and "Serving" not in report


CLASSIFIER = """
import neuron_explorer, torch
model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(),
                            torch.nn.Linear(32, 4)).to("neuron").eval()
with torch.no_grad():
    for i in range(6):
        with neuron_explorer.request(i):
            print(int(model(torch.randn(1, 32).to("neuron")).argmax()))
"""


def test_request_ids_are_ints_or_strings() -> None:
    assert neuron_explorer.request([3, "b"]).args == {"request": '[3, "b"]'}
    for bad in (1.5, [True], [None]):
        with pytest.raises(TypeError, match="an id or a list of ids"):
            neuron_explorer.request(bad)
