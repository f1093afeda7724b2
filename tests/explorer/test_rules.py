"""Each bottleneck rule on a trace that shows its problem and on one that does not."""

from __future__ import annotations

import json
from pathlib import Path

import neuron_explorer
import pandas as pd
import pytest
import scenarios
from neuron_explorer.rules import RULE_IDS, Finding
from neuron_explorer.rules import thresholds as th


def _rule(t: neuron_explorer.Trace, rule_id: str) -> list[Finding]:
    return [f for f in t.bottlenecks() if f.rule_id == rule_id]


def _load(sc: scenarios.Scenario, tmp: Path, name: str) -> neuron_explorer.Trace:
    return neuron_explorer.load(sc.write(tmp, name))


def test_clean_trace_has_no_findings(clean_trace: neuron_explorer.Trace) -> None:
    assert clean_trace.bottlenecks() == []


def test_findings_are_ranked_and_complete(basic_pf: neuron_explorer.Trace) -> None:
    fs = basic_pf.bottlenecks()
    lost = {f.rule_id: f.time_lost_ns for f in fs}
    # by time lost, a finding that needs another fix first counted at most as that one
    rank_by = [min(f.time_lost_ns, lost.get(f.after, f.time_lost_ns)) for f in fs]
    assert rank_by == sorted(rank_by, reverse=True)
    # device-time findings on this host-bound trace say their saving needs that fix first
    assert {f.rule_id: f.after for f in fs if f.after} == {
        "fp32_matmul": "host_bound", "memory_bound_ops": "host_bound"}
    for f in fs:
        d = f.to_dict()
        assert set(d) == {"rule_id", "title", "severity", "time_lost_ns", "share_of_step",
                          "evidence", "explanation", "recommendation", "share_base",
                          "symptom_ns", "saving_basis", "after", "steps", "once_ns",
                          "saves_time"}
        assert d["saves_time"] == (f.time_lost_ns > 0)
        assert f.rule_id in RULE_IDS and f.severity in ("high", "medium", "low")
        assert 0 <= f.share_of_step <= 1 and f.recommendation and f.explanation
        for e in f.evidence:
            assert set(e) == {"ts", "dur", "slice_ids", "description"}
        json.dumps(d)


def test_host_bound(tmp_path: Path, clean_trace: neuron_explorer.Trace) -> None:
    sc = scenarios.Scenario()
    sc.step(0, dur=100_000)
    for i in range(20):  # each kernel launched only after the previous one finished
        t = i * 5000
        sc.op(t, 4000, "aten::add", i + 1, 0, kernel=(t + 4500, 300), busy={"vector": 300},
              flops=1000, nbytes=100)
    (f,) = _rule(_load(sc, tmp_path, "hb"), "host_bound")
    assert f.time_lost_ns == 19 * 4700 and f.severity == "high"
    assert "torch.compile" in f.recommendation and len(f.evidence) == th.MAX_EVIDENCE
    assert _rule(clean_trace, "host_bound") == []


def test_a_servers_one_read_per_request_is_kept_and_hidden(tmp_path: Path) -> None:
    """Each step a request, marked, whose answer the host reads once: "read them after the
    loop" would hold every answer to the end (a user's serving loop was told so)."""
    sc = scenarios.basic()
    for n in range(2):
        sc.b.slice(sc.host, n * scenarios.STEP, 9000, f"request {n}", "annotation",
                   {"request": json.dumps([n])})
    (f,) = _rule(_load(sc, tmp_path, "served"), "sync_in_step")
    assert f.recommendation.startswith("Each request's result is read once, as it completes")
    assert "launch the next request's work before reading" in f.recommendation
    assert "after the loop" not in f.recommendation


def test_an_inference_step_reading_its_results_parts_is_told_when_to_keep_the_read(
        tmp_path: Path) -> None:
    """A server answering each request with `int(p.argmax()), float(p.max())`: two reads a
    step at one line, told (as a training loop's metrics) to read them after the loop and
    to keep `loss.detach()` on the device: its steps looked shorter, its last answer came
    no sooner."""
    sc = scenarios.basic()
    sc.b.metadata(sc.host, {"step_boundary": "forward"}, ts=1)
    for n in range(2):
        sc.b.slice(sc.host, n * scenarios.STEP + 8050, 50, "sync", "sync",
                   {"kind": "item", "source": "train.py:42", "device": 0, "step": n})
    (f,) = _rule(_load(sc, tmp_path, "parts"), "sync_in_step")
    assert f.recommendation.startswith("Each step reads its result (train.py:42)")
    assert "(a server), keep that read and hide it" in f.recommendation
    assert "loss" not in f.recommendation


def test_sync_in_step(basic_pf: neuron_explorer.Trace, clean_trace) -> None:
    (f,) = _rule(basic_pf, "sync_in_step")
    # the device idles from the relu kernel's end (6000) to the add kernel (9200) per step,
    # but without the sync the host would be 2 us earlier only (its wait): it needs 8 us
    # a step of its own, the device 3.2, so the host sets the step with or without it
    # (the replay without the syncs says so, as the critical path would)
    assert f.symptom_ns == 6400 and f.time_lost_ns == 4000 and not f.after
    assert f.saving_basis.startswith("replay")
    assert "after you fix the host-bound issue" not in f.explanation
    assert "train.py:42" in f.recommendation and f.evidence[0]["dur"] == 2000
    # the 4 us beside the site is the host's wait
    assert "item at train.py:42 (2x, the host waited 4 us)" in f.explanation
    assert _rule(clean_trace, "sync_in_step") == []
    # the time lost is over the 2 analysed steps: the line says what a step loses too
    # ("32.84 ms lost" once sat beside a 5.5 ms step as if lost in each)
    assert f.steps == 2 and "4 us lost (2 us a step over 2 steps, " in f.line()


def test_the_sync_fix_names_every_site_its_saving_counts(tmp_path: Path) -> None:
    """Syncs at several lines: the fix named the first alone ("Remove the sync at
    s2.py:19") beside a saving that counts all of them. A run without a backward keeps its
    results, not "losses and metrics", on the device."""
    sc = scenarios.basic()
    for n in range(2):
        for k, line in enumerate((43, 44, 45, 46)):
            sc.b.slice(sc.host, n * scenarios.STEP + 8050 + 100 * k, 50, "sync", "sync",
                       {"kind": "cpu", "source": f"train.py:{line}", "device": 0, "step": n})
    (f,) = _rule(_load(sc, tmp_path, "sites"), "sync_in_step")
    assert f.recommendation.startswith(
        "Remove the syncs at train.py:42, train.py:43 and train.py:44 (and 2 more) from "
        "the step: read results (.item(), .cpu(), print) every N steps"), f.recommendation


