"""Cost of lowering an op on the eager path: kernel-cache hit against cache miss.

For small-tensor ops (the eager path's common case) prints the median time of
`lower_op` on a cache hit, on a cache miss (full lowering and scheduling), of
building the `OpSpec` itself, and of a plain dict lookup with a tuple key measured
in the same run as the baseline. Target: a hit costs about 1-3 us.

    python benchmarks/bench_hardware.py [--repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import time

from neuron_explorer.backend.hardware import OpSpec, TensorSpec, clear_cache, get_preset, lower_op

T = TensorSpec
HIT_TARGET_US = 3.0


def _specs() -> dict[str, OpSpec]:
    small = T((4, 4), "float32")
    return {
        "add": OpSpec("aten::add", (small, small), (small,)),
        "mm": OpSpec("aten::mm", (small, small), (small,)),
        "relu": OpSpec("aten::relu", (small,), (small,)),
        "sum": OpSpec("aten::sum", (small,), (T((4,), "float32"),), {"dim": (0,)}),
        "addmm": OpSpec("aten::addmm", (T((512,), "float32"), T((64, 512), "float32"),
                                        T((512, 512), "float32")), (T((64, 512), "float32"),)),
        "softmax": OpSpec("aten::_softmax", (T((64, 512), "float32"),),
                          (T((64, 512), "float32"),), {"dim": -1}),
    }


def _median_us(fn, calls: int, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter_ns() - start) / calls / 1e3)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    preset = get_preset("trn2")
    table = {("aten::add", ((4, 4), "float32")): 1}
    key = ("aten::add", ((4, 4), "float32"))
    baseline = _median_us(lambda: table.get(key), 20_000, args.repeats)
    print(f"baseline dict lookup (tuple key): {baseline:.3f} us")
    print(f"{'op':8s} {'hit us':>8s} {'miss us':>9s} {'spec us':>8s} {'miss/hit':>9s} "
          f"{'hit/dict':>9s}")
    hits = []
    for name, spec in _specs().items():
        def miss(spec=spec):
            clear_cache()
            lower_op(spec, preset)

        miss_us = _median_us(miss, 50, args.repeats)
        lower_op(spec, preset)
        hit_us = _median_us(lambda spec=spec: lower_op(spec, preset), 20_000, args.repeats)
        spec_us = _median_us(lambda spec=spec: OpSpec(spec.name, spec.inputs, spec.outputs,
                                                      spec.attrs), 20_000, args.repeats)
        hits.append(hit_us)
        print(f"{name:8s} {hit_us:8.2f} {miss_us:9.1f} {spec_us:8.2f} {miss_us / hit_us:9.0f} "
              f"{hit_us / baseline:9.1f}")
    worst = max(hits)
    verdict = "ok" if worst <= HIT_TARGET_US else "over target"
    print(f"worst cache hit: {worst:.2f} us (target <= {HIT_TARGET_US} us): {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
