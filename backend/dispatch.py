"""Eager dispatch: every aten op on `neuron` tensors runs on zero-copy host views.

One boxed fallback handles the general case from the op's schema: view ops
redispatch to their Meta kernel (the result shares the neuron storage), mutating ops
(in-place and out=) run on host views of their arguments and return the neuron
tensors they wrote, and functional ops run on the host and have their results
relabelled as neuron storages (no copy). Each op then goes to the runtime, which
launches its kernel on the simulated timeline. This module is the hottest path in
the project: per op it builds one signature tuple and no other objects.
"""

from __future__ import annotations

import ctypes
import sys

import torch
from neuron_explorer.backend import devices, matmul_numerics, result_size, runtime
from neuron_explorer.backend.allocator import adopt, attach, block_of
from neuron_explorer.backend.clock import clock
from neuron_explorer.common.errors import NeuronExplorerError
from torch._C import DispatchKey, DispatchKeySet

_perf_ns = clock.real_ns
# marks an error raised by the op itself (not by the backend), on the exception object
_OP_ERROR = "neuron_op_error"
_stamp = clock.stamp
_Tensor = torch.Tensor
_TENSOR_OR_NONE = (_Tensor, type(None))  # built once: `_Tensor | None` is built per call
_CPU_KEYS = DispatchKeySet(DispatchKey.CPU)
_META_KEYS = DispatchKeySet(DispatchKey.Meta)
_set_storage = torch.ops.aten.set_.source_Storage_storage_offset
_redispatch_set = _set_storage._handle.redispatch_boxed
_create_empty = torch._C._acc.create_empty_tensor
_construct_storage = torch._C._construct_storage_from_data_pointer
_host_empty = torch.empty
_alias = torch.ops.aten.alias.default
_state = runtime.state
_record = runtime.record_eager
_new_op_id = runtime.new_op_id
_hub = runtime.hub
_allocation_context = runtime.allocation_context
_all_devices = devices._devices  # filled once, never rebound

# Ops that accept host tensors next to neuron ones, as CUDA's do (indices are moved).
_HOST_OPERANDS_OK = frozenset({"aten::index", "aten::index_put", "aten::index_put_",
                               "aten::_index_put_impl_"})
# Non-tensor arguments that do not change an op's device cost.
_NOT_ATTRS = frozenset({"generator", "device", "pin_memory", "layout", "non_blocking"})

# Schema types (as str(arg.type) spells them) of arguments that can change an op's cost;
# ScalarType and MemoryFormat arguments spell as "int".
_ATTR_TYPES = frozenset({"int", "SymInt", "List[int]", "List[SymInt]", "bool", "str",
                         "List[bool]"})


def _base_type(name: str) -> str:
    return name[9:-1] if name.startswith("Optional[") else name


FUNCTIONAL, MUTATING, VIEW = 0, 1, 2