def test_a_synchronize_for_timing_is_not_told_to_read_less_often(tmp_path: Path) -> None:
    """A `synchronize()` each step reads nothing: a user timing the steps was told to "read
    losses and metrics every N steps". The advice says what it waits for and how to time
    without it."""
    sc = scenarios.Scenario()
    for n in range(4):
        t = sc.step(n)
        sc.op(t + 100, 500, "aten::mm", n + 1, n, kernel=(t + 700, 6000),
              busy={"tensor": 6000}, flops=10**9, nbytes=10**5, instructions=False)
        sc.b.slice(sc.host, t + 700, 6000, "sync", "sync",
                   {"kind": "synchronize", "source": "train.py:30", "device": 0, "step": n})
    (f,) = _rule(_load(sc, tmp_path, "timing"), "sync_in_step")
    assert f.recommendation.startswith("Remove the sync at train.py:30: a synchronize() each "
                                       "step reads nothing"), f.recommendation
    assert "every N steps" not in f.recommendation


def test_host_fallback(tmp_path: Path, clean_trace) -> None:
    sc = scenarios.clean()
    sc.op(9000, 600, "aten::nonzero", 99, 0, fallback=True, source="model.py:3")
    (f,) = _rule(_load(sc, tmp_path, "fb"), "host_fallback")
    assert f.time_lost_ns == 600 and "aten::nonzero" in f.explanation
    # the recommendation names what the user called, and where
    assert "torch.nonzero (at model.py:3)" in f.recommendation
    assert "model.py:3" in f.evidence[0]["description"]
    assert _rule(clean_trace, "host_fallback") == []


def test_host_fallback_hidden_behind_device_work_saves_nothing(tmp_path: Path) -> None:
    """The fallback runs on the host while the device still works through the step's
    matmul, which the host then waits for: without the fallback the step is as long."""
    sc = scenarios.clean()
    sc.op(1000, 600, "aten::nonzero", 99, 0, fallback=True, source="model.py:3")
    sc.b.slice(sc.host, 1700, 8200, "sync", "sync", {"kind": "item", "device": 0, "step": 0})
    trace = _load(sc, tmp_path, "fb_hidden")
    (f,) = _rule(trace, "host_fallback")
    assert f.symptom_ns == 600 and f.time_lost_ns == 0 and f.severity == "low"
    assert f.saving_basis.startswith("replay")
    # the report lists it apart from the ranked findings, not at "0 ns lost" among them
    from neuron_explorer.render import to_text
    from neuron_explorer.report import report_sections
    from neuron_explorer.rules.finding import NO_SAVING_TITLE

    text = to_text("report", report_sections(trace))
    assert text.index(NO_SAVING_TITLE) < text.index("no time to save now")
    assert "aten::nonzero" in text.split(NO_SAVING_TITLE)[1]
    assert ": 0 ns lost" not in text


def test_host_fallback_names_the_module_api(tmp_path: Path) -> None:
    """nn.MultiheadAttention's eval fast path: not "the data pipeline", but the module, its
    line and a replacement the device runs."""
    sc = scenarios.clean()
    sc.op(9000, 600, "aten::_native_multi_head_attention", 99, 0, fallback=True,
          module="model.attn", source="infer.py:21")
    (f,) = _rule(_load(sc, tmp_path, "mha"), "host_fallback")
    assert "data pipeline" not in f.recommendation
    assert "nn.MultiheadAttention" in f.recommendation
    assert "F.scaled_dot_product_attention" in f.recommendation
    assert "model.attn" in f.recommendation and "infer.py:21" in f.recommendation


def test_host_device_copies(tmp_path: Path, clean_trace) -> None:
    sc = scenarios.clean()
    for n in range(2):
        sc.op(n * 10_000 + 9500, 400, "aten::_copy_from", 50 + n, n)
    (f,) = _rule(_load(sc, tmp_path, "copies"), "host_device_copies")
    # 400 us of host time a step, and the device runs 9.3 us of every 10: replayed
    # without the copies, the host ends the steps 800 us earlier, at 19.2 us. Step 1's
    # kernel, launched 400 us earlier, still runs to 19.5, but the device keeps up with
    # the host (9.3 us a step against 9.6): the steps' total, as the report times it
    # (the windows), is 800 us shorter. Counting that last kernel's 300 us past the host,
    # an end of the run rather than a cost per step, the claim was 500 us
    assert f.time_lost_ns == 800 and f.symptom_ns == 800 and "2 of 2 steps" in f.title
    # the line that issues them is named (the copies' ops carry it); the scenario has no
    # backward and no optimizer step: its steps are not training steps (a served request's
    # copies were said to be "in the training steps")
    assert "in the steps at train.py:10 (2x)." in f.explanation
    assert _rule(clean_trace, "host_device_copies") == []


def test_an_inference_loop_is_not_called_a_training_step(tmp_path: Path) -> None:
    sc = scenarios.clean()
    sc.b.metadata(sc.host, {"step_boundary": "forward"}, ts=1)
    for n in range(2):
        sc.op(n * 10_000 + 9500, 400, "aten::_copy_from", 50 + n, n)
    (f,) = _rule(_load(sc, tmp_path, "infer_copies"), "host_device_copies")
    # a step is the code from one call's return to the next: a copy before the call is
    # in the loop, not "inside the forward call"
    assert "in the loop's iterations" in f.explanation and "training" not in f.explanation
    assert "forward call" not in f.explanation


def test_host_device_copies_on_kineto(load_real) -> None:
    t = load_real("mtia_trace_single_rank__mtia_rank_0.json.gz")
    (f,) = _rule(t, "host_device_copies")
    assert f.time_lost_ns > 0 and "1 of 1 steps" in f.title


def test_dataloader_stall(basic_pf: neuron_explorer.Trace, clean_trace) -> None:
    (f,) = _rule(basic_pf, "dataloader_stall")
    assert f.time_lost_ns == 2000 and "num_workers" in f.recommendation
    assert _rule(clean_trace, "dataloader_stall") == []


def test_memory_bound_ops(basic_pf: neuron_explorer.Trace, clean_trace) -> None:
    (f,) = _rule(basic_pf, "memory_bound_ops")
    # relu: 1000 ns each, ideal 1000 FLOPs / 1e14 = 0.01 ns; add: 200 ns, same FLOPs
    assert f.time_lost_ns == pytest.approx(2 * (1000 + 200), abs=1)
    # no op keys: nothing replays the fixes, and the basis says the figure is a bound
    assert f.saving_basis.startswith("estimate: at most")
    assert "aten::relu" in f.explanation
    assert _rule(clean_trace, "memory_bound_ops") == []


def test_memory_bound_ops_leaves_host_fallbacks_to_their_rule(tmp_path: Path) -> None:
    """An op that ran on the host spends its device time on the round trip, not on memory
    bandwidth: a compiled graph holding an FFT read 33 FLOP/byte and 340 us a step, and
    28.5 us once the FFT ran on the device."""
    sc = scenarios.Scenario()
    for n in range(2):
        t = sc.step(n)
        sc.op(t, 500, "graph:1", n + 1, n, kernel=(t + 600, 8000), busy={"dma": 1000},
              flops=1000, nbytes=1_000_000, fallback=True, instructions=False)
    trace = _load(sc, tmp_path, "fallback")
    assert trace.roofline().loc[0, "bound"] == "memory"  # by its intensity alone
    assert _rule(trace, "memory_bound_ops") == []


