"""Said once on stderr when a recording is slow for a reason we know, and what the
trace's metadata says about the host clock.

- an op on bf16/fp16 data that took long to compute on a host without native bf16
  (PyTorch's CPU bf16 matmul is tens of times slower than fp32 there);
- an engine-level trace past `LARGE_TRACE_BYTES`.

Neither changes the trace's times (emulation and recording are off the host clock);
they explain why the run takes long and what would make it faster.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import TYPE_CHECKING, Any

from neuron_explorer.backend.clock import clock
from neuron_explorer.backend.host_costs import BACKEND_OP_NS, MODELLED_PYTHON_PER_OP_NS, host_costs
from neuron_explorer.collectors import thread_pool_wait
from neuron_explorer.collectors.summary import human_size

if TYPE_CHECKING:
    from neuron_explorer.collectors.recorder import Recorder

SLOW_OP_NS = 200_000_000  # one op computing this long on the host is worth a word
LARGE_TRACE_BYTES = 1 << 30
_HALF_PRECISION = ("bfloat16", "float16")
_NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16", "sve_bf16")


def host_clock_metadata() -> dict[str, Any]:
    """The host clock's source and the per-op costs it charged (trace metadata)."""
    meta: dict[str, Any] = {"source": clock.source, "backend_op_ns": BACKEND_OP_NS}
    if clock.source == "modelled":
        meta["python_per_op_ns"] = MODELLED_PYTHON_PER_OP_NS
    else:
        meta["boxing_ns_per_op"] = host_costs.boxing_ns
        meta["module_hook_ns"] = host_costs.module_hook_ns
    meta["omp_wait_policy"] = thread_pool_wait.policy()
    return meta


@functools.lru_cache(maxsize=1)
def host_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 natively (from /proc/cpuinfo's flags)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags = line.split(":", 1)[1].split()
                    return any(flag in flags for flag in _NATIVE_BF16_FLAGS)
    except OSError:
        pass
    return False


class SlowOpNotice:
    """Listens to the runtime for ops that computed long; says once why if it knows."""

    def __init__(self) -> None:
        self.said = False

    def __call__(self, key: tuple, real_ns: int) -> None:
        if self.said or real_ns < SLOW_OP_NS:
            return
        dtypes = {str(d).removeprefix("torch.") for _, d in key[1]}
        half = [d for d in _HALF_PRECISION if d in dtypes]
        if not half or host_has_native_bf16():
            return
        self.said = True
        print(f"neuron-explorer: {key[0]} on {half[0]} took {real_ns / 1e9:.1f} s to compute on "
              f"this host, whose CPU has no native {half[0]} arithmetic (PyTorch's CPU "
              f"{half[0]} matmul is tens of times slower than float32 here): the recording is "
              "slow for that, the trace's times are not affected. Record fewer steps "
              "(--steps START:STOP) or a smaller model to get the trace sooner.",
              file=sys.stderr)


def install_slow_op_notice() -> None:
    from neuron_explorer.backend import runtime

    runtime.set_slow_op_listener(SlowOpNotice(), SLOW_OP_NS)


def remove_slow_op_notice() -> None:
    from neuron_explorer.backend import runtime

    runtime.set_slow_op_listener(None)


def trace_bytes(recorder: Recorder) -> int:
    """Bytes written to the trace file so far."""
    written = getattr(recorder.writer, "bytes_written", None)
    if written is not None:
        return int(written)
    try:
        return os.path.getsize(recorder.writer.path)
    except OSError:
        return 0


def warn_if_large(recorder: Recorder) -> None:
    """Say once when an engine-level trace grows past LARGE_TRACE_BYTES."""
    if recorder.large_trace_warned or not recorder.engine or recorder.options.quiet:
        return
    size = trace_bytes(recorder)
    if size < LARGE_TRACE_BYTES:
        return
    recorder.large_trace_warned = True
    print(f"neuron-explorer: the trace is already {human_size(size)} at --level engine, "
          "where every instruction and DMA transfer is written: that makes it big and the "
          "recording slow. --level op (ops and kernels only) or --steps START:STOP (fewer "
          "steps) keep it small.", file=sys.stderr)
