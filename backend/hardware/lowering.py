"""Turn an op into a kernel for a preset, with a cache keyed by the op's signature.

A kernel's schedule is a pure function of (op name, shapes, dtypes, attrs, preset),
so each signature is lowered once; a cache hit costs one dict lookup. Ops the device
cannot run raise NoLowering and are costed by `lower_host_fallback` instead.
"""

from __future__ import annotations

from neuron_explorer.backend.hardware.builder import KernelBuilder
from neuron_explorer.backend.hardware.kernel import Kernel
from neuron_explorer.backend.hardware.optable import (
    HOST_ONLY,
    NO_DEVICE_WORK,
    lowering_for,
)
from neuron_explorer.backend.hardware.specs import OpSpec
from neuron_explorer.common.errors import NeuronExplorerError
from neuron_explorer.common.op_families import GEMM, base_name
from neuron_explorer.common.presets import HardwarePreset

MAX_CACHED = 1 << 16  # kernels kept per preset; the oldest go first
_MISS = object()
_NO_KERNEL = object()  # cached "raises NoLowering"
# Matmuls named by their dims (batch, m, k, n): the GEMMs, and matmul and linear, which
# lower onto one. The other matmuls (vector products, addbmm that sums its batch away) are
# named by their result's shape, as other ops are.
_NAMED_BY_DIMS = GEMM | {"matmul", "linear"}

_SHORT_DTYPES = {
    "float32": "f32", "bfloat16": "bf16", "float16": "f16", "float64": "f64",
    "float8_e4m3fn": "fp8", "float8_e5m2": "fp8e5", "int64": "i64", "int32": "i32",
    "bool": "bool", "int8": "i8", "uint8": "u8",
}


class NoLowering(NeuronExplorerError, NotImplementedError):
    """The device has no kernel for this op: it runs on the host (fallback)."""

    def __init__(self, op: str) -> None:
        self.op = op
        base = base_name(op)
        why = " (not supported by the NeuronCore)" if base in HOST_ONLY else ""
        super().__init__(
            f"{op} has no device lowering{why}: it runs on the host, with device<->host "
            "copies; see neuron_explorer.backend.hardware.optable for the ops the device runs"
        )


class _Caches:
    """One dict of lowered kernels per preset object (identity, not equality: fast)."""

    def __init__(self) -> None:
        self._by_preset: dict[int, tuple[HardwarePreset, dict]] = {}
        self._last: tuple = (None, {})

    def get(self, preset: HardwarePreset, kind: str) -> dict:
        last = self._last
        if last[0] is preset:  # the common case: one preset in the whole process
            return last[1][kind]
        key = id(preset)
        entry = self._by_preset.get(key)
        if entry is None or entry[0] is not preset:
            entry = (preset, {"op": {}, "fallback": {}, "transfer": {}})
            self._by_preset[key] = entry
        self._last = entry
        return entry[1][kind]

    def clear(self) -> None:
        self._by_preset.clear()
        self._last = (None, {})


_caches = _Caches()


def clear_cache() -> None:
    """Forget every lowered kernel (tests, or after changing a preset)."""
    _caches.clear()


def _remember(cache: dict, key: object, value: object) -> None:
    if len(cache) >= MAX_CACHED:
        cache.pop(next(iter(cache)))
    cache[key] = value


