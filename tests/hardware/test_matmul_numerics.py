"""Device matmuls with bf16/fp16 operands: fp32 products and accumulation, one rounding."""

from __future__ import annotations

import pytest
import torch
from neuron_explorer.backend import matmul_numerics


@pytest.fixture(scope="module")
def neuron():
    import neuron_explorer.backend  # noqa: F401  (registers the device)

    return torch.device("neuron")


def _operands(dtype, *shapes):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(*s, generator=gen).to(dtype) for s in shapes]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_device_mm_rounds_the_fp32_product_once(neuron, dtype):
    a, b = _operands(dtype, (96, 256), (256, 80))
    dev = (a.to(neuron) @ b.to(neuron)).cpu()
    assert dev.dtype == dtype
    exact = a.double() @ b.double()
    # one rounding of an fp32 accumulation: equal to the fp32 result rounded
    assert torch.equal(dev, (a.float() @ b.float()).to(dtype))
    # close to the exact product (fp32 accumulation error is far below one ulp)
    torch.testing.assert_close(dev.double(), exact, rtol=2 ** -7, atol=1e-2)
    # and to CPU's own low-precision matmul within its tolerance
    cpu = a @ b
    torch.testing.assert_close(dev.float(), cpu.float(), rtol=1.6e-2, atol=0.1)


@pytest.mark.parametrize("op", ["bmm", "addmm", "linear", "conv2d", "sdpa", "matmul"])
def test_every_device_matmul_path_matches_cpu_bf16(neuron, op):
    bf = torch.bfloat16
    if op == "bmm":
        a, b = _operands(bf, (4, 32, 64), (4, 64, 16))
        fn = torch.bmm
        args = (a, b)
    elif op == "addmm":
        c, a, b = _operands(bf, (32, 16), (32, 64), (64, 16))
        fn = torch.addmm
        args = (c, a, b)
    elif op == "linear":
        x, w, bias = _operands(bf, (8, 64), (16, 64), (16,))
        fn = torch.nn.functional.linear
        args = (x, w, bias)
    elif op == "conv2d":
        x, w = _operands(bf, (2, 8, 12, 12), (4, 8, 3, 3))
        fn = torch.nn.functional.conv2d
        args = (x, w)
    elif op == "sdpa":
        q, k, v = _operands(bf, (2, 2, 16, 32), (2, 2, 16, 32), (2, 2, 16, 32))
        fn = torch.nn.functional.scaled_dot_product_attention
        args = (q, k, v)
    else:
        a, b = _operands(bf, (3, 16, 64), (64, 8))
        fn = torch.matmul
        args = (a, b)
    dev = fn(*(t.to(neuron) for t in args)).cpu()
    assert dev.dtype == bf
    ref32 = fn(*(t.float() for t in args))
    torch.testing.assert_close(dev.float(), ref32, rtol=2 ** -6, atol=2e-2)
    torch.testing.assert_close(dev.float(), fn(*args).float(), rtol=1.6e-2, atol=5e-2)


def test_fp32_and_mixed_operands_are_left_to_pytorch():
    calls = []

    def fake(*args, **kwargs):
        calls.append([a.dtype for a in args])
        return args[0]

    kernel = matmul_numerics.host_kernel("aten::mm", fake)
    kernel(torch.ones(2, 2), torch.ones(2, 2))
    kernel(torch.ones(2, 2, dtype=torch.bfloat16), torch.ones(2, 2))
    kernel(torch.ones(2, 2, dtype=torch.bfloat16), torch.ones(2, 2, dtype=torch.bfloat16))
    assert calls == [[torch.float32] * 2, [torch.bfloat16, torch.float32], [torch.float32] * 2]
    assert matmul_numerics.host_kernel("aten::add", fake) is fake


def test_compiled_graph_matmuls_use_the_same_numerics(neuron):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.GELU(),
                                torch.nn.Linear(32, 8)).to(torch.bfloat16)
    x = torch.randn(16, 64).to(torch.bfloat16)
    eager = model.to(neuron)(x.to(neuron)).cpu()
    compiled = torch.compile(model, backend="neuron")(x.to(neuron)).cpu()
    assert torch.equal(eager, compiled)


def test_autocast_attention_keeps_its_batched_matmuls_in_bf16(neuron):
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.bmm.default:
                seen.append(args[0].dtype)
            return func(*args, **(kwargs or {}))

    q = torch.randn(2, 2, 16, 32, device=neuron)
    with torch.autocast("neuron", dtype=torch.bfloat16), Record():
        out = torch.nn.functional.scaled_dot_product_attention(q, q, q)
    assert seen == [torch.bfloat16, torch.bfloat16]  # scores and P @ V, not fp32
    assert out.dtype == torch.bfloat16
    # the reduced-precision switch is PyTorch's global: it is restored afterwards
    assert not torch._C._get_math_sdp_allow_fp16_bf16_reduction()


