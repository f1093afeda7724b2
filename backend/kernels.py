"""The neuron kernels the boxed fallback cannot provide: allocation, copies, scalars,
storage resets, convolution, and single-trip kernels for hot structured ops.

PyTorch's own default kernels win over a backend fallback, so factories, `_copy_from`,
`_to_copy`, `set_`, `resize_`, `convolution_overrideable` and the `_foreach_*` ops
need explicit PrivateUse1 kernels; structured ops (add, mm, ...) would otherwise
cost two trips (empty, then `.out`).
"""

from __future__ import annotations

import hashlib

import torch
from neuron_explorer.backend import devices, dispatch, result_size, runtime
from neuron_explorer.backend.allocator import allocate, block_of
from neuron_explorer.backend.clock import clock

aten = torch.ops.aten
_perf_ns = clock.real_ns
_state = runtime.state
_hub = runtime.hub
_CPU_KEYS = dispatch._CPU_KEYS
_set_storage = dispatch._set_storage
host_view = dispatch.host_view

# Direction of a copy, as the op key's attribute the hardware lowers to DMA.
TO_DEVICE = (("direction", "host_to_device"),)
TO_HOST = (("direction", "device_to_host"),)
ON_DEVICE = (("direction", "device_to_device"),)

# An upload of a host tensor already uploaded unchanged (the same tensor, or the same view
# of one base tensor, `X[step % 8]`, its version counter unmoved): a constant the program
# could move to the device once. The marks are an attribute on the base tensor, one per
# view (offset, sizes, strides, dtype): a weak reference to it would make
# `torch.utils.swap_tensors` refuse it (module_conversion swaps moved parameters).
SAME_HOST_TENSOR = (("same_host_tensor", True),)
# A copy within the device from a strided view (`x.permute(...)` made contiguous by
# `.contiguous()`, reshape or an op that needs it): a layout the program could keep.
LAYOUT_COPY = (("layout_copy", True),)
_UPLOADED_VERSIONS = "_neuron_uploaded_versions"


# A host tensor of up to 1 MiB made again with the same values every step
# (`torch.tensor([...])`, a positional encoding or a mask built in the loop) is a constant
# too: a digest of its values is remembered while a recording listens (hashing, about
# 1 ms a MiB, is the emulator's time, off the host clock; at 16 KiB a 32 KiB positional
# encoding rebuilt every step read as data new every step).
SAME_VALUES_MAX_BYTES = 1 << 20
_SAME_VALUES_KEPT = 4096
_uploaded_values: dict[bytes, None] = {}  # digests of small uploads, oldest first
_values_of: list[int] = [0]  # the recording (`hub.listening_since`) they are of


def _upload_attrs(host: torch.Tensor) -> tuple:
    """The attrs of an upload of `host` (direction, and whether it was uploaded before:
    the same tensor unchanged, or a small one with the same values)."""
    try:
        version = host._version  # a view shares its base's counter
        base = host if host._base is None else host._base
        view = (host.storage_offset(), tuple(host.shape), tuple(host.stride()), host.dtype)
        uploaded = getattr(base, _UPLOADED_VERSIONS, None)
        if uploaded is None:
            uploaded = {}
            setattr(base, _UPLOADED_VERSIONS, uploaded)
        repeated = uploaded.get(view) == version
        uploaded[view] = version
    except (RuntimeError, AttributeError):  # an inference tensor keeps no version
        repeated = False
    if not repeated and _hub.active and _state.accounting:
        repeated = _same_values_uploaded(host)
    return TO_DEVICE + SAME_HOST_TENSOR if repeated else TO_DEVICE


def _same_values_uploaded(host: torch.Tensor) -> bool:
    """Whether a host tensor of `host`'s dtype, shape and values was uploaded before in
    this recording (up to `SAME_VALUES_MAX_BYTES`)."""
    if host.layout != torch.strided or host.numel() * host.element_size() > SAME_VALUES_MAX_BYTES:
        return False
    if _values_of[0] != _hub.listening_since:  # a new recording in this process
        _uploaded_values.clear()
        _values_of[0] = _hub.listening_since
    data = host.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    digest = hashlib.blake2b(f"{host.dtype}{tuple(host.shape)}".encode(), digest_size=16)
    digest.update(data.data)
    key = digest.digest()
    if key in _uploaded_values:
        return True
    _uploaded_values[key] = None
    if len(_uploaded_values) > _SAME_VALUES_KEPT:
        del _uploaded_values[next(iter(_uploaded_values))]
    return False