def test_memory_bound_dma_dominated(tmp_path: Path) -> None:
    sc = scenarios.Scenario()
    sc.step(0)
    sc.op(0, 100, "aten::gather", 1, 0, kernel=(200, 9000), busy={"gpsimd": 1000, "dma": 8000},
          instructions=False)
    (f,) = _rule(_load(sc, tmp_path, "dma"), "memory_bound_ops")
    assert f.symptom_ns == 9000 and "DMA" in f.evidence[0]["description"]
    # the host's step (10 us, no wait on the device) is longer than the kernel: a faster
    # device would not shorten it
    assert f.time_lost_ns == 0 and "host's own work" in f.explanation


def test_tensor_engine_padding(basic_pf: neuron_explorer.Trace, clean_trace) -> None:
    """20% of basic_pf's Tensor Engine time is padding, but its odd dim, 100, is one tile
    at any size: no change to it saves time (raised to 128 the tile does more work in
    the same time), so it is no finding (it was one, at 0 ns lost, ranked beside those
    that save time)."""
    assert _rule(basic_pf, "tensor_engine_padding") == []
    assert _rule(clean_trace, "tensor_engine_padding") == []


@pytest.mark.parametrize(("shapes", "odd", "saved"), [
    # 130 features need two tiles where 128 need one: the extra tile is time saved
    ("[[4096, 130], [130, 130]]", "[130]", True),
    # a vocabulary of 1000 is 7 tiles and 104 of 128: the 896 below would be another model,
    # not a tuning (a decoder's LM head was claimed 580 us for it)
    ("[[2, 256], [256, 1000]]", "[2, 1000]", False),
])
def test_tensor_engine_padding_saves_the_tiles_of_a_dim_just_past_a_multiple(
        tmp_path, shapes: str, odd: str, saved: bool) -> None:
    sc = scenarios.Scenario()
    for n in range(2):
        t = sc.step(n)
        sc.op(t, 500, "aten::mm", n + 1, n, kernel=(t + 600, 8000), busy={"tensor": 8000},
              flops=1_000_000, hw_flops=4_000_000, nbytes=1000, shapes=shapes,
              instructions=False)
    found = _rule(_load(sc, tmp_path, f"padding_{saved}"), "tensor_engine_padding")
    # 128 instead of 130 saves all of it; nothing but another model shrinks the vocabulary
    assert len(found) == saved
    if saved:
        (f,) = found
        assert f.symptom_ns == f.time_lost_ns == 2 * 6000  # 75% of each 8 us kernel
        assert odd in f.explanation and "work for free" in f.explanation
        assert "multiple of 128" in f.recommendation


def test_fp32_matmul(basic_pf: neuron_explorer.Trace, clean_trace) -> None:
    (f,) = _rule(basic_pf, "fp32_matmul")
    assert f.time_lost_ns == 3000  # 4000 ns of FP32 matmul at 4x the BF16 cost
    assert "bfloat16" in f.recommendation
    assert _rule(clean_trace, "fp32_matmul") == []


def test_engine_imbalance(tmp_path: Path, clean_trace) -> None:
    for host_waits in (True, False):
        sc = scenarios.Scenario()
        for n in range(2):
            t = sc.step(n)
            sc.op(t, 100, "aten::softmax", n + 1, n, kernel=(t + 200, 9500),
                  busy={"vector": 9000, "scalar": 500}, flops=10**9, nbytes=10**5,
                  instructions=False)
            if host_waits:  # .item() on the result: the device sets the step
                sc.b.slice(sc.host, t + 300, 9400, "sync", "sync",
                           {"kind": "item", "device": 0, "step": n})
        (f,) = _rule(_load(sc, tmp_path, f"imb{host_waits}"), "engine_imbalance")
        assert f.title.startswith("Vector Engine saturated")
        # each kernel's vector work could shrink to its scalar work's: 9000 - 500 ns, twice
        assert f.symptom_ns == 2 * (9000 - 500)
        # which the steps save only where the device sets their length
        assert f.time_lost_ns == (f.symptom_ns if host_waits else 0)
        # no advised fix reaches it for sure: an upper bound, said so
        assert f.saving_basis.startswith("estimate: at most") and "upper bound" in f.explanation
    assert _rule(clean_trace, "engine_imbalance") == []


def test_small_dma(tmp_path: Path, basic_pf) -> None:
    sc = scenarios.clean()
    for i in range(20):
        sc.b.slice(sc.dma, 1000 + i * 400, 300, "DmaLoad", "dma",
                   {"kernel_id": 1, "engine": "dma.0", "opcode": "DmaLoad", "bytes": 512})
    sc.b.slice(sc.dma, 9000, 700, "DmaLoad", "dma",
               {"kernel_id": 1, "engine": "dma.0", "opcode": "DmaLoad", "bytes": 10**6})
    (f,) = _rule(_load(sc, tmp_path, "dma_small"), "small_dma")
    # one of 16 engines moves 1e11/16 B/s: 512 B need 81.92 ns, the rest of each 300 ns
    # transfer is fixed cost, and no compute runs beside them (the clean kernel has no
    # instructions)
    assert f.symptom_ns == pytest.approx(20 * (300 - 81.92), abs=1)
    assert f.time_lost_ns == 0  # the host's own 10 us steps are longer than the device's
    assert "20 small DMA" in f.title
    # where they come from and what a script changes ("use larger tiles" named nothing)
    assert f.recommendation.startswith("The small transfers come from eager ops 100%: "
                                       "compile the code that runs the eager ones ("), \
        f.recommendation
    assert "fused=True" not in f.recommendation
    assert _rule(basic_pf, "small_dma") == []


def test_small_dma_hidden_behind_compute(tmp_path: Path) -> None:
    sc = scenarios.clean()
    sc.b.slice(sc.engines["tensor"], 900, 8200, "Inst", "instruction",
               {"kernel_id": 1, "engine": "tensor", "opcode": "Inst"})
    for i in range(20):
        sc.b.slice(sc.dma, 1000 + i * 400, 300, "DmaLoad", "dma",
                   {"kernel_id": 1, "engine": "dma.0", "opcode": "DmaLoad", "bytes": 512})
    assert _rule(_load(sc, tmp_path, "dma_hidden"), "small_dma") == []


def test_small_dma_counts_transfers_small_in_bytes_and_not_the_tiles_of_large_tensors(
        tmp_path: Path) -> None:
    """With the fixed cost in the figures (300 ns; an engine moves 1e11/16 B/s, 1,875 B in
    that time): 512 B transfers of an op on small tensors are small; the same of an op on a
    64 MiB tensor are its tiles, left out and said so; 10 kB transfers taking 2.5x their
    time alone (the bandwidth they share with others in flight) are not small."""
    sc = scenarios.Scenario()
    sc.b.metadata(sc.host, {"hardware_figures": {**scenarios.FIGURES, "dma_fixed_ns": 300}})
    layouts = [("[[16, 16]]", 512, 300, 20), ("[[4096, 4096]]", 512, 300, 20),
               ("[[16, 16]]", 10_000, 4000, 2)]
    for n, (shapes, nbytes, dur, count) in enumerate(layouts):
        t = sc.step(n)
        sc.op(t, 500, "aten::add", n + 1, n, kernel=(t + 600, 9000), shapes=shapes,
              dtypes="[float32]", instructions=False)
        for i in range(count):
            sc.b.slice(sc.dma, t + 1000 + i * max(400, dur + 100), dur, "DmaLoad", "dma",
                       {"kernel_id": n + 1, "engine": "dma.0", "opcode": "DmaLoad",
                        "bytes": nbytes})
    (f,) = _rule(_load(sc, tmp_path, "dma_tiles"), "small_dma")
    assert f.title == "20 small DMA transfers"
    # the small tensors' transfers (step 0) only
    assert f.evidence and all(e["ts"] < scenarios.STEP for e in f.evidence)
    assert f.symptom_ns == pytest.approx(20 * 300)  # all fixed cost, nothing beside them
    assert "Left out: 20 small transfers of ops with a tensor of 29 KiB or more" in \
        f.explanation


