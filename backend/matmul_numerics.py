"""Device matmul numerics on the host: bf16/fp16/fp8 products computed as the chip does.

The Tensor Engine multiplies bf16 (fp16, fp8) operands exactly and accumulates in fp32
in PSUM; the result is rounded once, when it leaves PSUM in the output dtype. A host
without native bf16 computes PyTorch's CPU bf16 matmul ~75x slower than fp32, so the
host numbers of device matmuls (mm, bmm, addmm, baddbmm, addbmm, mv, addmv, dot,
convolution and its backward; linear, matmul, conv and SDPA decompose into these) are
computed the chip's way: operands widened to fp32 (exact: every bf16/fp16/fp8 value is
an fp32 value), one fp32 kernel, one round-to-nearest-even to the input dtype. The
result is at least as accurate as CPU bf16's (which also accumulates in fp32) and
within one bf16 ulp of it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from neuron_explorer.common import op_families
from torch.utils._python_dispatch import TorchDispatchMode

LOW_PRECISION = frozenset({
    torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2,
    torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
})
# The families whose products reach the host as kernels of their own (common/op_families.py).
# Attention is not one: on the device it takes PyTorch's math path, whose bmms are matmuls.
_FAMILIES = (op_families.MATMUL, op_families.CONVOLUTION)
_F32 = torch.float32


def _low_dtype(args: tuple, kwargs: dict) -> torch.dtype | None:
    """The one low-precision dtype of the floating-point tensor operands, if they share
    it; None when any is fp32/fp64 or they differ (PyTorch's own rules then apply)."""
    found = None
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            if value.dtype not in LOW_PRECISION or (found is not None and value.dtype != found):
                return None
            found = value.dtype
    return found


def _widen(value: object) -> object:
    if isinstance(value, torch.Tensor) and value.dtype in LOW_PRECISION:
        return value.to(_F32)
    return value


def _round(value: object, dtype: torch.dtype) -> object:
    if isinstance(value, torch.Tensor) and value.dtype == _F32:
        return value.to(dtype)
    if isinstance(value, (tuple, list)):
        return type(value)(_round(v, dtype) for v in value)
    return value


class Fp32Accumulate:
    """A host kernel for a matmul-like op: low-precision operands go through the op's
    fp32 kernel and the result is rounded once; anything else calls the op as is."""

    def __init__(self, name: str, call: Callable) -> None:
        self.name = name
        self.call = call
        self.__name__ = f"fp32_accumulate_{name.split('::')[-1]}"

    def __call__(self, *args, **kwargs):
        dtype = _low_dtype(args, kwargs)
        if dtype is None:
            return self.call(*args, **kwargs)
        with _one_thread():
            wide = tuple(_widen(a) for a in args)
            wide_kwargs = {k: _widen(v) for k, v in kwargs.items()}
        result = self.call(*wide, **wide_kwargs)
        with _one_thread():
            return _round(result, dtype)


class _one_thread:
    """Dtype conversions run on the calling thread: they are short and memory-bound, and
    waking the intra-op pool for them costs more than they do (on a busy 2-core host,
    ~30 ms against ~0.3 ms for 1M elements). Only the conversions; the matmul keeps the
    pool."""

    def __enter__(self) -> None:
        self.threads = torch.get_num_threads()
        if self.threads > 1:
            torch.set_num_threads(1)

    def __exit__(self, *exc) -> None:
        if self.threads > 1:
            torch.set_num_threads(self.threads)


class FusedLayerMatmuls:
    """A host kernel for a whole layer run as one op (`op_families.FUSED_LAYERS`: the
    inference fast path of nn.TransformerEncoderLayer and nn.MultiheadAttention). Its CPU
    kernel calls its matmuls through the dispatcher, so with low-precision operands it
    runs under `_InnerMatmuls`, which computes them as `Fp32Accumulate` does (in CPU bf16
    arithmetic, a bf16 encoder's recording took 18 s of CPU; 4 s this way)."""

    def __init__(self, name: str, call: Callable) -> None:
        self.name = name
        self.call = call
        self.__name__ = f"fp32_accumulate_{name.split('::')[-1]}"

    def __call__(self, *args, **kwargs):
        if _low_dtype(args, kwargs) is None:
            return self.call(*args, **kwargs)
        with _InnerMatmuls():
            return self.call(*args, **kwargs)


# The matmul inside the fused layers' feed-forward: addmm with its activation applied
# before the one rounding (as the chip applies it to the fp32 sum it reads from PSUM).
_MATMUL_WITH_ACTIVATION = "_addmm_activation"
_HOST_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


class _InnerMatmuls(TorchDispatchMode):
    """Routes the ops a fused layer's CPU kernel dispatches: its matmuls through
    `Fp32Accumulate`, a fused layer inside it (the attention of an encoder layer) into
    its CPU kernel with this mode still on, anything else as it is."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # PyTorch wraps a mode's __torch_dispatch__ to keep Dynamo out of it, which imports
        # Dynamo on the first call (1.3 s of an eager run's CPU); nothing here is compiled
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name
        base = op_families.base_name(name)
        if base in op_families.FUSED_LAYERS:
            with self:
                return func.redispatch(_HOST_KEYS, *args, **kwargs)
        matmul = op_families.family(name) in _FAMILIES or base == _MATMUL_WITH_ACTIVATION
        if not matmul:
            return func(*args, **kwargs)
        if not func._schema.is_mutable:
            return Fp32Accumulate(name, func)(*args, **kwargs)
        out = kwargs.get("out")
        functional = getattr(func.overloadpacket, "default", None)
        if out is None or functional is None:  # in place (addmm_): as it is
            return func(*args, **kwargs)
        # an out= matmul (the attention's bmm): the functional one, then copied into `out`
        result = Fp32Accumulate(name, functional)(
            *args, **{k: v for k, v in kwargs.items() if k != "out"})
        if out.shape != result.shape:  # out= resizes its tensor, as PyTorch's kernels do
            out.resize_(result.shape)
        return out.copy_(result)


def host_kernel(name: str, call: Callable) -> Callable:
    """`call` (the host kernel of the aten op `name`, e.g. "aten::mm"), computing
    low-precision products the Tensor Engine's way when it is a matmul-like op or a
    fused layer of them."""
    # aten's functional ops only: an in-place one (addmm_) would write a widened copy
    functional = name.startswith("aten::") and not name.endswith("_")
    if functional and op_families.family(name) in _FAMILIES:
        return Fp32Accumulate(name, call)
    if functional and op_families.base_name(name) in op_families.FUSED_LAYERS:
        return FusedLayerMatmuls(name, call)
    return call


def rewrite_graph(graph: torch.fx.Graph) -> None:
    """Route a host graph's matmul-like nodes through `host_kernel` (compiled graphs)."""
    for node in graph.nodes:
        target = node.target
        if node.op == "call_function" and isinstance(target, torch._ops.OpOverload):
            node.target = host_kernel(target._schema.name, target)


@contextlib.contextmanager
def attention_in_input_dtype() -> Iterator[None]:
    """SDPA's math path with bf16/fp16 inputs kept in their dtype: PyTorch's upcasts them
    to fp32 (reduced-precision reductions are off by default), so its batched matmuls
    would run at the Tensor Engine's FP32 rate, where the chip multiplies them in bf16 and
    accumulates in fp32 (PSUM): a bf16 model's compiled attention ran its bmms as fp32."""
    allowed = torch._C._get_math_sdp_allow_fp16_bf16_reduction()
    torch._C._set_math_sdp_allow_fp16_bf16_reduction(True)
    try:
        yield
    finally:
        torch._C._set_math_sdp_allow_fp16_bf16_reduction(allowed)