# Sync kind of the next device-to-host copy, set by the wrappers that know why the
# host reads (printing, tolist, item); "copy_to_host" otherwise.
sync_kind: list[str] = []


def _contiguous_strides(size) -> tuple[int, ...]:
    strides = []
    acc = 1
    for n in reversed(size):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


def _account(device, name: str, inputs: tuple, outputs: tuple, attrs: tuple,
             real_start: int, host_start: int, op_id: int | None = None,
             producers: tuple[int, ...] = ()) -> None:
    if _state.accounting:
        runtime.record_eager(device, (name, inputs, outputs, attrs), real_start, host_start,
                             op_id, producers)
    else:
        clock.exclude(_perf_ns() - real_start)


_MAX_NBYTES = (1 << 63) - 1  # PyTorch's storage sizes are int64


def storage_nbytes(size, stride, dtype: torch.dtype, storage_offset: int = 0) -> int:
    """The bytes a tensor of this geometry needs, or the CPU's error for a negative
    dimension or a size that overflows (never a huge number handed to the host
    allocator)."""
    if size and min(size) < 0:
        raise RuntimeError(f"Trying to create tensor with negative dimension {min(size)}: "
                           f"{list(size)}")
    if not all(size):
        return 0
    extent = 1 + storage_offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
    nbytes = extent * dtype.itemsize
    if nbytes > _MAX_NBYTES or (stride and min(stride) < 0):
        raise RuntimeError(f"Storage size calculation overflowed with sizes={list(size)} and "
                           f"strides={list(stride)}")
    return nbytes


def new_tensor(size, stride, dtype: torch.dtype, device: devices.NeuronDevice) -> torch.Tensor:
    """An uninitialised neuron tensor with this geometry."""
    nbytes = storage_nbytes(size, stride, dtype)
    try:
        storage = allocate(device.memory, nbytes, device.torch_device)
    except torch.OutOfMemoryError as error:
        # the program's error, as CUDA raises it: the traceback ends at the user's call
        raise error.with_traceback(None) from error.__cause__
    out = dispatch.blank_tensor(device.index, dtype)
    _set_storage.redispatch(_CPU_KEYS, out, storage, 0, size, stride)
    return out


def empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    real_start, host_start = clock.stamp()
    op_id = runtime.begin_op(host_start)
    dev = devices.get(device.index if device is not None else None)
    dtype = dtype or torch.get_default_dtype()
    if memory_format is None or memory_format == torch.contiguous_format:
        stride = _contiguous_strides(size)
    else:
        stride = torch.empty(size, dtype=dtype, device="meta", memory_format=memory_format).stride()
    out = new_tensor(tuple(size), stride, dtype, dev)
    _account(dev, "aten::empty", (), ((out.shape, dtype),), (), real_start, host_start, op_id)
    return out


def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    real_start, host_start = clock.stamp()
    op_id = runtime.begin_op(host_start)
    dev = devices.get(device.index if device is not None else None)
    dtype = dtype or torch.get_default_dtype()
    out = new_tensor(tuple(size), tuple(stride), dtype, dev)
    _account(dev, "aten::empty_strided", (), ((out.shape, dtype),), (), real_start, host_start,
             op_id)
    return out


def _copy_to_host(src: torch.Tensor, dst_host: torch.Tensor, real_start: int,
                  host_start: int) -> None:
    dev = devices.get(src.device.index)
    dst_host.copy_(_logical_host_view(src))
    _account(dev, "aten::_copy_from", ((src.shape, src.dtype),),
             ((dst_host.shape, dst_host.dtype),), TO_HOST, real_start, host_start,
             *_copy_data_flow(src, None))
    if _state.accounting:
        runtime.synchronize(dev.index, sync_kind[-1] if sync_kind else "copy_to_host")