def test_recompilation(tmp_path: Path, basic_pf) -> None:
    sc = scenarios.basic()
    sc.b.slice(sc.host, 15_100, 400, "dynamo", "compile", {"graph_id": 2})
    sc.b.instant(sc.host, 15_050, "graph_break", "graph_break",
                 {"reason": "print() in forward", "source": "model.py:12"})
    sc.b.instant(sc.host, 15_060, "recompile", "recompile", {"reason": "x.size(0) changed"})
    (f,) = _rule(_load(sc, tmp_path, "recomp"), "recompilation")
    assert f.time_lost_ns == 400 and "model.py:12" in f.recommendation
    assert "print() in forward" in f.explanation
    # compile time is a share of what the rule declares, not of the steps it lies outside
    assert f.share_base == "the recorded steps" and "of the recorded steps)" in f.line()
    assert _rule(basic_pf, "recompilation") == []


@pytest.mark.parametrize("clock", ["measured", "modelled"])
def test_the_programs_own_ops_inside_a_compile_are_not_compile_time(tmp_path: Path,
                                                                    clock: str) -> None:
    """A frame's first call runs its eager parts inside the span that compiles it (an
    optimizer making its state between the graphs Dynamo breaks around it): those ops are
    the program's work, compiled or not. 120 of them made a modelled run's graph breaks
    "4.44 ms lost", where the modelled clock counts no compiling at all."""
    sc = scenarios.basic()
    if clock == "modelled":
        sc.b.metadata(sc.host, {"host_clock": {"source": "modelled"}})
    sc.b.slice(sc.host, 15_100, 400, "dynamo", "compile", {"graph_id": 2})
    sc.op(15_150, 250, "aten::zero_", 90, 1, source="adamw.py:1")
    sc.b.instant(sc.host, 15_050, "graph_break", "graph_break",
                 {"reason": "print() in forward", "source": "model.py:12"})
    trace = _load(sc, tmp_path, f"own_ops_{clock}")
    assert trace.metadata.get("host_clock", {}).get("source", "measured") == clock
    (f,) = _rule(trace, "recompilation")
    compiling = 150 if clock == "measured" else 0  # the span less the op
    assert f.symptom_ns == compiling and f.time_lost_ns == compiling
    assert int(trace.compile_summary()["totals"]["compile_ns"].iloc[0]) == compiling


def test_a_read_inside_torchs_transformer_is_no_debugging_line_of_the_users(
        tmp_path: Path) -> None:
    """nn.Transformer reads its mask to check it is causal: compiled, a trial's seq2seq
    model broke there and was told to remove "a debugging line left in" at its call of the
    model; passing tgt_is_causal=True removed the break and saved what was claimed."""
    sc = scenarios.basic()
    sc.b.slice(sc.host, 15_100, 400, "dynamo", "compile", {"graph_id": 2})
    sc.b.instant(sc.host, 15_050, "graph_break", "graph_break", {
        "reason": "Unsupported Tensor.item() call with capture_scalar_outputs=False",
        "source": "seq2seq.py:15 in forward",
        "within": "torch/nn/modules/transformer.py:1245 in _detect_is_causal_mask"})
    (f,) = _rule(_load(sc, tmp_path, "torch_read"), "recompilation")
    assert "debugging line" not in f.recommendation, f.recommendation
    assert "inside torch's own `_detect_is_causal_mask`" in f.recommendation
    assert "tgt_is_causal=True" in f.recommendation


def test_a_compiled_optimizer_steps_own_breaks_are_not_the_users_to_fix(tmp_path: Path) -> None:
    """torch's Optimizer.step breaks the graph around its update on purpose, and its state,
    made on the first step, recompiles the second once: a compiled optimizer step has them
    whatever the user's code does. The advice says so, where it told the user to fix
    breaks at the line calling opt.step(); a break of the user's own is still theirs."""
    sc = scenarios.basic()
    sc.b.slice(sc.host, 15_100, 400, "dynamo", "compile", {"graph_id": 2})
    for ts in (15_050, 15_055):
        sc.b.instant(sc.host, ts, "graph_break", "graph_break",
                     {"reason": "Call to `torch._dynamo.graph_break()`: User-inserted graph "
                      "break", "source": "train.py:25 in opt_step",
                      "within": "torch/optim/optimizer.py:85 in _use_grad"})
    sc.b.instant(sc.host, 15_060, "recompile", "recompile",
                 {"reason": "len(self.state[list(dict.keys(self.state))[0]]) != 0",
                  "source": "/venv/torch/optim/sgd.py:415 in _multi_tensor_sgd"})
    (f,) = _rule(_load(sc, tmp_path, "optim"), "recompilation")
    assert f.recommendation.startswith("The graph breaks at train.py:25 in opt_step are "
                                       "torch's own: Optimizer.step breaks the graph")
    assert "fix the graph breaks" not in f.recommendation.lower()
    # compiled, its update fuses: no advice to take it out of the compiled function
    assert "its update still runs compiled; nothing to fix" in f.recommendation
    assert "leave the optimizer's step out" not in f.recommendation
    assert f.time_lost_ns == 0 and f.severity == "low"  # its 400 ns compile: no fix saves it
    assert "is the optimizer's: its state is made on its first step" in f.recommendation
    sc.b.instant(sc.host, 15_070, "graph_break", "graph_break",
                 {"reason": "print() in forward", "source": "model.py:12"})
    (mixed,) = _rule(_load(sc, tmp_path, "optim_and_user"), "recompilation")
    assert mixed.recommendation.startswith("Fix the graph breaks at model.py:12 (")
    assert "train.py:25 in opt_step are torch's own" in mixed.recommendation


def test_a_compiled_ddp_wrapper_is_told_to_compile_the_module_it_wraps(tmp_path: Path) -> None:
    """torch.compile(DDP(model)) runs eagerly: Dynamo skips DDP's forward. The report said
    only "graph breaks" and told the host-bound run to wrap the model in torch.compile,
    which the user had done."""
    sc = scenarios.basic()
    sc.b.slice(sc.host, 15_100, 400, "dynamo", "compile", {})
    sc.b.instant(sc.host, 15_050, "graph_break", "graph_break",
                 {"reason": "Attempted to call function marked as skipped: Dynamo developers "
                  "have intentionally marked that the function "
                  "`DistributedDataParallel._inside_ddp_forward` in file torch/_compile.py "
                  "should not be traced", "source": "train.py:30 in <module>"})
    trace = _load(sc, tmp_path, "ddp_wrapper")
    (f,) = _rule(trace, "recompilation")
    assert f.recommendation.startswith("Compile the module DDP wraps, not the wrapper")
    from neuron_explorer.rules.host_bound import _launch_advice

    assert "wrap the module DDP wraps (DDP(torch.compile(model))" in _launch_advice(trace)