def test_convolution_backward_rounds_each_gradient_once(neuron):
    x, w = _operands(torch.bfloat16, (2, 4, 8, 8), (3, 4, 3, 3))
    xd = x.to(neuron).requires_grad_()
    wd = w.to(neuron).requires_grad_()
    torch.nn.functional.conv2d(xd, wd).sum().backward()
    x32 = x.float().requires_grad_()
    w32 = w.float().requires_grad_()
    torch.nn.functional.conv2d(x32, w32).sum().backward()
    assert xd.grad.dtype == torch.bfloat16
    torch.testing.assert_close(xd.grad.cpu().float(), x32.grad, rtol=2 ** -7, atol=1e-2)
    torch.testing.assert_close(wd.grad.cpu().float(), w32.grad, rtol=2 ** -7, atol=5e-2)


@pytest.mark.parametrize("layer", ["encoder", "attention"])
def test_a_fused_layers_matmuls_are_computed_in_fp32_and_rounded_once(neuron, layer,
                                                                     monkeypatch):
    """nn.TransformerEncoderLayer and nn.MultiheadAttention at inference run as one op each
    (`_transformer_encoder_layer_fwd`, `_native_multi_head_attention`); their CPU kernels'
    matmuls ran in CPU bf16 (75x slower than fp32 here: 18 s for a bf16 encoder's
    recording). Each inner matmul now reaches the host's kernels with fp32 operands."""
    torch.manual_seed(0)
    if layer == "encoder":
        module = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
    else:
        module = torch.nn.MultiheadAttention(64, 4, batch_first=True)
    module = module.eval().to(torch.bfloat16)
    x = torch.randn(2, 8, 64).to(torch.bfloat16)

    def run(m, t):
        with torch.no_grad():
            out = m(t) if layer == "encoder" else m(t, t, t, need_weights=False)[0]
        return out

    cpu = run(module, x)
    ref32 = run(module.float(), x.float())
    module = module.to(torch.bfloat16).to(neuron)
    widened = []  # (op, the dtypes of the tensors its kernel was called with)
    accumulate = matmul_numerics.Fp32Accumulate.__call__

    def spy(self, *args, **kwargs):
        def called(*wide, **wide_kwargs):
            tensors = [a for a in (*wide, *wide_kwargs.values()) if isinstance(a, torch.Tensor)]
            widened.append((self.name, {t.dtype for t in tensors}))
            return call(*wide, **wide_kwargs)

        call, self.call = self.call, called
        try:
            return accumulate(self, *args, **kwargs)
        finally:
            self.call = call

    monkeypatch.setattr(matmul_numerics.Fp32Accumulate, "__call__", spy)
    dev = run(module, x.to(neuron)).cpu()
    assert dev.dtype == torch.bfloat16
    inner = {"aten::bmm", "aten::addmm" if layer == "attention" else "aten::_addmm_activation"}
    assert inner <= {name for name, _ in widened}, widened
    assert all(dtypes == {torch.float32} for _, dtypes in widened), widened
    # within bf16's rounding of the fp32 result, as close as CPU bf16's own
    torch.testing.assert_close(dev.float(), ref32, rtol=2 ** -6, atol=3e-2)
    torch.testing.assert_close(dev.float(), cpu.float(), rtol=1.6e-2, atol=5e-2)


def test_a_fused_layer_in_fp32_runs_its_cpu_kernel_as_it_is():
    calls = []

    def fake(*args, **kwargs):
        calls.append(args[0].dtype)
        return args[0]

    kernel = matmul_numerics.host_kernel("aten::_native_multi_head_attention", fake)
    assert isinstance(kernel, matmul_numerics.FusedLayerMatmuls)
    kernel(torch.ones(2, 2))
    assert calls == [torch.float32]


@pytest.mark.parametrize("out_shape", [(0,), (2, 3, 5)])
def test_an_out_matmul_inside_a_fused_layer_writes_its_out_tensor(out_shape):
    """The attention inside a fused layer calls `bmm(..., out=)`. Its product goes through
    the functional bmm in fp32 and is copied into `out` (resized as out= does): widening
    `out` itself would leave it unwritten (a first version of the mode did that)."""
    a, b = _operands(torch.bfloat16, (2, 3, 4), (2, 4, 5))
    out = torch.full(out_shape, 7.0, dtype=torch.bfloat16)
    with matmul_numerics._InnerMatmuls():
        result = torch.bmm(a, b, out=out)
    assert result is out
    assert torch.equal(out, (a.float() @ b.float()).to(torch.bfloat16))
