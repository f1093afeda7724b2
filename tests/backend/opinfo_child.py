"""Runs PyTorch's OpInfo samples on `neuron` and on the CPU and compares them, one op at a time.

Started by `test_opinfo.py` in a child process, so that an op which kills the process
is reported, never ends the run. For each op it prints one JSON line when it starts
(`{"start": op}`) and one with its result (`{"op": op, "status": ..., "reason": ...}`),
flushed at once: the parent knows which op was running when a child died.

    python tests/backend/opinfo_child.py SAMPLES_PER_OP [--after OP] [OP ...]

SAMPLES_PER_OP 0 runs every sample; no OP runs every op (after OP, with --after).
"""

from __future__ import annotations

import json
import math
import sys
import warnings

import torch
from torch.testing._internal.common_methods_invocations import op_db

# Ops whose values are random or uninitialised: only shapes and dtypes are compared
# (the device draws from its own generator, as CUDA does).
UNCOMPARABLE_VALUES = frozenset({
    "bernoulli", "empty", "empty_like", "empty_permuted", "empty_strided", "log_normal",
    "multinomial", "new_empty", "new_empty_strided", "nn.functional.alpha_dropout",
    "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
    "nn.functional.feature_alpha_dropout.with_train", "normal", "normal.in_place",
    "normal.number_mean", "rand_like", "randint", "randint_like", "randn", "randn_like",
    "uniform", "torch.ops.aten._efficient_attention_forward", "nn.functional.rrelu",
    "cauchy", "exponential", "geometric",
})

# Dtypes tried in order: the first the op supports on the CPU is the one run.
DTYPES = (torch.float32, torch.int64, torch.complex64, torch.bool, torch.float64,
          torch.int32, torch.uint8)


def op_key(op) -> str:
    """The op's name as the known-failures list spells it."""
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    """A host copy of `t` with its whole storage, offset and strides (`as_strided` with a
    storage offset reads outside a view's own elements, so a copy of the elements is not
    the same argument)."""
    t = t.detach()
    if t.layout != torch.strided or t.device.type != "neuron":
        return t.cpu()
    storage = t.untyped_storage()
    whole = torch.empty(0, dtype=t.dtype, device=t.device).set_(
        storage, 0, (storage.nbytes() // t.element_size(),), (1,))
    host = torch.empty(0, dtype=t.dtype).set_(whole.cpu().untyped_storage(), t.storage_offset(),
                                               t.shape, t.stride())
    host = host.conj() if t.is_conj() else host
    return host._neg_view() if t.is_neg() else host


def _to_cpu(value):
    """`value` with every tensor in it on the CPU (the reference run's arguments)."""
    if isinstance(value, torch.Tensor):
        return _host_copy(value)
    if isinstance(value, (list, tuple)):
        items = [_to_cpu(v) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    return value


class Mismatch(AssertionError):
    """The neuron result differs from the CPU's."""


def _same_scalar(actual, expected) -> bool:
    if isinstance(expected, float) and isinstance(actual, float) and math.isnan(expected):
        return math.isnan(actual)
    return actual == expected


def _compare(actual, expected, values: bool) -> None:
    """Raise AssertionError where the neuron result (on the host) differs from the CPU's."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            raise Mismatch(f"expected a tensor, got {type(actual).__name__}")
        if actual.shape != expected.shape or actual.dtype != expected.dtype:
            raise Mismatch(f"got {tuple(actual.shape)} {actual.dtype}, expected "
                                 f"{tuple(expected.shape)} {expected.dtype}")
        if values:
            torch.testing.assert_close(actual, expected, equal_nan=True, check_device=False,
                                       check_stride=False)
    elif isinstance(expected, (list, tuple)):
        if len(actual) != len(expected):
            raise Mismatch(f"got {len(actual)} results, expected {len(expected)}")
        for a, e in zip(actual, expected, strict=True):
            _compare(a, e, values)
    elif values and not _same_scalar(actual, expected):
        raise Mismatch(f"got {actual!r}, expected {expected!r}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def run_op(op, samples_per_op: int) -> tuple[str, str]:
    """(status, reason) of one op: pass, fail (with the first mismatch) or skip.

    It runs in the first dtype of DTYPES the op supports and, where the op supports it,
    in complex64 too: conjugate and negative views, which only complex tensors make,
    take paths of their own through the backend."""
    cpu_dtypes = op.supported_dtypes("cpu")
    dtypes = [d for d in DTYPES if d in cpu_dtypes][:1]
    if dtypes and dtypes[0] != torch.complex64 and torch.complex64 in cpu_dtypes:
        dtypes.append(torch.complex64)
    if not dtypes:
        return "skip", "no dtype this run tries"
    compared = 0
    for dtype in dtypes:
        status, reason, n = _run_samples(op, dtype, samples_per_op)
        if status == "fail":
            return status, reason
        compared += n
    return ("pass", "") if compared else ("skip", "the CPU ran no sample")


def _run_samples(op, dtype: torch.dtype, samples_per_op: int) -> tuple[str, str, int]:
    """(status, reason, samples compared) of one op in one dtype."""
    key = op_key(op)
    compared = 0
    # Samples are made on the device, so each tensor is where PyTorch's own device tests
    # put it (tensor_split's indices stay on the CPU, as its contract asks); the
    # reference run gets host copies of them.
    samples = iter(op.sample_inputs("neuron", dtype, requires_grad=False))
    for i in range(samples_per_op or sys.maxsize):
        try:
            sample = next(samples, None)
        except Exception as exc:  # noqa: BLE001 - making the sample on the device failed
            return "fail", f"sample {i} ({dtype}), made on the device: {_first_line(exc)}", 0
        if sample is None:
            break
        args = (sample.input, *sample.args)
        cpu_args, cpu_kwargs = _to_cpu(args), _to_cpu(sample.kwargs)
        try:
            expected = op(*cpu_args, **cpu_kwargs)
        except Exception:  # noqa: BLE001, S112 - a sample the CPU refuses tells nothing
            continue
        try:
            actual = _to_cpu(op(*args, **sample.kwargs))
            _compare(actual, _to_cpu(expected), key not in UNCOMPARABLE_VALUES)
        except Exception as exc:  # noqa: BLE001 - any error is this op's failure
            return "fail", f"sample {i} ({dtype}): {_first_line(exc)}", 0
        compared += 1
    return "pass", "", compared


def main() -> None:
    samples_per_op = int(sys.argv[1])
    rest = sys.argv[2:]
    after = None
    if rest[:1] == ["--after"]:
        after, rest = rest[1], rest[2:]
    wanted = set(rest)
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    for op in op_db:
        key = op_key(op)
        if after is not None:
            after = None if key == after else after
            continue
        if wanted and key not in wanted:
            continue
        print(json.dumps({"start": key}), flush=True)
        torch.manual_seed(0)
        status, reason = run_op(op, samples_per_op)
        print(json.dumps({"op": key, "status": status, "reason": reason}), flush=True)


if __name__ == "__main__":
    main()