def test_the_ddp_optimizers_graph_splits_are_not_breaks_to_fix(tmp_path: Path) -> None:
    """DDP(torch.compile(model)): Dynamo splits the graph at DDP's buckets on purpose and
    reports each split as a graph break. "Fix the graph breaks at train.py:39" with 0.95
    ms a step claimed: merging them (optimize_ddp=False) saved half of it, or ran slower."""
    sc = scenarios.basic()
    for ts in (15_050, 15_055):
        sc.b.instant(sc.host, ts, "graph_break", "graph_break",
                     {"reason": "DDPOptimizer intentional graph-break (See Note "
                      "[DDPOptimizer]). Set `torch._dynamo.config.optimize_ddp = False` to "
                      "disable.", "source": "train.py:39 in main",
                      "within": "torch/_dynamo/backends/distributed.py:600 in compile_fn"})
    (f,) = _rule(_load(sc, tmp_path, "ddp_split"), "recompilation")
    assert f.recommendation.startswith("The graph breaks DDPOptimizer reports are Dynamo's "
                                       "own"), f.recommendation
    assert "fix the graph breaks" not in f.recommendation.lower()
    assert f.time_lost_ns == 0


def test_recompile_hidden_behind_device_work_saves_nothing(tmp_path: Path) -> None:
    """A recompile while the device still runs the step's matmul, which the host then
    waits for: the compile is off the step's critical path."""
    sc = scenarios.clean()
    sc.b.slice(sc.host, 1000, 400, "dynamo", "compile", {"graph_id": 2})
    sc.b.instant(sc.host, 1000, "recompile", "recompile", {"reason": "x.size(0) changed"})
    sc.b.slice(sc.host, 1500, 8400, "sync", "sync", {"kind": "item", "device": 0, "step": 0})
    (f,) = _rule(_load(sc, tmp_path, "recomp_hidden"), "recompilation")
    assert f.symptom_ns == 400 and f.time_lost_ns == 0


def test_recompilation_storm(tmp_path: Path) -> None:
    sc = scenarios.clean()
    for i in range(th.RECOMPILE_STORM):
        sc.b.instant(sc.host, 25_000 + i, "recompile", "recompile", {"reason": "shape"})
    (f,) = _rule(_load(sc, tmp_path, "storm"), "recompilation")
    assert f.title.startswith("Recompilation storm")


def test_compile_dominates(tmp_path: Path, basic_pf) -> None:
    sc = scenarios.clean()
    sc.b.slice(sc.host, 20_000, 50_000, "dynamo", "compile", {"graph_id": 1})
    (f,) = _rule(_load(sc, tmp_path, "compile"), "compile_dominates")
    assert f.time_lost_ns == 50_000 and f.severity == "high"
    assert _rule(basic_pf, "compile_dominates") == []


def test_memory_near_capacity(tmp_path: Path, basic_pf) -> None:
    sc = scenarios.basic()
    sc.b.counter(sc.hbm, 12_000, 980_000_000)
    (f,) = _rule(_load(sc, tmp_path, "mem"), "memory_near_capacity")
    assert f.severity == "high" and "98%" in f.title and "aten::mm" in f.explanation
    # no optimizer and no backward: nothing is kept for a backward, so no checkpointing
    assert "mem_get_info" in f.recommendation and "checkpoint" not in f.recommendation
    assert _rule(basic_pf, "memory_near_capacity") == []
    # a training run: its activations are what to cut
    sc.b.slice(sc.host, 9_600, 300, "AdamW.step", "optimizer", {"step": 0})
    (f,) = _rule(_load(sc, tmp_path, "mem_training"), "memory_near_capacity")
    assert "checkpoint" in f.recommendation and "gradient accumulation" in f.recommendation


@pytest.mark.parametrize("name", ["amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz",
                                  "trace_filter__sampled_rank-0.json.gz"])
def test_rules_on_kineto_traces(load_real, name: str) -> None:
    fs = load_real(name).bottlenecks()
    ids = {f.rule_id for f in fs}
    assert "host_bound" in ids  # these small GPU workloads leave the device waiting
    assert not ids & {"engine_imbalance", "small_dma", "tensor_engine_padding"}


def test_work_after_the_last_step_belongs_to_no_step(tmp_path: Path) -> None:
    # the final loss.item() after the loop: recorded with the number of a step never begun
    sc = scenarios.clean()
    sc.op(25_000, 400, "aten::_local_scalar_dense", 77, 2, kernel=(25_500, 300),
          busy={"vector": 300})
    t = _load(sc, tmp_path, "tail")
    assert list(t.steps["step"]) == [0, 1]
    assert t.ops.loc[t.ops["op_id"] == 77, "step"].tolist() == [-1]
    assert t.kernels.loc[t.kernels["op_id"] == 77, "step"].tolist() == [-1]


# -- findings that fit the script (issue 12, item 4) -------------------------------------


def _host_bound_fp32(fp32_share: float) -> scenarios.Scenario:
    """A host-bound step of 200 us: 20 matmuls of 500 ns on the device, each launched after
    the device went idle; `fp32_share` of them ran in float32, the rest in bfloat16."""
    sc = scenarios.Scenario()
    sc.step(0, dur=200_000)
    n_fp32 = round(20 * fp32_share)
    for i in range(20):
        t = i * 5000
        dtypes = "[float32, float32]" if i < n_fp32 else "[bfloat16, bfloat16]"
        sc.op(t, 4000, "aten::bmm", i + 1, 0, kernel=(t + 4400, 500), busy={"tensor": 500},
              flops=1000, nbytes=100, dtypes=dtypes, module="model.attn",
              source="model.py:27")
    return sc


def test_fp32_matmul_judged_on_device_time_in_host_bound_run(tmp_path: Path) -> None:
    """Under autocast the attention bmm ran in fp32: 40% of matmul device time, 1.5% of a
    host-bound step (0.75 * 4000 ns lost of 200 us: below the step-share threshold)."""
    t = _load(_host_bound_fp32(0.4), tmp_path, "fp32_hb")
    assert _rule(t, "host_bound")
    (f,) = _rule(t, "fp32_matmul")
    assert f.time_lost_ns == 3000
    assert "after you fix the host-bound issue, this is next" in f.explanation
    assert "bfloat16 (autocast" in f.explanation  # other matmuls did run in bf16
    assert "aten::bmm in model.attn at model.py:27" in f.recommendation