class OpInfo:
    """What the fallback needs to know about one op overload, from its schema."""

    __slots__ = ("arg_names", "attr_args", "call", "has_generator", "host_operands_ok",
                 "kind", "may_set_math_bits",
                 "name", "none_defaults", "op", "out_args", "redispatch", "sees_math_bits",
                 "size_bounded_by_inputs", "size_rule")

    def __init__(self, op: torch._ops.OpOverload) -> None:
        schema = op._schema
        self.op = op
        self.call = op._op  # skips OpOverload.__call__'s Python frame
        self.redispatch = op._handle.redispatch_boxed
        self.name = schema.name
        returns = schema.returns
        if any(r.alias_info is not None and r.alias_info.is_write for r in returns) or (
            schema.is_mutable and not returns
        ):
            self.kind = MUTATING
        elif any(r.alias_info is not None for r in returns):
            self.kind = VIEW
        else:
            self.kind = FUNCTIONAL
        self.arg_names = tuple(a.name for a in schema.arguments)
        # Arguments whose values can change the op's cost (dims, sizes, flags, dtypes).
        self.attr_args = tuple(
            (i, a.name, a.kwarg_only) for i, a in enumerate(schema.arguments)
            if _base_type(str(a.type)) in _ATTR_TYPES and a.name not in _NOT_ATTRS
        )
        self.has_generator = any(a.name == "generator" for a in schema.arguments)
        # Keyword arguments whose default is None: passing None explicitly to the host op
        # costs keyword parsing for nothing, so they are left out when None.
        self.none_defaults = frozenset(
            a.name for a in schema.arguments
            if a.kwarg_only and a.has_default_value() and a.default_value is None
        )
        self.host_operands_ok = self.name in _HOST_OPERANDS_OK
        self.sees_math_bits = self.name in _SEE_MATH_BITS
        if self.name == "aten::vdot":  # the one that answers lazily conjugated on the CPU
            self.call = _resolving_math_bits(self.call)
        # Some linalg out= kernels answer by setting the conjugate bit on `out` (the
        # CPU's lu_solve(adjoint=True, left=False) does): the bit would be lost.
        self.may_set_math_bits = self.kind == MUTATING and self.name.startswith("aten::linalg_")
        self.out_args = tuple(a.name for a in schema.arguments if a.is_out)
        # How the result's size is checked against free HBM before the host computes it.
        self.size_rule = (None if self.kind == VIEW else
                          result_size.rule_for(op, self.kind == FUNCTIONAL, self.out_args))
        self.size_bounded_by_inputs = result_size.bounded_by_inputs(op)
        if self.kind == FUNCTIONAL:  # bf16/fp16/fp8 products: fp32 kernel, one rounding
            self.call = matmul_numerics.host_kernel(self.name, self.call)


_infos: dict[object, OpInfo] = {}


_MAX_VIEWS_PER_STORAGE = 8  # slicing in a loop must not grow the cache without bound