def _logical_host_view(t: torch.Tensor) -> torch.Tensor:
    """The host view of `t` as `t` reads: a copy through it honours the lazy bits."""
    return dispatch.with_math_bits(host_view(t), t)


def copy_from(self: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """`dst.copy_(self)` where either side is on a neuron device.

    The conjugate and negative keys let this kernel through (see `register`), so `self`
    or `dst` may be a lazily conjugated or negated view: their bits are honoured here.
    """
    real_start, host_start = clock.stamp()
    if dst.device.type != "neuron":
        _copy_to_host(self, dst, real_start, host_start)
        return dst
    dev = devices.get(dst.device.index)
    if self.device.type == "neuron":
        _logical_host_view(dst).copy_(_logical_host_view(self))
        attrs = ON_DEVICE if self.is_contiguous() else ON_DEVICE + LAYOUT_COPY
    else:
        _logical_host_view(dst).copy_(self)
        attrs = _upload_attrs(self)
    op_id, producers = _copy_data_flow(self, dst)
    if op_id is not None:
        block_of(dst.untyped_storage()).made_by = op_id
    _account(dev, "aten::_copy_from", ((self.shape, self.dtype),), ((dst.shape, dst.dtype),),
             attrs, real_start, host_start, op_id, producers)
    return dst


def _copy_data_flow(src: torch.Tensor,
                    dst: torch.Tensor | None) -> tuple[int | None, tuple[int, ...]]:
    """A recorded copy's op id and the op that made its source (how many ids back, 0: none);
    the copy is what made `dst` now, on the device (`dispatch._data_flow` does this for
    other ops): `x.contiguous()` is an `empty` then this copy, and the ops reading the
    copy read what the copy made, not the `empty`. A read to the host (`dst` None) marks
    nothing: what the host reads, and the ops that made it only for that, go with it."""
    if not (_hub.active and _state.accounting):
        return None, ()
    op_id = runtime.next_op_id()
    return op_id, (_made_by(src, op_id),)


def _made_by(src: torch.Tensor, op_id: int) -> int:
    """How many op ids before `op_id` the op that made `src` was (0: none recorded)."""
    made = getattr(src.untyped_storage(), "_neuron_block", None) \
        if src.device.type == "neuron" else None
    return op_id - made.made_by if made is not None and made.made_by else 0


def copy_from_and_resize(self: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    if dst.shape != self.shape:
        dst.resize_(self.shape)
    return copy_from(self, dst)


def to_copy(self, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
            memory_format=None):
    """`.to(...)` of a neuron tensor: to the host (a sync point), or to a neuron device."""
    real_start, host_start = clock.stamp()
    op_id = runtime.begin_op(host_start)
    target = device if device is not None else self.device
    from_host = self.device.type != "neuron"
    if target.type == "neuron":  # before the host makes the copy
        result_size.check_host_to_device(devices.get(target.index), self.numel(),
                                         dtype or self.dtype)
    host = (self if from_host else host_view(self)).to(
        dtype=dtype or self.dtype, copy=True, memory_format=memory_format or torch.preserve_format)
    if from_host:
        dst_dev = devices.get(target.index)
        out = dispatch.to_device(host, dst_dev)
        _account(dst_dev, "aten::_to_copy", ((self.shape, self.dtype),),
                 ((out.shape, out.dtype),), _upload_attrs(self), real_start, host_start,
                 op_id)
        return out
    src_dev = devices.get(self.device.index)
    if target.type != "neuron":
        _account(src_dev, "aten::_to_copy", ((self.shape, self.dtype),),
                 ((host.shape, host.dtype),), TO_HOST, real_start, host_start, op_id,
                 (_made_by(self, op_id),) if _hub.active and _state.accounting else ())
        if _state.accounting:
            runtime.synchronize(src_dev.index, sync_kind[-1] if sync_kind else "cpu")
        return host
    dst_dev = devices.get(target.index if target.index is not None else None)
    out = dispatch.to_device(host, dst_dev)
    # the op that made what it casts: without it, `x.float()` and autocast's cast of it
    # back were unrelated, and a cast's readers could not be followed to what it read
    _account(dst_dev, "aten::_to_copy", ((self.shape, self.dtype),), ((out.shape, out.dtype),),
             ON_DEVICE, real_start, host_start, op_id,
             (_made_by(self, op_id),) if _hub.active and _state.accounting else ())
    return out


def local_scalar_dense(self: torch.Tensor):
    """`.item()`: the host reads one value, so it waits for the device."""
    real_start, host_start = clock.stamp()
    dev = devices.get(self.device.index)
    value = host_view(self).item()
    _account(dev, "aten::_local_scalar_dense", ((self.shape, self.dtype),), (), TO_HOST,
             real_start, host_start, *_copy_data_flow(self, None))
    if _state.accounting:
        runtime.synchronize(dev.index, sync_kind[-1] if sync_kind else "item")
    return value


def read_to_host(self: torch.Tensor, kind: str) -> None:
    """Charge the host reading all of `self` (a transfer, then a sync point of `kind`)."""
    real_start, host_start = clock.stamp()
    dev = devices.get(self.device.index)
    _account(dev, "aten::_to_copy", ((self.shape, self.dtype),), ((self.shape, self.dtype),),
             TO_HOST, real_start, host_start, *_copy_data_flow(self, None))
    if _state.accounting:
        runtime.synchronize(dev.index, kind)


def set_storage(self, source, storage_offset=0, size=(), stride=()):
    return _set_storage.redispatch(_CPU_KEYS, self, source, storage_offset, size, stride)


def set_whole_storage(self, source):
    n = source.nbytes() // self.dtype.itemsize
    return _set_storage.redispatch(_CPU_KEYS, self, source, 0, (n,), (1,))


def set_empty(self):
    dev = devices.get(self.device.index)
    storage = allocate(dev.memory, 0, dev.torch_device)
    return _set_storage.redispatch(_CPU_KEYS, self, storage, 0, (0,), (1,))


def resize_(self, size, memory_format=None):
    """Resize in place; grows the storage (copying what it held) when it is too small."""
    size = tuple(size)
    if memory_format is None or memory_format == torch.contiguous_format:
        stride = _contiguous_strides(size)
    else:
        stride = torch.empty(size, device="meta", memory_format=memory_format).stride()
    needed = storage_nbytes(size, stride, self.dtype, self.storage_offset())
    storage = self.untyped_storage()
    if needed > storage.nbytes():
        dev = devices.get(self.device.index)
        new = allocate(dev.memory, needed, dev.torch_device)
        old_host = block_of(storage).host
        if old_host.nbytes():
            block_of(new).host[: old_host.nbytes()].copy_(old_host)
        storage = new
    _set_storage.redispatch(_CPU_KEYS, self, storage, self.storage_offset(), size, stride)
    return self


def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                groups):
    return dispatch.run_op(aten.convolution.default, (input, weight, bias, stride, padding,
                                                      dilation, transposed, output_padding,
                                                      groups), {})


def convolution_backward(grad_output, input, weight, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask):
    bias_sizes = [weight.shape[1] * groups if transposed else weight.shape[0]]
    return dispatch.run_op(aten.convolution_backward.default,
                           (grad_output, input, weight, bias_sizes, stride, padding, dilation,
                            transposed, output_padding, groups, output_mask), {})


# Structured ops that would otherwise take two trips (empty, then .out).
HOT_STRUCTURED = (
    "add.Tensor", "sub.Tensor", "mul.Tensor", "div.Tensor", "addmm.default", "mm.default",
    "bmm.default", "baddbmm.default", "threshold_backward.default", "gelu.default",
    "gelu_backward.default", "tanh.default", "tanh_backward.default", "exp.default",
    "sqrt.default", "rsqrt.default", "neg.default", "pow.Tensor_Scalar", "sum.dim_IntList",
    "mean.dim", "_log_softmax.default", "_log_softmax_backward_data.default",
    "_softmax.default", "_softmax_backward_data.default", "nll_loss_forward.default",
    "nll_loss_backward.default", "addcmul.default", "addcdiv.default", "maximum.default",
    "lerp.Scalar", "sigmoid.default", "sigmoid_backward.default", "silu.default",
    "silu_backward.default", "mse_loss.default", "eq.Scalar", "ne.Scalar", "gt.Scalar",
    "lt.Scalar", "ge.Scalar", "le.Scalar", "clamp.default", "where.self", "sum.default",
    "max.dim", "argmax.default", "lt.Tensor", "norm.ScalarOpt_dim", "linalg_vector_norm.default",
    "add_.Tensor", "mul_.Tensor", "sub_.Tensor", "div_.Tensor", "addcmul_.default",
    "addcdiv_.default", "lerp_.Scalar", "mul_.Scalar", "add_.Scalar", "clamp_.default",
    "sqrt_.default",
)

# _foreach_* ops the optimizers and clip_grad_norm_ use; PyTorch's per-tensor default
# would win over the fallback and launch one op per tensor.
FOREACH = (
    "_foreach_add", "_foreach_add_", "_foreach_sub", "_foreach_sub_", "_foreach_mul",
    "_foreach_mul_", "_foreach_div", "_foreach_div_", "_foreach_addcmul", "_foreach_addcmul_",
    "_foreach_addcdiv", "_foreach_addcdiv_", "_foreach_lerp", "_foreach_lerp_",
    "_foreach_sqrt", "_foreach_sqrt_", "_foreach_neg", "_foreach_neg_", "_foreach_maximum",
    "_foreach_maximum_", "_foreach_norm", "_foreach_copy_", "_foreach_zero_",
    "_foreach_reciprocal_", "_foreach_pow", "_foreach_pow_", "_foreach_abs", "_foreach_abs_",
    "_foreach_clamp_max_", "_foreach_clamp_min_", "_foreach_sign", "_foreach_exp",
    "_foreach_exp_", "_foreach_max",
)

# Ops whose CompositeExplicitAutograd default would win over the fallback and decompose
# them (layer and group norm into native_batch_norm on a reshaped input): the CPU has
# kernels of its own, and only these give its numbers exactly and the op's own name.
HOST_KERNEL_OVER_COMPOSITE = ("native_layer_norm.default", "native_group_norm.default")


def register(lib: torch.library.Library) -> None:
    """Register every explicit PrivateUse1 kernel on `lib` (an aten IMPL library)."""
    key = "PrivateUse1"
    lib.impl("empty.memory_format", empty, key)
    lib.impl("empty_strided", empty_strided, key)
    lib.impl("_copy_from", copy_from, key)
    lib.impl("_copy_from_and_resize", copy_from_and_resize, key)
    # Without these the conjugate (negative) fallback resolves a lazily conjugated
    # source by copying it, which calls `_copy_from` again: an endless recursion that
    # overflows the C stack. `copy_from` honours the bits itself.
    for math_bit_key in ("Conjugate", "Negative"):
        lib.impl("_copy_from", torch.library.fallthrough_kernel, math_bit_key)
        lib.impl("_copy_from_and_resize", torch.library.fallthrough_kernel, math_bit_key)
    lib.impl("_to_copy", to_copy, key)
    lib.impl("_local_scalar_dense", local_scalar_dense, key)
    lib.impl("set_.source_Storage_storage_offset", set_storage, key)
    lib.impl("set_.source_Storage", set_whole_storage, key)
    lib.impl("set_", set_empty, key)
    lib.impl("resize_", resize_, key)
    lib.impl("convolution_overrideable", convolution, key)
    lib.impl("convolution_backward_overrideable", convolution_backward, key)
    for name in (*HOT_STRUCTURED, *HOST_KERNEL_OVER_COMPOSITE):
        packet_name, overload = name.split(".")
        op = getattr(getattr(aten, packet_name), overload)
        lib.impl(name if overload != "default" else packet_name, dispatch.kernel_for(op), key)
    for packet_name in FOREACH:
        packet = getattr(aten, packet_name, None)
        if packet is None:
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload)
            lib.impl(packet_name if overload == "default" else f"{packet_name}.{overload}",
                     dispatch.kernel_for(op), key)