def test_fp32_attention_bmm_under_autocast_is_flagged(tmp_path: Path) -> None:
    """As recorded from nn.MultiheadAttention under autocast: the attention bmm in fp32 is
    half the matmul device time but 7% of the device's busy time (the optimizer and the
    elementwise ops take the rest) and a sliver of the host-bound step."""
    sc = _host_bound_fp32(0.5)
    sc.op(150_000, 1000, "aten::_foreach_add_", 99, 0, kernel=(151_000, 60_000),
          busy={"vector": 60_000}, dtypes="[float32]")
    (f,) = _rule(_load(sc, tmp_path, "fp32_attn"), "fp32_matmul")
    assert "50% of matmul time" in f.explanation


def test_fp32_matmul_not_flagged_when_a_small_part_of_device_time(tmp_path: Path) -> None:
    t = _load(_host_bound_fp32(0.05), tmp_path, "fp32_small")  # 1 of 20: 5% of device time
    assert _rule(t, "fp32_matmul") == []


def _waits_on_workers(workers: list[int]) -> scenarios.Scenario:
    """Steps whose first 4 us wait for a batch (the step is 10 us), each from `workers[n]`."""
    sc = scenarios.Scenario()
    for n, worker in enumerate(workers):
        t = sc.step(n)
        sc.b.slice(sc.host, t, 4000, "DataLoader.__next__", "dataloader",
                   {"step": n, "batch": n, "worker": worker})
        sc.op(t + 4000, 500, "aten::mm", n + 1, n, kernel=(t + 4600, 5000),
              busy={"tensor": 5000}, flops=900_000_000, nbytes=100_000, instructions=False)
    return sc


def test_dataloader_finding_names_the_worker_behind_the_waits(tmp_path: Path) -> None:
    (f,) = _rule(_load(_waits_on_workers([1, 1, 1, 0]), tmp_path, "slow_worker"),
                 "dataloader_stall")
    assert "Worker 1 is behind 75% of the wait" in f.explanation
    assert all("from DataLoader worker" in e["description"] for e in f.evidence)
    (even,) = _rule(_load(_waits_on_workers([0, 1, 0, 1]), tmp_path, "even_workers"),
                    "dataloader_stall")
    assert "spread over 2 workers" in even.explanation and "Worker 0 is" not in even.explanation


def test_a_loader_with_workers_is_not_told_to_add_workers(tmp_path: Path,
                                                          basic_pf: neuron_explorer.Trace) -> None:
    """Waits that name workers: the loader has them already (four of them, persistent, slowed
    a user's 2-core run and the finding said to set them again). It says they do not keep up,
    to make batches cheaper, and that its saving is not what more workers give."""
    (f,) = _rule(_load(_waits_on_workers([0, 1, 0, 1]), tmp_path, "workers"), "dataloader_stall")
    assert "num_workers=4" not in f.recommendation
    assert f.recommendation.startswith("The loader's worker processes (the waits met 2) do not "
                                       "keep up")
    assert "index whole batches" in f.recommendation and "idle cores" in f.recommendation
    assert "which more workers may not give" in f.saving_basis
    (plain,) = _rule(basic_pf, "dataloader_stall")  # no workers: add them
    assert "give your DataLoader num_workers=4 or more" in plain.recommendation
    assert "more workers may not give" not in plain.saving_basis


def test_worker_advice_fits_the_cores_of_the_machine_recorded_on(tmp_path: Path) -> None:
    """A user's 2-core run was told num_workers=4 or more; there, 2 workers saved 14.8 of the
    17.5 ms claimed and more of them compete with the training loop. The recording names its
    cores; the advice asks for as many workers as that, and four where the machine has
    them."""
    (two,) = _rule(_load(_loader_without_workers(2, 4000), tmp_path, "cpus2"),
                   "dataloader_stall")
    assert "num_workers=2 (the machine it ran on has 2 cores" in two.recommendation
    assert "num_workers=4" not in two.recommendation
    for cpus in (16, None):  # enough cores, or a recording that does not say
        (f,) = _rule(_load(_loader_without_workers(cpus, 4000), tmp_path, f"cpus{cpus}"),
                     "dataloader_stall")
        assert "num_workers=4 or more" in f.recommendation


def _loader_without_workers(cpus: int | None, wait: int) -> scenarios.Scenario:
    """Steps that each wait `wait` ns for a batch the main process loads, then run a
    matmul (`host_cpus`: the cores the recording names, where not None)."""
    sc = scenarios.Scenario()
    if cpus is not None:
        sc.b.metadata(sc.host, {"host_cpus": cpus})
    for n in range(4):
        t = sc.step(n)
        sc.b.slice(sc.host, t, wait, "DataLoader.__next__", "dataloader", {"step": n})
        sc.op(t + wait, 300, "aten::mm", n + 1, n, kernel=(t + wait + 400, 500),
              busy={"tensor": 500}, flops=900_000, nbytes=100_000, instructions=False)
    return sc


def test_worker_count_and_saving_follow_the_loaders_pace(tmp_path: Path) -> None:
    """A user's step of 3.4 ms waited 52.5 ms for each batch, loaded by the main process.
    The finding said num_workers=2 (the machine's cores) and claimed the whole wait; two
    workers load a batch every 26 ms at best. Here a batch takes 9 us to load and a step
    1 us besides: 9 workers keep up; 2 leave 9 / 2 - 1 = 3.5 us of each wait."""
    (two,) = _rule(_load(_loader_without_workers(2, 9000), tmp_path, "slow2"),
                   "dataloader_stall")
    (enough,) = _rule(_load(_loader_without_workers(None, 9000), tmp_path, "slow"),
                      "dataloader_stall")
    assert "num_workers=9 (that many keep up: a batch takes 9 us to load, a step 1 us " \
           "without its waits)" in enough.recommendation
    assert "num_workers=2 (the machine it ran on has 2 cores" in two.recommendation
    assert "keeping up needs about 9" in two.recommendation
    assert "with 2, steps still wait 3.5 us each" in two.recommendation
    assert "each wait cut to 3.5 us, what 2 workers leave of it" in two.saving_basis
    # a trial's loader that kept up waited about 1 ms a batch to receive it: said, not claimed
    assert "not counted: the main process's own time to receive each batch" in \
        enough.saving_basis
    assert enough.time_lost_ns == pytest.approx(4 * 9000, rel=0.01)  # every wait
    assert two.time_lost_ns == pytest.approx(4 * (9000 - 3500), rel=0.01)


@pytest.mark.parametrize(("first_worker_batch", "blamed"), [(3000, False), (6000, True)])
def test_the_first_worker_of_each_round_is_not_blamed_for_batches_as_long_as_the_others(
        tmp_path: Path, first_worker_batch: int, blamed: bool) -> None:
    """Two workers of equal batches start together and finish together: the waits fall
    on worker 0, first in each round. A trial's 12 traces of 2 and 4 such workers all
    named worker 0 as the slow one; it is only where its batches take longer."""
    sc = _waits_on_workers([0, 0, 0, 1])
    for worker, length in ((0, first_worker_batch), (1, 3000)):
        pid = 200 + worker
        track = sc.b.thread(pid=pid, tid=pid, name=f"DataLoader worker {worker}",
                            process=f"DataLoader worker {worker} (pid {pid})")
        for n in range(4):
            sc.b.slice(track, n * scenarios.STEP, length, f"batch {2 * n + worker}",
                       "dataloader_worker", {"batch": 2 * n + worker, "worker": worker})
    (f,) = _rule(_load(sc, tmp_path, f"rounds_{first_worker_batch}"), "dataloader_stall")
    assert ("Worker 0 is behind 75% of the wait" in f.explanation) == blamed
    assert ("whose batches take no longer than the others'" in f.explanation) == (not blamed)


