"""shape_recompiles: a compiled function that recompiles for each new size of one input
dimension (a decoder's growing KV cache) is named with that dimension, its sizes and
what its compiles cost; what fixing it saves is all but one of those compiles, and the
steps it ran uncompiled once Dynamo gave up recompiling."""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path

import neuron_explorer
import pytest
from cli_runner import median_step, record_variants, run_command
from neuron_explorer.analyses.steady_state import (
    analysed_steps,
    compiling_steps,
)
from neuron_explorer.rules import thresholds as th
from scenarios import Scenario

STEP_NS = 1_000_000
GUARD = "0/{n}: tensor '{name}' size mismatch at index 2. expected {old}, actual {new}"


def _growing(sizes: list[int], name: str = "cache[0][0]") -> list[str]:
    """The failed guards of a function called with each of `sizes` in turn."""
    return [GUARD.format(n=n, name=name, old=old, new=new)
            for n, (old, new) in enumerate(itertools.pairwise(sizes), start=1)]


def _trace(tmp: Path, reasons: list[str], inside_ns: int = 0) -> neuron_explorer.Trace:
    """A decode loop on the host alone: step 0 launches one op; step n (from 1)
    recompiles for reasons[n - 1] in a compile span of (n + 3) * 100 us, then launches
    its op; `inside_ns`: an op of the program's own that long runs inside each span."""
    sc = Scenario()
    for n in range(len(reasons) + 1):
        t = n * STEP_NS
        sc.b.slice(sc.host, t, STEP_NS, f"step {n}", "step", {"step": n})
        compile_ns = (n + 3) * 100_000 if n else 0
        if n:
            sc.b.instant(sc.host, t + 10_000, "recompile", "recompile",
                         {"reason": reasons[n - 1], "source": "gen.py:30 in forward"})
            sc.b.slice(sc.host, t + 10_000, compile_ns, f"dynamo 0/{n}", "compile", {})
            if inside_ns:
                sc.op(t + 15_000, inside_ns, "aten::zero_", 100 + n, n)
        sc.op(t + 20_000 + compile_ns, 20_000, "graph:1", n + 1, n,
              kernel=(t + 50_000 + compile_ns, 100_000))
    return neuron_explorer.load(sc.write(tmp, f"shapes_{abs(hash(tuple(reasons)))}"))


def _findings(trace: neuron_explorer.Trace, rule_id: str) -> list:
    return [f for f in trace.bottlenecks() if f.rule_id == rule_id]


def test_a_recompile_per_new_length_names_the_dimension_its_sizes_and_cost(tmp_path) -> None:
    sizes = [24, 25, 26, 27, 28]
    (f,) = _findings(_trace(tmp_path, _growing(sizes)), "shape_recompiles")
    n = len(sizes) - 1
    compiles = [(k + 3) * 100_000 for k in range(1, n + 1)]
    assert f.title == f"{n} recompiles, one per new size of cache[0][0] dim 2"
    assert "dim 2 of its input cache[0][0]" in f.explanation
    assert "sizes 24, 25, 26, 27, 28" in f.explanation and "KV cache" in f.explanation
    assert "gen.py:30 in forward" in f.explanation
    assert "550 us of host time each, 2.2 ms in all, in steps 1–4" in f.explanation
    assert f.symptom_ns == sum(compiles)
    # the compiles are the host's own work, all on the critical path: the fix keeps one
    assert f.time_lost_ns == pytest.approx(sum(compiles) * (n - 1) / n, abs=1)
    for fix in ("static KV cache", "mark_dynamic(t, 2)", "bucket",
                "dynamic=True) makes every dim of every input dynamic"):
        assert fix in f.recommendation
    assert [e["dur"] for e in f.evidence] == compiles


def test_the_programs_own_ops_inside_a_recompile_are_not_its_cost(tmp_path) -> None:
    """What runs inside a recompile's span of the program's own (its eager parts) runs
    whatever is compiled: the recompiles cost their spans less those ops."""
    sizes = [24, 25, 26, 27, 28]
    (plain,) = _findings(_trace(tmp_path, _growing(sizes)), "shape_recompiles")
    (tmp_path / "inside").mkdir()
    (inside,) = _findings(_trace(tmp_path / "inside", _growing(sizes), 50_000),
                          "shape_recompiles")
    assert inside.symptom_ns == plain.symptom_ns - 4 * 50_000
    assert inside.time_lost_ns == pytest.approx(plain.time_lost_ns - 3 * 50_000, abs=1)


def test_lengths_that_jump_between_calls_get_advice_to_pad(tmp_path) -> None:
    (f,) = _findings(_trace(tmp_path, _growing([12, 30, 17, 21])), "shape_recompiles")
    assert "differs between calls" in f.explanation and "KV cache" not in f.explanation
    assert "pad the inputs to one fixed size" in f.recommendation


