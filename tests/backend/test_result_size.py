"""A neuron result that cannot fit in free HBM fails at once, before the host computes it.

Each case runs in a child process that measures its own peak RSS (`ru_maxrss`): before
the check, the host computed the whole result first (14 GB and a minute for an outer
product of two 60000-vectors), and only then raised OutOfMemoryError.
"""

from __future__ import annotations

import json

import pytest
import torch

MIB = 1 << 20

_MEASURE = """
import json, resource, time, warnings
import torch
from neuron_explorer.backend import devices

warnings.simplefilter("ignore")
MIB = 1 << 20
results = {}

def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

def case(name, fn):
    before, start = peak(), time.perf_counter()
    try:
        fn()
        error = None
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    results[name] = {"rss_mib": (peak() - before) / MIB, "s": time.perf_counter() - start,
                     "error": error}
"""

_WITH_100_MIB_FREE = _MEASURE + """
a, b = torch.ones(8192, 1, device="neuron"), torch.ones(1, 16384, device="neuron")
small = torch.ones(16 * MIB, device="neuron")  # 64 MiB
host = torch.empty(128 * MIB)  # 512 MiB of host pages, not yet touched
memory = devices.get(0).memory
memory.capacity = memory.in_use + 100 * MIB  # only 100 MiB of HBM free
case("arange", lambda: torch.arange(64 * MIB, device="neuron"))
case("to", lambda: host.to("neuron"))
case("add", lambda: a + b)
case("matmul", lambda: a @ b)
case("repeat", lambda: a.repeat(1, 16384))
case("expand_clone", lambda: a.expand(8192, 16384).clone())
case("full", lambda: torch.full((128 * MIB,), 1.0, device="neuron"))
case("to_float64", lambda: small.to(torch.float64))
case("fits", lambda: (a * 2).sum().item())
results["free_mib"] = (memory.capacity - memory.in_use) / MIB
print(json.dumps(results))
"""


def _run(fresh_python, code: str) -> dict:
    proc = fresh_python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_results_larger_than_free_hbm_fail_before_the_host_computes_them(fresh_python):
    results = _run(fresh_python, _WITH_100_MIB_FREE)
    expected_bytes = {"arange": "512.00 MiB", "to": "512.00 MiB", "add": "512.00 MiB",
                      "matmul": "512.00 MiB", "repeat": "512.00 MiB",
                      "expand_clone": "512.00 MiB", "full": "512.00 MiB",
                      "to_float64": "128.00 MiB"}
    for name, size in expected_bytes.items():
        case = results[name]
        assert case["error"] is not None and case["error"].startswith(
            f"OutOfMemoryError: neuron out of memory. Tried to allocate {size}. neuron:0 has a "
            "total capacity of 164.09 MiB of which 100.00 MiB is free."), (name, case)
        # Before the check each of these took its whole 128-512 MiB of host RAM first.
        assert case["rss_mib"] < 48, (name, case)
        assert case["s"] < 5.0, (name, case)
    assert results["fits"]["error"] is None
    assert results["free_mib"] > 35  # nothing refused was left allocated


def test_an_outer_product_of_two_60000_vectors_fails_at_once(fresh_python):
    results = _run(fresh_python, _MEASURE + """
a, b = torch.empty(60000, 1, device="neuron"), torch.empty(1, 60000, device="neuron")
case("matmul", lambda: a @ b)
case("add", lambda: a + b)
case("arange", lambda: torch.arange(4 << 30, device="neuron"))
print(json.dumps(results))
""")
    for name, size in {"matmul": "13.41 GiB", "add": "13.41 GiB", "arange": "32.00 GiB"}.items():
        case = results[name]
        assert case["error"].startswith(
            f"OutOfMemoryError: neuron out of memory. Tried to allocate {size}."), (name, case)
        assert case["rss_mib"] < 48 and case["s"] < 5.0, (name, case)


@pytest.mark.parametrize(("make", "message"), [
    (lambda d: torch.empty(-1, device=d), "Trying to create tensor with negative dimension -1"),
    (lambda d: torch.empty(2, -3, device=d), "negative dimension -3: [2, -3]"),
    (lambda d: torch.randn(-1, device=d), "negative dimension -1"),
    (lambda d: torch.full((-2,), 1.0, device=d), "negative dimension -2"),
    (lambda d: torch.empty(2**62, 2**62, device=d), "Storage size calculation overflowed"),
    (lambda d: torch.empty(2**61, device=d), "Storage size calculation overflowed"),
    (lambda d: torch.empty_strided((2,), (-1,), device=d), "Storage size calculation overflowed"),
])
def test_negative_and_overflowing_sizes_say_so_like_the_cpu(make, message):
    with pytest.raises(RuntimeError) as on_cpu:
        make("cpu")
    with pytest.raises(RuntimeError) as on_neuron:
        make("neuron")
    assert message in str(on_neuron.value) and message in str(on_cpu.value)
    assert "alloc_cpu" not in str(on_neuron.value)


def test_resizing_to_a_negative_size_says_so():
    x = torch.empty(2, device="neuron")
    with pytest.raises(RuntimeError, match="negative dimension -1"):
        x.resize_(-1)
    assert x.shape == (2,)


def test_small_results_still_fit_and_free_what_they_held():
    memory = torch.neuron.memory_allocated()
    a = torch.ones(64, 1, device="neuron")
    b = torch.ones(1, 32, device="neuron")
    assert torch.equal((a @ b).cpu(), torch.ones(64, 32))
    assert torch.equal((a + b).cpu(), torch.full((64, 32), 2.0))
    assert torch.equal(torch.cat([a, a]).cpu(), torch.ones(128, 1))
    assert torch.arange(5, device="neuron").tolist() == [0, 1, 2, 3, 4]
    del a, b
    assert torch.neuron.memory_allocated() == memory