def _worker_batches(sc: scenarios.Scenario, fetch: int, collate: int) -> None:
    """Worker 1's batches as the recorder writes them: fetching, then collating."""
    track = sc.b.thread(pid=200, tid=200, name="DataLoader worker 1",
                        process="DataLoader worker 1 (pid 200)")
    for n in range(4):
        t = n * scenarios.STEP
        sc.b.slice(track, t, fetch + collate, f"batch {n}", "dataloader_worker",
                   {"batch": n, "worker": 1})
        sc.b.slice(track, t, fetch, "fetch samples", "dataloader_worker")
        sc.b.slice(track, t + fetch, collate, "collate", "dataloader_worker")


@pytest.mark.parametrize(("fetch", "collate", "said", "advice"), [
    (3000, 200, "fetching samples (the Dataset's __getitem__) takes 94%", None),
    (300, 2900, "collating them into a batch (the DataLoader's collate_fn) takes 91%",
     "make collating cheaper"),
    (1600, 1500, "fetching and collating take about equal parts", None),
])
def test_dataloader_finding_names_the_slow_part_of_a_batch(tmp_path: Path, fetch, collate,
                                                            said, advice) -> None:
    sc = _waits_on_workers([1, 1, 1, 1])
    _worker_batches(sc, fetch, collate)
    (f,) = _rule(_load(sc, tmp_path, f"phase_{fetch}"), "dataloader_stall")
    assert said in f.explanation
    assert ("make collating cheaper" in f.recommendation) == (advice is not None)


def test_dataloader_finding_does_not_recommend_pin_memory(basic_pf) -> None:
    (f,) = _rule(basic_pf, "dataloader_stall")
    assert "pin_memory" not in f.recommendation and "DataLoader" in f.recommendation


def test_recompile_without_graph_breaks_does_not_say_fix_the_graph_breaks(tmp_path) -> None:
    sc = scenarios.basic()
    sc.b.slice(sc.host, 15_100, 400, "dynamo", "compile", {"graph_id": 2})
    sc.b.instant(sc.host, 15_060, "recompile", "recompile",
                 {"reason": "tensor 'idx' size mismatch at index 1", "source": "infer.py:20"})
    (f,) = _rule(_load(sc, tmp_path, "recomp_only"), "recompilation")
    assert "graph break" not in f.recommendation.lower() and "graph break" not in f.title
    assert "infer.py:20" in f.recommendation and "mark_dynamic" in f.recommendation
    assert f.title == "1 recompile in steps"


def test_an_input_made_outside_inference_mode_is_named_as_the_recompiles_cause(
        tmp_path) -> None:
    """A prompt made before `with torch.inference_mode():` and the calls after it inside:
    Dynamo's guard on the input's dispatch keys fails (an inference tensor lacks
    ADInplaceOrView). The advice was to keep "guarded values" constant, or pass tensors
    for Python numbers."""
    sc = scenarios.basic()
    sc.b.slice(sc.host, 15_100, 400, "dynamo", "compile", {"graph_id": 2})
    sc.b.instant(sc.host, 15_150, "recompile", "recompile", {
        "reason": "0/0: tensor 'ids' dispatch key set mismatch. expected "
                  "DispatchKeySet(PrivateUse1, BackendSelect, ADInplaceOrView), actual "
                  "DispatchKeySet(PrivateUse1, BackendSelect)",
        "source": "gen.py:24 in forward"})
    (f,) = _rule(_load(sc, tmp_path, "inference_mode"), "recompilation")
    assert f.recommendation.startswith("The recompile at gen.py:24 in forward follows how "
                                       "`ids` was made: in one call outside "
                                       "torch.inference_mode() and in another inside it")
    assert "guarded values" not in f.recommendation


def test_decodings_first_new_sizes_recompile_once_and_are_nothing_to_fix(
        tmp_path, monkeypatch) -> None:
    """A compiled decoder: the prompt's 16 tokens give way to one a step (idx), then the
    cache grows (cache[0][0]), each recompiling once before Dynamo makes the dim dynamic.
    dynamic=True and mark_dynamic compiled more and slower (a user measured 0.8 -> 1.95 ms
    a token): the finding says there is nothing to fix and claims no time. Outside a
    generation's decode steps (a smaller last batch) the one recompile is what is saved."""
    sc = scenarios.basic()
    sc.b.slice(sc.host, 15_100, 400, "dynamo", "compile", {"graph_id": 2})
    sc.b.instant(sc.host, 15_150, "recompile", "recompile",
                 {"reason": "0/0: tensor 'idx' size mismatch at index 1. expected 16, actual 1",
                  "source": "decode.py:43 in forward"})
    sc.b.instant(sc.host, 15_160, "recompile", "recompile",
                 {"reason": "0/1: tensor 'cache[0][0]' size mismatch at index 2. expected 16, "
                  "actual 17", "source": "decode.py:43 in forward"})
    trace = _load(sc, tmp_path, "decoding")
    steps = trace.compile_summary()["recompiles"]["step"].tolist()
    monkeypatch.setattr(trace, "phases", lambda: pd.DataFrame(
        {"phase": ["decode"] * 4, "step": range(4)}))
    (f,) = _rule(trace, "recompilation")
    assert f.time_lost_ns == 0 and f.severity == "low" and f.symptom_ns > 0
    assert f.recommendation.startswith("Nothing to fix: each of these recompiles is an input "
                                       "of the first decode steps differing from the prompt's")
    training = _load(sc, tmp_path, "last_batch")  # no generation: the shapes advice
    (g,) = _rule(training, "recompilation")
    assert g.time_lost_ns > 0 and "mark_dynamic(x, dim)" in g.recommendation
    # each dim once: Dynamo made it dynamic, and padding would add work to every step (a
    # variable-length batch, bucketed as once advised, ran 26 us a step slower)
    assert "drop_last=True" in g.recommendation and "pad or bucket" not in g.recommendation
    assert steps and all(s >= 0 for s in steps)


def test_compile_dominates_share_is_of_the_run(tmp_path: Path) -> None:
    sc = scenarios.clean()
    sc.b.slice(sc.host, 20_000, 50_000, "dynamo", "compile", {"graph_id": 1})
    (f,) = _rule(_load(sc, tmp_path, "compile_run"), "compile_dominates")
    assert f.share_of_step == pytest.approx(50_000 / 70_000)  # the run spans 0..70 us
    assert "graph breaks" not in f.recommendation and "--steps" in f.recommendation