def test_fewer_size_recompiles_than_the_threshold_are_the_general_finding(tmp_path) -> None:
    """Dynamo's automatic dynamic shapes absorb a single change: one or two are not a
    recompile per length, and the general recompilation finding covers them."""
    reasons = _growing(list(range(24, 24 + th.SHAPE_RECOMPILES_MIN)))  # threshold - 1
    trace = _trace(tmp_path, reasons)
    assert _findings(trace, "shape_recompiles") == []
    (general,) = _findings(trace, "recompilation")
    assert general.title == f"{len(reasons)} recompiles in steps"


def test_size_recompiles_of_different_inputs_are_not_one_dimension(tmp_path) -> None:
    reasons = [GUARD.format(n=n, name=name, old=3, new=4)
               for n, name in enumerate("xyzw", start=1)]
    assert _findings(_trace(tmp_path, reasons), "shape_recompiles") == []
    same = [GUARD.format(n=n, name="x", old=n, new=n + 1) for n in range(1, 5)]
    assert len(_findings(_trace(tmp_path, same), "shape_recompiles")) == 1


def test_the_general_finding_leaves_the_per_length_recompiles_out(tmp_path) -> None:
    other = "0/5: tensor 'ids' dispatch key set mismatch"
    trace = _trace(tmp_path, [*_growing([24, 25, 26, 27, 28]), other])
    assert len(_findings(trace, "shape_recompiles")) == 1
    (general,) = _findings(trace, "recompilation")
    assert general.title == "1 recompile in steps" and "dispatch key" in general.explanation
    assert general.symptom_ns == 800_000  # that recompile's own compile span alone


# -- recorded: examples/generate.py compiled three ways, and eager ---------------------

EXAMPLE = Path(__file__).parents[2] / "examples" / "generate.py"
ARGS = ["--new-tokens", "8", "--prompt", "8", "--batch", "2"]


def _record(folder: Path, name: str, *flags: str) -> neuron_explorer.Trace:
    # the measured host clock: the modelled one counts no compile time
    env = dict(os.environ)
    env.pop("NEURON_EXPLORER_RECORD", None)
    env.pop("NEURON_HOST_CLOCK", None)
    out = folder / f"{name}.pftrace"
    # as a user runs it (forked after a recording's imports: cli_runner)
    proc = run_command("record", "--level", "op", "-o", str(out), "--", sys.executable,
                       str(EXAMPLE), *ARGS, *flags, cwd=folder, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return neuron_explorer.load(out)


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, neuron_explorer.Trace]:
    folder = tmp_path_factory.mktemp("generate")
    return {"static_shapes": _record(folder, "static_shapes", "--compile", "--static-shapes"),
            "static_cache": _record(folder, "static_cache", "--compile", "--static-cache"),
            "dynamic": _record(folder, "dynamic", "--compile", "--dynamic"),
            "eager": _record(folder, "eager")}


@pytest.mark.slow
def test_compiled_decoding_with_static_shapes_recompiles_per_length(generated) -> None:
    trace = generated["static_shapes"]
    (f,) = _findings(trace, "shape_recompiles")
    # the prompt's 8 positions, then one more per decode step: each new length from the
    # second decode step on recompiles (the first recompiles for its token ids)
    assert "dim 2 of its input cache[0][0]" in f.explanation
    assert "KV cache" in f.explanation and "examples/generate.py:" in f.explanation
    assert f.title == "6 recompiles, one per new size of cache[0][0] dim 2"
    assert "sizes 8 to 14" in f.explanation
    assert 0 < f.time_lost_ns < f.symptom_ns
    # the report, through the command line, leads with it among the recompile findings
    report = run_command("report", str(trace.path), cwd=Path(trace.path).parent,
                         env=dict(os.environ), timeout=300)
    assert report.returncode == 0, report.stderr[-2000:]
    text = report.stdout
    assert f.title in text and "Recompilation storm" not in text


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["static_cache", "dynamic"])
def test_a_static_cache_or_a_dynamic_length_compiles_a_few_times(generated, variant) -> None:
    trace = generated[variant]
    assert _findings(trace, "shape_recompiles") == []
    cs = trace.compile_summary()
    # the prefill's graph and the decode step's (a recompile or two: the token ids are
    # inference tensors, the prefill's cache a strided view), then none however long
    assert 2 <= len(cs["graphs"][cs["graphs"]["graph_id"] >= 0]) <= 3
    decode = trace.phases()
    decode = decode[decode["phase"] == "decode"]
    assert len(decode) == 7 and not compiling_steps(trace) & set(decode["step"].iloc[2:])
    # so the time per output token is lower than eager's (several times: one launch a
    # step against one per op)
    assert trace.serving()["tpot_median_ns"].iloc[0] < \
        generated["eager"].serving()["tpot_median_ns"].iloc[0] / 2
    # those recompiles are what decoding takes (the token ids made under inference_mode, the
    # cache): said so, low, nothing claimed (the static cache's was 864 ms, high, with
    # advice to keep guarded values constant)
    recompiles = _findings(trace, "recompilation")
    assert recompiles or variant == "dynamic"
    for f in recompiles:
        assert f.time_lost_ns == 0 and f.severity == "low", (variant, f.line())
        assert f.recommendation.startswith("Nothing to fix"), (variant, f.recommendation)
    # and its tokens/s are eager's order, not a compile's: the seconds its first steps
    # compile are left out (they made a compiled decoder serve 11 tokens/s against a steady
    # 2,500). Not "faster than eager": the time to the first token dominates 8 tokens on
    # the measured clock (1.36x eager's rate on a quiet machine; 1.0x once, with other work
    # beside the recordings)
    assert trace.serving()["tokens_per_s"].iloc[0] > \
        0.5 * generated["eager"].serving()["tokens_per_s"].iloc[0]