def kernel_name(base: str, spec: OpSpec) -> str:
    """'mm_bf16_64x512x512'-style name: op, dtype, and the dims that matter."""
    first = spec.inputs[0] if spec.inputs else (spec.outputs[0] if spec.outputs else None)
    if first is None:
        return base
    dtype = _SHORT_DTYPES.get(first.dtype, first.dtype)
    if base in _NAMED_BY_DIMS and len(spec.inputs) >= 2:
        a, b = spec.inputs[-2], spec.inputs[-1]
        dims: tuple[int, ...]
        if base == "linear":
            a, b = spec.inputs[0], spec.inputs[1]
            dims = (a.numel // max(a.shape[-1], 1), a.shape[-1], b.shape[0]) if a.shape else ()
        else:
            dims = tuple(a.shape) + tuple(b.shape[-1:])
        return f"{base}_{dtype}_" + "x".join(map(str, dims))
    out = spec.outputs[0] if spec.outputs else first
    return f"{base}_{dtype}_" + ("x".join(map(str, out.shape)) or "scalar")


def lower_op(spec: OpSpec, preset: HardwarePreset) -> Kernel | None:
    """The kernel running `spec` on `preset`; None for ops with no device work (views,
    metadata); raises NoLowering for ops the device cannot run."""
    cache = _caches.get(preset, "op")
    hit = cache.get(spec, _MISS)
    if hit is not _MISS:
        if hit is _NO_KERNEL:
            raise NoLowering(spec.name)
        return hit
    try:
        kernel = _lower(spec, preset)
    except NoLowering:
        _remember(cache, spec, _NO_KERNEL)
        raise
    _remember(cache, spec, kernel)
    return kernel


def _lower(spec: OpSpec, preset: HardwarePreset) -> Kernel | None:
    base = base_name(spec.name)
    if base in NO_DEVICE_WORK:
        return None
    fn = lowering_for(base)
    if fn is None:
        raise NoLowering(spec.name)
    if all(t.numel == 0 for t in spec.outputs) and spec.outputs:
        return None  # empty result: nothing to compute
    builder = KernelBuilder(preset, kernel_name(base, spec))
    fn(builder, spec)
    if len(builder) == 0:
        return None
    return builder.build()


def lower_host_fallback(spec: OpSpec, preset: HardwarePreset) -> Kernel:
    """The device-side cost of running `spec` on the host: copy the inputs to the host,
    wait while the host computes, copy the outputs back."""
    cache = _caches.get(preset, "fallback")
    hit = cache.get(spec)
    if hit is not None:
        return hit
    base = base_name(spec.name)
    b = KernelBuilder(preset, "host_" + kernel_name(base, spec))
    emit_host_fallback(b, spec)
    kernel = b.build(fallback=True)
    _remember(cache, spec, kernel)
    return kernel


def emit_host_fallback(b: KernelBuilder, spec: OpSpec) -> None:
    """Emit the device side of running `spec` on the host into `b` (see
    lower_host_fallback); a compiled graph's program holds these too."""
    preset = b.preset
    b.host_fallbacks.append(spec.name)
    bytes_in = sum(t.nbytes for t in spec.inputs)
    bytes_out = sum(t.nbytes for t in spec.outputs)
    sent = tuple(b.host_transfer("DmaToHost", t.nbytes) for t in spec.inputs if t.nbytes)
    b.hbm_read_bytes += bytes_in
    host_ns = preset.host_fallback_fixed_ns + (bytes_in + bytes_out) / \
        preset.host_compute_bytes_per_ns
    back = [b.host_transfer("DmaFromHost", t.nbytes, sent, host_ns)
            for t in spec.outputs if t.nbytes]
    if not back:  # nothing comes back (an in-place op): the device still waits for the host
        b.host_transfer("DmaFromHost", 0, sent, host_ns)
    b.hbm_write_bytes += bytes_out


def lower_host_transfer(nbytes: int, preset: HardwarePreset, to_device: bool = True) -> Kernel:
    """A copy between host memory and this device's HBM (`tensor.to("neuron")`, `.cpu()`)."""
    cache = _caches.get(preset, "transfer")
    key = (int(nbytes), bool(to_device))
    hit = cache.get(key)
    if hit is not None:
        return hit
    name = "copy_host_to_device" if to_device else "copy_device_to_host"
    b = KernelBuilder(preset, name)
    b.host_transfer("DmaFromHost" if to_device else "DmaToHost", nbytes)
    if to_device:
        b.hbm_write_bytes += int(nbytes)
    else:
        b.hbm_read_bytes += int(nbytes)
    kernel = b.build()
    _remember(cache, key, kernel)
    return kernel