def test_memory_holders_sum_to_at_most_the_peak(tmp_path: Path) -> None:
    """An op that frees what another allocated is no holder: A allocates 1000 B, B frees
    it, C allocates 800 B, D 400 B: the peak (1200 B) is held by C and D."""
    sc = scenarios.Scenario()
    sc.step(0)
    for i, name in enumerate(("aten::empty", "aten::zero_", "aten::mm", "aten::relu")):
        sc.op(1000 * (i + 1), 100, name, i + 1, 0, kernel=(1000 * (i + 1) + 200, 100),
              busy={"vector": 100})
    for ts, value in ((1050, 1000), (2050, 0), (3050, 800), (4050, 1200)):
        sc.b.counter(sc.hbm, ts, value)
    held = _load(sc, tmp_path, "holders").memory_at_peak()
    assert held["bytes"].sum() <= 1200
    assert dict(zip(held["op"], held["bytes"], strict=True)) == {"aten::mm": 800,
                                                                "aten::relu": 400}


def test_a_finding_that_needs_another_fix_first_never_outranks_it(basic_pf) -> None:
    """A compiled UNet's memory-bound ops (device time, 40% of the step) once ranked [high]
    above host_bound, whose fix they need first: they now follow it, and are not high."""
    from neuron_explorer.rules.finding import make, ranked

    host = make(basic_pf, "host_bound", "host", 1_000, [], "e", "r")
    device = make(basic_pf, "memory_bound_ops", "device", 1_000_000, [], "e", "r",
                  after="host_bound")
    other = make(basic_pf, "dataloader_stall", "data", 500, [], "e", "r")
    assert device.severity == "medium"  # a share that would be high, but no step time yet
    assert [f.rule_id for f in ranked([device, other, host])] == [
        "host_bound", "memory_bound_ops", "dataloader_stall"]
    alone = make(basic_pf, "memory_bound_ops", "device", 1_000_000, [], "e", "r")
    assert alone.severity == "high"


def test_findings_stay_in_order_of_saving_around_a_fix_others_wait_on(basic_pf) -> None:
    """A host-bound finding saving 0 ns ranked its waiting findings (1.21 ms, 487 us) at 0
    too: they and it came below a 450 us finding. The fix others wait on moves up to just
    above the first of them; every other finding keeps its place by saving."""
    from neuron_explorer.rules.finding import make, ranked

    host = make(basic_pf, "host_bound", "host", 0, [], "e", "r")
    memory = make(basic_pf, "memory_bound_ops", "m", 1_210_000, [], "e", "r", after="host_bound")
    dma = make(basic_pf, "small_dma", "d", 487_000, [], "e", "r", after="host_bound")
    fallback = make(basic_pf, "host_fallback", "f", 450_000, [], "e", "r")
    short = make(basic_pf, "short_kernel_sequence", "s", 7_200_000, [], "e", "r")
    order = [f.rule_id for f in ranked([fallback, dma, host, memory, short])]
    assert order == ["short_kernel_sequence", "host_bound", "memory_bound_ops", "small_dma",
                     "host_fallback"]


def test_a_sync_costs_the_hosts_wait_when_that_is_less_than_the_idle_after_it(tmp_path) -> None:
    """One 1 ms step: kernel A [0, 600) us; the host syncs [580, 600) (a 20 us wait), works
    until 900 and launches kernel B, which runs [902, 950). The device idles 302 us after
    the sync, but without it the host would have launched B only 20 us earlier."""
    import json

    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1,
         "ts": 0, "dur": 1000},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
         "ts": 0, "dur": 1, "args": {"correlation": 1}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": 1, "tid": 1,
         "ts": 580, "dur": 20},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
         "ts": 900, "dur": 1, "args": {"correlation": 2}},
        {"ph": "X", "cat": "kernel", "name": "a", "pid": 0, "tid": 7, "ts": 0, "dur": 600,
         "args": {"correlation": 1, "device": 0, "stream": 7}},
        {"ph": "X", "cat": "kernel", "name": "b", "pid": 0, "tid": 7, "ts": 902, "dur": 48,
         "args": {"correlation": 2, "device": 0, "stream": 7}},
    ]
    path = tmp_path / "sync.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    (f,) = _rule(neuron_explorer.load(path), "sync_in_step")
    assert f.symptom_ns == 302_000 and f.time_lost_ns == 20_000 and not f.after
    assert f.severity == "low" and f.saving_basis.startswith("replay")


def test_a_syncs_read_is_its_item_op_not_the_module_around_it(tmp_path) -> None:
    """A PyTorch profiler records `.item()` as aten::item around the copy and its wait,
    inside the module's own op: removing the sync removes aten::item, not the forward."""
    import json

    from neuron_explorer.analyses.step_breakdown import host_slices
    from neuron_explorer.rules.sync_in_step import reads

    def op(name: str, ts: int, dur: int) -> dict:
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts,
                "dur": dur}

    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1,
         "ts": 0, "dur": 1000},
        op("forward", 10, 900), op("aten::item", 500, 100),
        op("aten::_local_scalar_dense", 505, 90),
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": 1,
         "tid": 1, "ts": 520, "dur": 60},
    ]
    path = tmp_path / "item.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    t = neuron_explorer.load(path)
    hs = host_slices(t)
    names = t.table("slices")["name"].to_numpy()
    assert [names[i] for i in reads(t, hs[hs["kind"] == "sync"])] == ["aten::item"]


def test_a_graph_break_on_the_modelled_clock_costs_nothing_and_reports() -> None:
    """On the modelled host clock a compile takes no time: no step holds compile time (the
    finding asked for the critical path of no steps, and `report` failed). What the break
    costs is its graphs: a compiled function's two forward graphs, one launch each a step
    (60 us on this clock), merge without it."""
    from neuron_explorer.report import render_report

    trace = neuron_explorer.load(Path(__file__).parents[1] / "data"
                                 / "graph_break_modelled_clock.pftrace", cache=False)
    (found,) = [f for f in trace.bottlenecks() if f.rule_id == "recompilation"]
    assert "1 graph break" in found.title
    assert found.time_lost_ns == 4 * 60_000  # a launch in each of the 4 analysed steps
    assert found.saving_basis.startswith("replay: the run replayed with each model call's")
    assert "gb_min.py:7" in found.recommendation
    assert found.title in render_report(trace, "md")


def test_tensor_engine_padding_saves_only_down_to_the_engine_pacing_the_kernel(
        tmp_path) -> None:
    """A compiled CNN's graph moved data 539 us a step against 87 us of matmuls: its
    padding was claimed at 55 us a step, and fixing the dim saved nothing. A kernel
    shortens only down to its busiest other engine."""
    sc = scenarios.Scenario()
    for n in range(2):
        t = sc.step(n)
        # 8 us of Tensor Engine, 75% padding, in a kernel 8.5 us of DMA keep 9 us long
        sc.op(t, 500, "aten::mm", n + 1, n, kernel=(t + 600, 9000),
              busy={"tensor": 8000, "dma": 8500}, flops=1_000_000, hw_flops=4_000_000,
              nbytes=1000, shapes="[[130, 512], [512, 512]]", instructions=False)
    (f,) = _rule(_load(sc, tmp_path, "padding_dma_paced"), "tensor_engine_padding")
    assert f.symptom_ns == 2 * 6000  # the padded Tensor Engine time
    # each kernel 9 us down to DMA's 8.5, not 6 us less (and the host paces these steps)
    assert "1 us less device time" in f.explanation