@pytest.mark.slow
def test_past_the_recompile_limit_the_saving_counts_the_steps_run_uncompiled(tmp_path) -> None:
    """14 tokens with static shapes: a recompile per length until Dynamo's recompile limit,
    then the decoder runs uncompiled (3.9 ms a step against 0.28 ms compiled). The finding
    claimed the recompiles' compile time alone (none, on the modelled clock) and said it
    left the uncompiled steps out; a user's decoder lost 3.69 ms a step there. Its saving
    now replays those calls as one launch each."""
    args = ["--new-tokens", "14", "--prompt", "8", "--batch", "2", "--compile"]
    paths = record_variants(tmp_path, EXAMPLE, {"shapes": [*args, "--static-shapes"],
                                                "cache": [*args, "--static-cache"]},
                            modelled=True)
    shapes, cache = neuron_explorer.load(paths["shapes"]), neuron_explorer.load(paths["cache"])
    (f,) = _findings(shapes, "shape_recompiles")
    assert "the function ran uncompiled after 8 compiles" in f.explanation
    assert "counted in the saving" in f.explanation
    saved = median_step(shapes) - median_step(cache)
    assert saved > 0.5 * median_step(shapes)  # the premise: uncompiled steps cost much
    claimed = f.time_lost_ns / len(analysed_steps(shapes).steps)
    assert claimed == pytest.approx(saved, rel=0.15), (claimed, saved)
    # host_bound sees the same eager launches: it says where they come from, and an
    # inference run is not told to compute a loss
    (host,) = _findings(shapes, "host_bound")
    assert "run inside the compiled model's own calls" in host.recommendation
    assert "loss" not in host.recommendation
    assert "Move the work on the model's outputs" in host.recommendation
    # a compiled function holding the model's call hides the return that ends each step
    # (a user who compiled one as advised recorded a single step)
    assert "mark each request with neuron_explorer.step()" in host.recommendation



def test_a_cache_that_was_none_at_the_prompt_is_an_input_guard() -> None:
    """A decoder called with no cache at the prompt and its cache from then on recompiles
    once for `ks is None` and once for the cache's first new length: what decoding takes.
    The None guard was not read as an input's, and the finding advised bucketing and
    mark_dynamic, which a user applied for nothing."""
    import pandas as pd
    from neuron_explorer.rules.recompilation import _each_input_guard_once

    reasons = ["0/0: ks is None    # x, k, v = blk(x, None if ks is None else ks[i])",
               GUARD.format(n=1, name="ks[0]", old=16, new=17)]
    assert _each_input_guard_once(pd.DataFrame({"reason": reasons}))
    value = ["1/0: ___stack2 == 0.23007439076900482    # print(f'{h.mean().item()}')"]
    assert not _each_input_guard_once(pd.DataFrame({"reason": value}))


def test_a_list_the_compiled_forward_grows_is_named_with_its_line(tmp_path) -> None:
    """A module appending a log to a list in its compiled forward: Dynamo guards on the
    list's length and compiles again each call. A trial was told to "pass them as tensors
    rather than Python numbers", at the line of the forward's first call."""
    reasons = ["0/0: not self.norm_log    # self.norm_log.append(n)  # ckpt.py:48 in forward",
               *(f"0/{i}: len(self.norm_log) == {i}    # self.norm_log.append(n)  # "
                 "ckpt.py:48 in forward" for i in range(1, 5))]
    (f,) = _findings(_trace(tmp_path, reasons), "recompilation")
    assert "the length of `self.norm_log` (grown at ckpt.py:48)" in f.recommendation
    assert "append it outside" in f.recommendation
    assert "rather than Python numbers" not in f.recommendation