def host_view(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor over the same memory as neuron tensor `t` (cached per storage and
    geometry, so an in-place metadata change such as `t_()` finds a different view)."""
    # allocator.block_of inlined: this runs for every neuron argument of every op
    block = t.untyped_storage()._neuron_block  # type: ignore[attr-defined]
    geometry = (t.storage_offset(), t.shape, t.stride(), t.dtype)
    host = block.views.get(geometry)
    return host if host is not None else _new_host_view(block, geometry)


def _new_host_view(block, geometry: tuple) -> torch.Tensor:
    """The CPU view of `block` with this (offset, shape, stride, dtype), cached on it."""
    views = block.views
    if len(views) >= _MAX_VIEWS_PER_STORAGE:
        views.clear()
    offset, shape, stride, dtype = geometry
    host = views[geometry] = _host_empty(0, dtype=dtype).set_(block.host, offset, shape, stride)
    # An expanded view can have more elements than its memory has bytes.
    block.max_view_numel = max(block.max_view_numel, result_size.numel_of_nonzero_dims(shape))
    return host


def with_math_bits(host: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """`host` (a view of `t`'s raw memory) read as `t` is: lazily conjugated, negated."""
    if t.is_conj():
        host = host.conj()
    if t.is_neg():
        host = host._neg_view()
    return host


_DLPACK_EXT_DEV = 12  # DLPack's kDLExtDev: PyTorch imports it as a PrivateUse1 tensor
_seeds: dict[tuple[int, torch.dtype], torch.Tensor] = {}


def _seed(index: int, dtype: torch.dtype) -> torch.Tensor:
    """A one-element tensor on neuron:`index`, the template for that device's tensors.

    `create_empty_tensor` only makes neuron:0 tensors and `set_` refuses to move a
    tensor across devices, so other devices' tensors start from a host buffer imported
    through DLPack with its device rewritten to (kDLExtDev, index).
    """
    seed = _seeds.get((index, dtype))
    if seed is None:
        capsule = torch.zeros(1, dtype=dtype).__dlpack__()
        get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
        get_pointer.restype = ctypes.c_void_p
        get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
        # DLManagedTensor starts with DLTensor {void* data; DLDevice {int32 type, int32 id}; ...}
        device = (ctypes.c_int32 * 2).from_address(get_pointer(capsule, b"dltensor") + 8)
        device[0], device[1] = _DLPACK_EXT_DEV, index
        seed = _seeds[(index, dtype)] = torch.from_dlpack(capsule)
    return seed


def blank_tensor(index: int, dtype: torch.dtype) -> torch.Tensor:
    """A new neuron:`index` tensor whose storage is still to be set (with `set_`)."""
    if index == 0:
        return _create_empty((0,), dtype)
    return _alias.redispatch(_META_KEYS, _seed(index, dtype))


def to_device(cpu: torch.Tensor, device: devices.NeuronDevice) -> torch.Tensor:
    """Relabel a CPU result as a neuron tensor on `device`, sharing its memory."""
    host = cpu.untyped_storage()
    offset = cpu.storage_offset()
    if offset == 0 and device.index == 0 and cpu.is_contiguous():
        # Fast path: a fresh neuron:0 tensor of the right geometry takes over the pointer.
        shape, dtype = cpu.shape, cpu.dtype
        out = _create_empty(shape, dtype)
        storage = out.untyped_storage()
        new = _construct_storage(host.data_ptr(), device.torch_device, host.nbytes())
        storage._swap_data_ptr_(new)  # type: ignore[attr-defined]  # in torch, not its stubs
        attach(device.memory, storage, host).views[(0, shape, cpu.stride(), dtype)] = cpu
        return out
    storage = adopt(device.memory, host, device.torch_device)
    block = block_of(storage)
    out = blank_tensor(device.index, cpu.dtype)
    _redispatch_set(_CPU_KEYS, out, storage, offset, cpu.size(), cpu.stride())
    block.views[(offset, cpu.shape, cpu.stride(), cpu.dtype)] = cpu
    return out


def _device_mismatch(a: torch.device, b: torch.device) -> RuntimeError:
    return RuntimeError(
        "Expected all tensors to be on the same device, but found at least two devices, "
        f"{a} and {b}!"
    )


class _Converter:
    """Turns an op's arguments into host views, noting the device and the input signature."""

    __slots__ = ("bound", "index", "info", "made_by", "originals", "sig")

    def __init__(self, info: OpInfo) -> None:
        self.info = info
        self.index = -1
        self.bound = result_size.MAX_ITEMSIZE  # bytes that bound the result (see run_op)
        self.sig: list = []
        self.made_by: list = []  # per tensor input, the op that made it (`Block.made_by`)
        self.originals: dict[int, torch.Tensor] | None = (
            {} if info.kind == MUTATING else None
        )

    def tensor(self, t: torch.Tensor) -> torch.Tensor:
        index = t.get_device()  # an int: cheaper than building t.device
        if index < 0:  # a host (or meta) tensor
            if t.dim() == 0 or self.info.host_operands_ok:
                return t  # host scalars are allowed next to device tensors, as on CUDA
            raise _device_mismatch(torch.device("neuron", max(self.index, 0)), t.device)
        if self.index != index:
            if self.index >= 0:
                raise _device_mismatch(torch.device("neuron", self.index), t.device)
            self.index = index
        shape, dtype = t.shape, t.dtype
        self.sig.append((shape, dtype))
        block = t.untyped_storage()._neuron_block  # type: ignore[attr-defined]  # block_of inlined
        self.made_by.append(block.made_by)
        geometry = (t.storage_offset(), shape, t.stride(), dtype)
        host = block.views.get(geometry)
        if host is None:
            host = _new_host_view(block, geometry)
        self.bound *= block.max_view_numel
        if self.info.sees_math_bits and (t.is_conj() or t.is_neg()):
            # mm and the other BLAS calls get lazily conjugated or negated views with
            # their bits still set (they read them themselves): so must the host view.
            host = with_math_bits(host, t)
        if self.originals is not None:
            self.originals.setdefault(id(host), t)  # aliases: the first argument (self) wins
        return host

    def value(self, v):
        if isinstance(v, _Tensor):
            return self.tensor(v)
        if type(v) in (list, tuple) and v and isinstance(v[0], _TENSOR_OR_NONE):
            return [self.tensor(x) if isinstance(x, _Tensor) else x for x in v]
        return v


def _settle_math_bits(result) -> None:
    """Write the values of host results an op left lazily conjugated or negated into
    their memory, and clear the bits: the neuron tensors over that memory carry none."""
    for host in (result if isinstance(result, (list, tuple)) else (result,)):
        if isinstance(host, _Tensor) and (host.is_conj() or host.is_neg()):
            values = host.resolve_conj().resolve_neg()
            torch._C._set_conj(host, False)
            torch._C._set_neg(host, False)
            host.copy_(values)


def _resolving_math_bits(call):
    """`call`, with a lazily conjugated or negated host result materialised: a neuron
    tensor relabels the host memory, which must hold the values themselves (the CPU's
    `vdot(x, y.conj())` answers with a conjugated view)."""

    def resolved(*args, **kwargs):
        result = call(*args, **kwargs)
        if isinstance(result, _Tensor) and (result.is_conj() or result.is_neg()):
            return result.resolve_conj().resolve_neg()
        return result

    return resolved


# The ops the conjugate and negative keys let through with the bits set (PyTorch's
# ConjugateFallback.cpp and NegateFallback.cpp) that reach this fallback.
_SEE_MATH_BITS = frozenset({
    "aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm", "aten::baddbmm_",
    "aten::dot", "aten::vdot", "aten::linalg_vector_norm", "aten::linalg_solve_triangular",
})


def _attrs(info: OpInfo, args: tuple, kwargs: dict) -> tuple:
    """The non-tensor arguments that can change an op's cost, hashable."""
    if not info.attr_args:
        return ()
    out = []
    n_args = len(args)
    for i, name, kwarg_only in info.attr_args:
        value = args[i] if i < n_args and not kwarg_only else kwargs.get(name)
        if value is None:
            continue
        if type(value) is list:
            value = tuple(value)
        elif not isinstance(value, (int, str, tuple)):
            value = str(value)
        out.append((name, value))
    return tuple(out)


def _data_flow(op_id: int, made_by: list, args: tuple, result, mutating: bool,
               writes_out: bool = False) -> tuple[int, ...]:
    """Per tensor input (then per out= tensor), how many op ids back the op that made it
    was (0: none recorded).
    A result's new memory names its op as it is allocated (`allocator.attach`); an op that
    writes in place (self, a foreach op's first list, or its out= tensors: `writes_out`,
    as `cat.out` writes `out`, not its first list) marks what it wrote here."""
    producers = tuple([op_id - m if m else 0 for m in made_by])
    if mutating:
        written = args[0] if args and type(args[0]) in (list, tuple) and not writes_out \
            else result
        for t in written if isinstance(written, (list, tuple)) else (written,):
            block = getattr(t.untyped_storage(), "_neuron_block", None) \
                if isinstance(t, _Tensor) else None
            if block is not None:
                block.made_by = op_id
    return producers


def _out_sig(result) -> tuple:
    if isinstance(result, _Tensor):
        return ((result.shape, result.dtype),)
    if isinstance(result, (list, tuple)):
        return tuple((r.shape, r.dtype) for r in result if isinstance(r, _Tensor))
    return ()


def _wrap_results(result, device: devices.NeuronDevice):
    if isinstance(result, _Tensor):
        return to_device(result, device)
    if isinstance(result, (list, tuple)):
        wrapped = [to_device(r, device) if isinstance(r, _Tensor) else r for r in result]
        return tuple(wrapped) if isinstance(result, tuple) else wrapped
    return result


def _map_back(result, conv: _Converter, device: devices.NeuronDevice):
    """Mutating ops return host views of their written arguments: return the neuron ones."""
    originals = conv.originals
    assert originals is not None  # a mutating op's converter keeps them
    if isinstance(result, _Tensor):
        return _reclaim(result, originals, device)
    if isinstance(result, (list, tuple)):
        mapped = [_reclaim(r, originals, device) if isinstance(r, _Tensor) else r
                  for r in result]
        return tuple(mapped) if isinstance(result, tuple) else mapped
    return result


def _reclaim(host: torch.Tensor, originals: dict, device: devices.NeuronDevice):
    neuron = originals.get(id(host))
    if neuron is None:
        return to_device(host, device)
    if host.shape != neuron.shape or host.data_ptr() != neuron.data_ptr():
        # The op resized its out= tensor, so the host view moved to new memory: adopt it,
        # and forget the old storage's views (the resized one no longer fits its key).
        block_of(neuron.untyped_storage()).views.clear()
        storage = adopt(device.memory, host.untyped_storage(), device.torch_device)
        _set_storage.redispatch(_CPU_KEYS, neuron, storage, host.storage_offset(), host.size(),
                                host.stride())
    return neuron


def _device_from_kwargs(kwargs: dict) -> devices.NeuronDevice:
    dev = kwargs.get("device")
    return devices.get(dev.index if dev is not None else None)


_NUMBERS = (bool, int, float, complex)


def _call_with_numbers_as_tensors(info: OpInfo, host_args: list, host_kwargs: dict):
    """Retry an op whose Tensor arguments came as Python numbers, or re-raise its error.

    A C++ composite that passes a number to a Tensor argument wraps it in a "wrapped
    number" tensor (`remainder.Scalar_out` calls `remainder.Tensor_out` that way, from
    `take_along_dim`), and the boxed fallback receives it as a plain Python number,
    which the host overload then refuses. A 0-dim tensor of the dtype that the number
    and the op's first tensor promote to keeps the wrapped number's type promotion.
    """
    error = sys.exc_info()[1]
    schema_args = info.op._schema.arguments
    tensor_positions = [i for i, a in enumerate(schema_args) if str(a.type) == "Tensor"]
    first = next((a for a in (*host_args, *host_kwargs.values()) if isinstance(a, _Tensor)),
                 None)
    changed = False
    for i in tensor_positions:
        name = schema_args[i].name
        in_kwargs = i >= len(host_args)
        value = host_kwargs.get(name) if in_kwargs else host_args[i]
        if value is not None and type(value) in _NUMBERS:
            dtype = torch.result_type(first, value) if first is not None else None
            number = torch.tensor(value, dtype=dtype)
            if in_kwargs:
                host_kwargs[name] = number
            else:
                host_args[i] = number
            changed = True
    if not changed:
        assert error is not None  # called while handling the op's error
        raise error
    return info.call(*host_args, **host_kwargs)


def run_op(op, args: tuple, kwargs: dict):
    """Run one aten op on neuron tensors: the boxed fallback for PrivateUse1."""
    real_start, host_start = _stamp()  # one reading: see HostClock.stamp
    op_id = _new_op_id()  # runtime.begin_op, inlined
    if _hub.active and _state.accounting:
        _allocation_context.op_id = op_id
        _allocation_context.host_ns = host_start
    info = _infos.get(op)
    if info is None:
        info = _infos[op] = OpInfo(op)

    if info.kind == VIEW:
        try:
            result = info.redispatch(_META_KEYS, *args, **kwargs)
        except (NotImplementedError, RuntimeError):
            result = info.redispatch(_CPU_KEYS, *args, **kwargs)
        device = devices.get(result.get_device() if isinstance(result, _Tensor) else None)
        if _state.accounting:
            key = (info.name, tuple([(a.shape, a.dtype) for a in args if isinstance(a, _Tensor)]),
                   _out_sig(result), ())
            _record(device, key, real_start, host_start, op_id)
        else:
            clock.exclude(_perf_ns() - real_start)
        return result

    conv = _Converter(info)
    tensor = conv.tensor
    host_args = [tensor(a) if isinstance(a, _Tensor) else conv.value(a) for a in args]
    if kwargs:
        skip, outs = info.none_defaults, info.out_args
        host_kwargs = {k: conv.value(v) for k, v in kwargs.items()
                       if (v is not None or k not in skip) and k not in outs}
        n_inputs = len(conv.sig)
        for k in outs:  # converted last: the signature's out= tensors follow its inputs
            if k in kwargs:
                host_kwargs[k] = conv.value(kwargs[k])
    else:
        host_kwargs = {}
        n_inputs = len(conv.sig)
    if conv.index < 0:
        device = _device_from_kwargs(kwargs)
        if "device" in host_kwargs:
            host_kwargs["device"] = None
    else:
        device = _all_devices[conv.index]  # a tensor's device exists: no check needed
    if info.has_generator and host_kwargs.get("generator") is None:
        host_kwargs["generator"] = device.generator

    rule = info.size_rule
    if rule is not None:  # the result must fit in HBM before the host computes it
        memory = device.memory
        # For broadcasts, matmuls, reductions... the product of the inputs' sizes bounds
        # the result's: small ops, the hot path, skip the rule.
        if (not info.size_bounded_by_inputs or conv.index < 0
                or conv.bound > memory.capacity - memory.in_use):
            try:
                rule(info, device, conv.sig, args, kwargs)
            except torch.OutOfMemoryError as error:
                setattr(error, _OP_ERROR, True)  # the program's error, as CUDA would raise it
                raise
    try:
        try:
            result = info.call(*host_args, **host_kwargs)
        except RuntimeError:
            result = _call_with_numbers_as_tensors(info, host_args, host_kwargs)
    except Exception as error:
        setattr(error, _OP_ERROR, True)  # the op's own error: the CPU raises the same
        raise
    if info.kind == MUTATING:
        if info.may_set_math_bits:
            _settle_math_bits(result)
        result = _map_back(result, conv, device)
        if n_inputs < len(conv.sig):
            # an out= op writes its out= tensors, as the functional op it stands for
            # returns them (the eager `amax` and `topk` run as `amax.out`, `topk.values`);
            # the data flow keeps what last wrote them, after the inputs' producers (DDP's
            # reducer copies each gradient into the bucket the copy before it wrote)
            out_sig = tuple(conv.sig[n_inputs:])
            del conv.sig[n_inputs:]
        else:
            # what it writes: self, or a `_foreach_*_`'s or fused optimizer's first list
            first = args[0] if args else None
            out_sig = tuple(conv.sig[:len(first) if isinstance(first, (list, tuple)) else 1])
    elif isinstance(result, _Tensor):  # the common case, without the two helpers
        out_sig = ((result.shape, result.dtype),)
        result = to_device(result, device)
    else:
        out_sig = _out_sig(result)
        result = _wrap_results(result, device)

    if _state.accounting:
        key = (info.name, tuple(conv.sig), out_sig, _attrs(info, args, kwargs))
        _record(device, key, real_start, host_start, op_id,
                _data_flow(op_id, conv.made_by, args, result, info.kind == MUTATING,
                           n_inputs < len(conv.made_by))
                if _hub.active else ())
        if not isinstance(result, (_Tensor, list, tuple)) and result is not None:
            runtime.synchronize(device.index, "item")  # the host read device data
    else:
        clock.exclude(_perf_ns() - real_start)
    return result


def _from_the_op(error: BaseException) -> BaseException:
    """An error the op raised as it would on the CPU (a shape mismatch, out of memory),
    with the frames of the emulation dropped: the traceback ends at the user's call, as
    on a built-in device. Any other error keeps its frames: it is the backend's own."""
    delattr(error, _OP_ERROR)
    return error.with_traceback(None)


class NestedTensorError(NeuronExplorerError, NotImplementedError):
    """A nested tensor on the device, which holds dense tensors only."""


def _nested_error(op) -> NestedTensorError | None:
    """A clear error for an op that makes or takes a nested tensor: in eval mode under
    no_grad, nn.TransformerEncoder given a padding mask takes its fast path, which packs the
    batch into one (a trial's server crashed with "NestedTensorImpl doesn't support
    sizes" once told to call model.eval())."""
    name = op.name()
    if "nested" not in name.partition("::")[2].split(".")[0]:
        return None
    return NestedTensorError(
        f"{name}: nested tensors are not supported on the neuron device. "
        "nn.TransformerEncoder makes one in eval mode from a padding mask (its fast path): "
        "construct it with enable_nested_tensor=False, or pass no src_key_padding_mask")


def fallback(op, *args, **kwargs):
    """Boxed PrivateUse1 fallback."""
    try:
        return run_op(op, args, kwargs)
    except BaseException as error:
        runtime.abandon_op()
        # checked only once an op failed: the name is not looked at on the per-op path
        if (refused := _nested_error(op)) is not None:
            raise refused from None  # the traceback ends at the user's call
        if getattr(error, _OP_ERROR, False):
            raise _from_the_op(error) from error.__cause__
        raise


def kernel_for(op):
    """A PrivateUse1 kernel running `op` through `run_op` (for ops the fallback cannot reach)."""

    def kernel(*args, **kwargs):
        try:
            return run_op(op, args, kwargs)
        except BaseException as error:
            runtime.abandon_op()
            if getattr(error, _OP_ERROR, False):
                raise _from_the_op(error) from error.__cause__
            raise

    return kernel
