"""Trace.phases() and Trace.serving() on recorded examples: an eval pass between training
steps is its own phase and inflates no training step; a KV-cache decoder gives a prefill
then one decode step per new token, with its time to first token and per output token."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import neuron_explorer
import numpy as np
import pandas as pd
import pytest
from cli_runner import run_cli
from neuron_explorer.analyses.idle import idle_summary
from neuron_explorer.analyses.phases import _mark_generation
from neuron_explorer.peaks import peak_flops
from neuron_explorer.render import fmt_ns

pytestmark = pytest.mark.slow
EXAMPLES = Path(__file__).parents[2] / "examples"


def _cli(*args: str, cwd: Path) -> str:
    # the modelled host clock: the same step times every run, whatever shares the machine
    return run_cli(*args, cwd=cwd, modelled=True)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("phases")
    done: dict[tuple[str, ...], Path] = {}

    def record(script: str, *args: str) -> Path:
        key = (script, *args)
        if key not in done:
            out = folder / f"trace{len(done)}.pftrace"
            _cli("record", "--level", "op", "-o", str(out), "--", "python",
                 str(EXAMPLES / script), *args, cwd=folder)
            done[key] = out
        return done[key]

    return record


@pytest.fixture(scope="module")
def loaded(recorded):
    """A recording of `recorded`'s, loaded once for the tests that read it (they read,
    never change: the analyses give copies)."""
    done: dict[tuple[str, ...], neuron_explorer.Trace] = {}

    def load(script: str, *args: str) -> neuron_explorer.Trace:
        key = (script, *args)
        if key not in done:
            done[key] = neuron_explorer.load(recorded(script, *args))
        return done[key]

    return load


@pytest.fixture(scope="module")
def reported():
    """`neuron-explorer report [--format json] PATH`'s output, run once per path and format
    (two tests read the plain run's JSON report)."""
    done: dict[tuple[str, bool], str] = {}

    def report(path: Path | str, json_format: bool = False) -> str:
        path = Path(path)
        key = (str(path), json_format)
        if key not in done:
            fmt = ("--format", "json") if json_format else ()
            done[key] = _cli("report", *fmt, str(path), cwd=path.parent)
        return done[key]

    return report


def test_eval_passes_are_their_own_phase_and_inflate_no_training_step(loaded) -> None:
    with_eval = loaded("finetune_eval.py", "--eval-every", "3")
    plain = loaded("finetune_eval.py", "--eval-every", "0")
    p = with_eval.phases()
    train = p[p["phase"] == "train"].set_index("step")["dur"]
    evals = p[p["phase"] == "eval"]
    assert len(train) == 12
    assert len(evals) == 3 * 4 and set(evals["step"]) == {3, 6, 9}  # 4 batches, every 3 steps
    # the recorder holds each eval pass in the next training step, twice as long as the rest
    assert with_eval.steps.set_index("step")["dur"][3] > 1.5 * train[4]
    reference = plain.phases().set_index("step")["dur"]
    for step in (3, 6, 9):
        assert train[step] == pytest.approx(reference[step], rel=0.1)
        # the eval passes come before the training step and end where it starts
        ev = evals[evals["step"] == step]
        assert int((ev["ts"] + ev["dur"]).max()) <= int(p[(p["phase"] == "train") &
                                                          (p["step"] == step)]["ts"].iloc[0])
    # per-step figures: the training steps alone
    s, ref = with_eval.summary(), plain.summary()
    assert s["step_time_ns"] == pytest.approx(ref["step_time_ns"], rel=0.1)
    mean = s["total_ns"] / len(s["steps_analysed"])  # the breakdown's mean step
    assert mean == pytest.approx(ref["total_ns"] / len(ref["steps_analysed"]), rel=0.1)
    flops = with_eval.efficiency().set_index("step")["flops"]
    assert flops[3] == flops[4]  # the eval passes' kernels are not the training step's
    assert flops[3] == pytest.approx(plain.efficiency().set_index("step")["flops"][3], rel=0.02)
    assert s["mfu"] == pytest.approx(ref["mfu"], rel=0.1)
    ops, ref_ops = with_eval.op_stats(), plain.op_stats()  # no eval op among them
    assert ops[["name", "count"]].equals(ref_ops[["name", "count"]])


def _analysed_syncs(trace):
    from neuron_explorer.analyses.phases import in_analysed_work
    from neuron_explorer.analyses.step_breakdown import host_slices
    from neuron_explorer.tables import assign_steps

    syncs = host_slices(trace)
    syncs = syncs[syncs["kind"] == "sync"]
    syncs = syncs.assign(step=assign_steps(syncs["ts"].to_numpy(), trace.steps))
    return in_analysed_work(trace, syncs[syncs["step"] >= 0])


def test_eval_passes_fold_into_no_idle_figure_or_finding(loaded) -> None:
    """The idle gaps, the findings' evidence and their savings are the training steps'
    alone: the same as a run without eval passes."""
    with_eval = loaded("finetune_eval.py", "--eval-every", "3")
    plain = loaded("finetune_eval.py", "--eval-every", "0")
    idle, ref = idle_summary(with_eval), idle_summary(plain)  # the report's idle table
    # the eval passes' own gaps (their launches, their .item() syncs) are not counted: as
    # many gaps as without them, as long. Only the reason of each training part's first
    # gap differs: the device idles from the eval's last sync, not behind the step before
    assert idle["gaps"].sum() == ref["gaps"].sum()
    assert idle.set_index("reason").at["host_launch", "gaps"] == \
        ref.set_index("reason").at["host_launch", "gaps"]
    assert idle["ns"].sum() == pytest.approx(ref["ns"].sum(), rel=0.05)
    # an eval pass's last `.item()`, waiting 0 ns just as the training part begins, is
    # the eval's: counted with the training work, it made a sync finding of the eval
    assert len(_analysed_syncs(with_eval)) == len(_analysed_syncs(plain))
    found = {f.rule_id: f for f in with_eval.bottlenecks()}
    expected = {f.rule_id: f for f in plain.bottlenecks()}
    assert set(found) == set(expected)
    for rule, f in found.items():
        # counts of gaps, matmuls; of sequences, fewer: those running on from one step's
        # end into the next's start recur in every step only without eval passes between
        if rule != "short_kernel_sequence":
            assert f.title == expected[rule].title
        assert f.symptom_ns == pytest.approx(expected[rule].symptom_ns, rel=0.1), rule
        assert f.time_lost_ns == pytest.approx(expected[rule].time_lost_ns, rel=0.1), rule


def test_eval_passes_get_their_own_figures_in_the_report(recorded, loaded, reported) -> None:
    path = recorded("finetune_eval.py", "--eval-every", "3")
    trace = loaded("finetune_eval.py", "--eval-every", "3")
    plain = loaded("finetune_eval.py", "--eval-every", "0")
    report = json.loads(reported(path, json_format=True))
    rows = {r["phase"]: r for r in report["phases"]}
    ref = {r["phase"]: r for r in json.loads(reported(plain.path, json_format=True))["phases"]}
    # the eval passes' device work: the kernels that start inside them
    p, k = trace.phases(), trace.kernels
    evals = p[p["phase"] == "eval"]
    inside = np.zeros(len(k), bool)
    for row in evals.itertuples():
        inside |= ((k["ts"] >= row.ts) & (k["ts"] < row.ts + row.dur)).to_numpy()
    assert rows["eval"]["steps"] == 12 and rows["eval"]["total_ns"] == evals["dur"].sum()
    assert rows["eval"]["device_ns"] == pytest.approx(k.loc[inside, "dur"].sum(), rel=0.02)
    peak = peak_flops(trace.hardware_figures)
    assert rows["eval"]["mfu"] == pytest.approx(
        k.loc[inside, "flops"].sum() / (peak * evals["dur"].sum() / 1e9), rel=0.02)
    # the training steps' own figures: as in the run without eval passes
    for figure in ("median_ns", "device_ns", "mfu", "mbu"):
        assert rows["train"][figure] == pytest.approx(ref["train"][figure], rel=0.1), figure
    assert rows["eval"]["mfu"] != pytest.approx(rows["train"]["mfu"], rel=0.1)
    text = reported(path)
    section = text[text.index("Phases (every recorded step"):]
    median = fmt_ns(evals["dur"].median())
    assert re.search(rf"\neval +12 +{median} ", section), section[:600]


def test_a_plain_training_run_has_only_train(loaded, reported) -> None:
    trace = loaded("finetune_eval.py", "--eval-every", "0")
    p = trace.phases()
    assert set(p["phase"]) == {"train"}
    np.testing.assert_array_equal(p["step"], trace.steps["step"])
    np.testing.assert_array_equal(p["dur"], trace.steps["dur"])
    assert trace.serving().empty
    report = json.loads(reported(trace.path, json_format=True))
    assert [row["phase"] for row in report["phases"]] == ["train"] and not report["serving"]


GENERATE = ("generate.py", "--new-tokens", "16", "--prompt", "24", "--batch", "4")


def test_a_kv_cache_decoder_gives_prefill_then_decode(recorded, loaded, reported) -> None:
    path = recorded(*GENERATE)
    trace = loaded(*GENERATE)
    p = trace.phases()
    assert p["phase"].tolist() == ["prefill"] + ["decode"] * 15  # the 16th token: no call
    assert p["tokens"].tolist() == [4 * 24] + [4] * 15
    sv = trace.serving()
    assert len(sv) == 1
    g = sv.iloc[0]
    assert (g["batch"], g["prompt_tokens"], g["new_tokens"]) == (4, 96, 64)
    prefill, decode = p.iloc[0], p.iloc[1:]
    # a token is ready when its step's kernels end: after the host's step end, and not
    # much later at this size (the host sets the pace)
    assert prefill["dur"] <= g["ttft_ns"] < 1.5 * prefill["dur"]
    assert g["tpot_median_ns"] == pytest.approx(np.median(decode["dur"]), rel=0.25)
    assert g["tpot_median_ns"] <= g["tpot_p90_ns"] < g["ttft_ns"]  # the prompt costs more
    span = (g["ttft_ns"] + decode["dur"].sum()) / 1e9
    assert g["tokens_per_s"] == pytest.approx(64 / span, rel=0.1)
    # the cache grows by one token's keys and values a step: k and v of 2 layers of width
    # 128 in fp32, per sequence, as the allocator counts them
    assert g["kv_bytes_per_token"] == 2 * 2 * 128 * 4
    held = trace.kv_cache()
    assert held["phase"].tolist() == p["phase"].tolist()
    assert (np.diff(held["held_bytes"].to_numpy()[2:]) == 4 * 2048).all()
    assert g["kv_bytes"] == held["held_bytes"].iloc[-1] >= (24 + 14) * 4 * 2048
    # the prompt runs its matmuls on 24 tokens a sequence, a decode step on one: the
    # prefill's FLOP rate is the higher, and decode moves bytes (its MBU) for each token
    k = trace.kernels
    decode_flops = k.loc[k["step"].isin(decode["step"]), "flops"].sum()
    decode_mfu = decode_flops / (peak_flops(trace.hardware_figures) * decode["dur"].sum() / 1e9)
    assert g["prefill_mfu"] > 2 * decode_mfu > 0
    assert 0 < g["decode_mbu"] < 1
    text = reported(path)
    assert "prefill: 1 step" in text and "decode: 15 steps" in text
    assert "time to first token" in text and "KV per token" in text and "2 KiB" in text


def test_a_decoder_without_a_cache_shows_no_kv_cache(recorded, loaded, reported) -> None:
    """Each call feeds the whole sequence so far: what grows in memory is the sequence and
    the call's temporaries, which the report once called a KV cache of 2 KiB a token."""
    path = recorded(*GENERATE, "--no-cache")
    trace = loaded(*GENERATE, "--no-cache")
    p = trace.phases()
    assert p["phase"].tolist() == ["prefill"] + ["decode"] * 15
    assert p["tokens"].tolist() == [4 * 24] + [4] * 15  # one new token a sequence
    g = trace.serving().iloc[0]
    assert not g["kv_cache"] and pd.isna(g["kv_bytes"]) and pd.isna(g["kv_bytes_per_token"])
    assert trace.kv_cache().empty
    assert loaded(*GENERATE).serving()["kv_cache"].tolist() == [True]
    text = reported(path)
    row = text[text.index("Generation (per prefill"):].splitlines()[3]
    assert row.split()[-2:] == ["none", "none"], row


def test_a_compiled_decoder_without_a_cache_is_generation_not_requests(loaded) -> None:
    """A compiled call is one op, whose data flow stopped at it: each call of a compiled
    decoder seemed a request of its own, its steps eval passes, and it was told to serve
    8 of its decode steps as one call, each of which needs the last one's token."""
    trace = loaded(*GENERATE, "--no-cache", "--compile")
    assert trace.phases()["phase"].tolist() == ["prefill"] + ["decode"] * 15
    assert not [f for f in trace.bottlenecks() if f.rule_id == "unbatched_calls"]


def test_without_marks_each_batch_row_is_a_request(recorded, loaded, reported) -> None:
    path = recorded(*GENERATE)
    trace = loaded(*GENERATE)
    rq, g = trace.requests(), trace.serving().iloc[0]
    assert rq["request"].tolist() == ["0/0", "0/1", "0/2", "0/3"]
    assert (rq["tokens"] == 16).all() and (rq["prompt_tokens"] == 24).all()
    assert (rq["ttft_ns"] == g["ttft_ns"]).all() and rq["queue_ns"].isna().all()
    assert (rq["tpot_median_ns"] == g["tpot_median_ns"]).all()
    # all 64 tokens over the generation's time: the end to end latency of each row
    assert rq["e2e_ns"].iloc[0] / 1e9 == pytest.approx(64 / g["tokens_per_s"])
    # the report's request percentiles are for marked requests only: these share figures
    report = json.loads(reported(path, json_format=True))
    assert report["requests"] == [] and report["request_percentiles"] == []


def _rows(shapes: list[tuple[int, int]]) -> list[dict]:
    return [{"phase": "eval", "step": i, "tokens": b * t, "batch": b, "new": t}
            for i, (b, t) in enumerate(shapes)]


@pytest.mark.parametrize("reads_last", [True, None])  # the data flow says so, or is unknown
def test_generation_without_a_cache_grows_by_one_token_a_call(reads_last) -> None:
    rows = _rows([(2, 10), (2, 11), (2, 12), (2, 13)])
    _mark_generation(rows, lambda step, last: reads_last)
    assert [r["phase"] for r in rows] == ["prefill", "decode", "decode", "decode"]
    assert [r["tokens"] for r in rows] == [20, 2, 2, 2]


def test_requests_of_other_lengths_are_eval_passes_not_generation() -> None:
    rows = _rows([(2, 8), (2, 12), (2, 16), (3, 1)])  # infer_loop.py's requests
    _mark_generation(rows, lambda step, last: None)
    assert {r["phase"] for r in rows} == {"eval"}


def test_a_padded_batch_one_token_longer_than_the_last_is_no_decode_step() -> None:
    """A server's padded batches, 38 then 39 tokens long, each uploaded from the host: the
    second reads nothing the first computed, and was taken for its decode step."""
    rows = _rows([(32, 38), (32, 39), (32, 39), (32, 38), (32, 39)])
    _mark_generation(rows, lambda step, last: False)
    assert {r["phase"] for r in rows} == {"eval"}


MARKED = '''
import sys
import neuron_explorer
import torch
sys.path.insert(0, sys.argv[2])
from generate import Decoder

torch.manual_seed(0)
model = Decoder().to("neuron").eval()
prompt = torch.randint(0, 512, (2, 10)).to("neuron")
with neuron_explorer.record(sys.argv[1], level="op"), torch.no_grad():
    with neuron_explorer.phase("prefill"):
        logits, cache = model(ids=prompt)  # keyword arguments: no token ids for the hooks
    with neuron_explorer.phase("decode"):
        for _ in range(5):
            token = logits[:, -1].argmax(-1, keepdim=True)
            token.tolist()
            logits, cache = model(ids=token, cache=cache)
'''


def test_phases_marked_by_hand(tmp_path: Path) -> None:
    script = tmp_path / "marked.py"
    script.write_text(MARKED)
    out = tmp_path / "marked.pftrace"
    env = dict(os.environ, NEURON_HOST_CLOCK="modelled")
    env.pop("NEURON_EXPLORER_RECORD", None)
    proc = subprocess.run([sys.executable, str(script), str(out), str(EXAMPLES)], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    trace = neuron_explorer.load(out)
    p = trace.phases()
    assert p["phase"].tolist() == ["prefill"] + ["decode"] * 5
    assert p["tokens"].isna().all()  # unknown: the model took keyword arguments
    g = trace.serving().iloc[0]
    assert g["ttft_ns"] >= p["dur"].iloc[0] and g["tpot_median_ns"] > 0


TARGETS = '''
import sys
import neuron_explorer
import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64)).to("neuron")
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(32, 64).to("neuron")
with neuron_explorer.record(sys.argv[1], level="op"):
    for step in range(6):
        if sys.argv[2] == "eval":
            model.eval()
        with torch.no_grad():  # the step's targets, from the model itself
            target = model(x) * 0.5
        model.train()
        loss = F.mse_loss(model(x), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
'''


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_a_no_grad_call_in_train_mode_is_the_steps_own_work(tmp_path: Path, mode: str) -> None:
    """A no-grad forward every step on a model in train mode (targets, a teacher's pass, a
    rank's extra work) is the training step's; only one after `model.eval()` is an eval
    pass. Read as eval passes, a DDP rank doing three such forwards a step more than the
    other was shown as the faster rank, and `slowest_rank` named the other."""
    script = tmp_path / "targets.py"
    script.write_text(TARGETS)
    out = tmp_path / f"{mode}.pftrace"
    env = dict(os.environ, NEURON_HOST_CLOCK="modelled")
    env.pop("NEURON_EXPLORER_RECORD", None)
    proc = subprocess.run([sys.executable, str(script), str(out), mode], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    trace = neuron_explorer.load(out)
    # Before the first optimizer step the recorder cannot tell a training loop from an
    # inference loop, and ends a step at the model's first return (step 0, its targets);
    # each later step holds its targets' forward, then its training
    p = trace.phases()
    p = p[p["step"] >= 2]
    recorded = trace.steps.set_index("step")["dur"]
    train = p[p["phase"] == "train"].set_index("step")["dur"]
    assert len(train) == 5
    if mode == "train":
        assert set(p["phase"]) == {"train"}
        assert train.equals(recorded.reindex(train.index))
    else:
        assert len(p[p["phase"] == "eval"]) == 5
        assert (train < 0.9 * recorded.reindex(train.index)).all()