def test_a_reason_is_one_line_of_the_finding(tmp_path) -> None:
    """Dynamo appends the user's stack to a guard's reason and aligns the source it quotes
    with spaces: pasted whole, a finding read "ks is None        # x, k, v = ...  User stack
    trace: File ...". Each reason is its first line."""
    reason = ("0/1: ___stack2 == 0.23                         # print(h.mean().item())  "
              "# pr.py:12 in forward\nUser stack trace:\n  File \"pr.py\", line 12, in forward")
    (general,) = _findings(_trace(tmp_path, [reason]), "recompilation")
    assert ("Reasons: 0/1: ___stack2 == 0.23 # print(h.mean().item()) # pr.py:12 in "
            "forward.") in general.explanation
    assert "User stack trace" not in general.explanation


# -- a Python int guarded by value: a recompile per value, then uncompiled ---------------

INT_GUARD = Path(__file__).parent / "programs" / "int_guard.py"


@pytest.mark.slow
def test_a_python_int_recompiling_past_the_limit_is_priced_and_named(tmp_path) -> None:
    """A compiled block called with its position as a Python int under dynamic=False: a
    compile per position until Dynamo's recompile limit, then every call uncompiled. The
    storm was rated 0 ("no time to save now") and advised mark_dynamic and padding shapes
    (the guard's quoted source line mentions x.shape); a user's decoder lost 3.69 ms a step
    there. The finding now replays the uncompiled calls as one launch each and names the
    int."""
    paths = record_variants(tmp_path, INT_GUARD, {"int": [], "tensor": ["--start-tensor"],
                                                  "dynamic": ["--dynamic-default"]},
                            modelled=True)
    storm, tensor, dynamic = (neuron_explorer.load(paths[k])
                              for k in ("int", "tensor", "dynamic"))
    (f,) = _findings(storm, "recompilation")
    assert "the function ran uncompiled after 8 compiles" in f.explanation
    assert f.severity == "high" and "counted in the saving" in f.explanation
    assert "analysed steps that ran uncompiled" in f.explanation  # a step's figure too
    assert "Python number `start` (16, 17, 18, ...)" in f.recommendation
    assert "pass it as a tensor" in f.recommendation
    assert "changing input shapes" not in f.recommendation
    assert _findings(storm, "shape_recompiles") == []
    claimed = f.time_lost_ns / len(analysed_steps(storm).steps)
    for fixed in (tensor, dynamic):
        saved = median_step(storm) - median_step(fixed)
        assert saved > 0.5 * median_step(storm)  # the premise: uncompiled calls cost much
        assert claimed == pytest.approx(saved, rel=0.2), (claimed, saved)
    # fixed, no recompile is left to name
    assert not [g for g in _findings(dynamic, "recompilation") if g.time_lost_ns]


def test_a_guards_quoted_source_is_not_its_reason() -> None:
    """Dynamo quotes the guarded line after the guard: `start == 17  # pos = start +
    torch.arange(x.shape[1])`. Its `x.shape` read as a shape guard."""
    from neuron_explorer.rules.recompilation import _guard, _is_shape, _python_values

    reasons = [f"0/{n}: start == {16 + n}        # pos = start + torch.arange(x.shape[1])"
               "  # int_guard.py:26 in forward\nUser stack trace:\n  File ..." for n in range(3)]
    guards = [_guard(r) for r in reasons]
    assert guards == ["start == 16", "start == 17", "start == 18"]
    assert not any(map(_is_shape, guards))
    assert _python_values(guards) == {"start": ["16", "17", "18"]}
    # Dynamo's own names for values it made (a resumed function's) are not the user's
    assert _python_values(["___stack2 == 0.23"]) == {}


def test_a_modules_int_attribute_is_advised_as_one_not_as_dynamic() -> None:
    """A counter kept on a compiled module (`self.calls += 1`) recompiles on each value
    whatever `dynamic` says: a trial told to "compile without dynamic=False" had never
    passed it. A module's int attribute gets Dynamo's own switch for it instead."""
    from neuron_explorer.rules.recompilation import _python_values, _python_values_advice

    attribute = _python_values_advice(" at m.py:9", _python_values(
        ["self.calls == 1", "self.calls == 2"]))
    assert "torch._dynamo.config.allow_unspec_int_on_nn_module = True" in attribute
    assert "dynamic=False" not in attribute
    argument = _python_values_advice(" at m.py:9", _python_values(
        ["L['start'] == 16", "L['start'] == 17"]))
    assert "where the model is compiled with dynamic=False, compile without it" in argument
