"""Ops that killed the process or gave other results than the CPU, found by the OpInfo run.

Lazily conjugated (and negated) views reach the backend with their bits set: clone and
copy used to recurse without end through `_copy_from` (a segmentation fault), and the
linear-algebra ops PyTorch passes such views to read the raw memory.
"""

from __future__ import annotations

import pytest
import torch


def _pair(*shape, dtype=torch.complex64):
    torch.manual_seed(0)
    host = torch.randn(*shape, dtype=dtype)
    return host, host.to("neuron")


def test_hfft_no_longer_kills_the_process(fresh_python):
    proc = fresh_python("""
        import warnings
        import torch
        warnings.simplefilter("ignore")
        x = torch.randn(5, 6, 7)
        for fn in (lambda t: torch.fft.hfft(t, n=10, dim=1, norm="ortho"), torch.fft.ifft,
                   torch.fft.ihfft, torch.fft.hfft2, torch.fft.hfftn):
            assert torch.allclose(fn(x.to("neuron")).cpu(), fn(x), atol=1e-5)
        print("ok")
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "ok"


def test_conjugated_views_copy_and_clone_their_values():
    host, dev = _pair(3, 4)
    assert torch.equal(dev.conj().clone().cpu(), host.conj().clone())
    assert torch.equal(dev.conj().cpu(), host.conj().resolve_conj())
    assert torch.equal(dev.conj().to(torch.complex128).cpu(), host.conj().to(torch.complex128))
    into = torch.zeros(3, 4, dtype=torch.complex64, device="neuron")
    into.conj().copy_(dev)  # writing through a conjugated view stores the conjugate
    assert torch.equal(into.cpu(), host.conj())
    into.conj().copy_(host)
    assert torch.equal(into.cpu(), host.conj())


def test_linear_algebra_reads_conjugated_and_negated_views():
    host, dev = _pair(3, 4)
    assert torch.allclose((dev.conj() @ dev.t()).cpu(), host.conj() @ host.t())
    assert torch.allclose(torch.vdot(dev[0], dev[1].conj()).cpu(),
                          torch.vdot(host[0], host[1].conj()))
    negated = torch.imag(dev.conj())  # a lazily negated view
    assert negated.is_neg()
    assert torch.allclose((negated @ negated.t()).cpu(),
                          torch.imag(host.conj()) @ torch.imag(host.conj()).t())
    out = torch.zeros(3, 3, dtype=torch.complex64, device="neuron")
    expected = torch.zeros(3, 3, dtype=torch.complex64)
    out.conj().addmm_(dev, dev.t())
    expected.conj().addmm_(host, host.t())
    assert torch.allclose(out.cpu(), expected)


def test_take_along_dim_matches_the_cpu():
    torch.manual_seed(0)
    x = torch.randn(5, 5)
    for dim, index in ((0, torch.randint(-5, 5, (3, 5))), (1, torch.randint(-5, 5, (5, 3)))):
        got = torch.take_along_dim(x.to("neuron"), index.to("neuron"), dim).cpu()
        assert torch.equal(got, torch.take_along_dim(x, index, dim))


def test_numbers_given_to_tensor_arguments_keep_their_type_promotion():
    ints = torch.arange(6)
    got = torch.ops.aten.remainder.Scalar_out(ints.to("neuron"), 4,
                                              out=torch.empty(6, dtype=torch.int64,
                                                              device="neuron"))
    assert got.dtype == torch.int64 and got.tolist() == (ints % 4).tolist()
    assert torch.equal(torch.remainder(ints.to("neuron"), 2.5).cpu(), torch.remainder(ints, 2.5))


def test_tensor_split_takes_host_indices_and_refuses_device_ones_as_cuda_does():
    x = torch.arange(10.0)
    parts = torch.tensor_split(x.to("neuron"), torch.tensor([2, 5]))
    assert [p.cpu().tolist() for p in parts] == [p.tolist() for p in
                                                 torch.tensor_split(x, torch.tensor([2, 5]))]
    # PyTorch's contract (CUDA says the same): the indices tensor lives on the CPU.
    with pytest.raises(RuntimeError, match="to be on cpu"):
        torch.tensor_split(x.to("neuron"), torch.tensor([2, 5], device="neuron"))


def test_as_strided_reads_a_partial_view_through_its_whole_storage():
    for device in ("cpu", "neuron"):
        view = torch.arange(20.0, device=device)[5:15]
        got = [torch.as_strided(view, (2, 2), (1, 2), **kw).cpu().tolist()
               for kw in ({}, {"storage_offset": 0}, {"storage_offset": 10})]
        assert got == [[[5.0, 7.0], [6.0, 8.0]], [[0.0, 2.0], [1.0, 3.0]],
                       [[10.0, 12.0], [11.0, 13.0]]], device


def test_a_conjugated_host_result_keeps_its_values_on_the_device():
    # The CPU's vdot(x, y.conj()) answers with a lazily conjugated tensor.
    x, dev_x = _pair(5)
    y, dev_y = _pair(5)
    result = torch.vdot(dev_x, dev_y.conj())
    expected = torch.vdot(x, y.conj())
    assert not result.is_conj()
    assert torch.allclose(result.cpu(), expected)
    assert torch.allclose(result.view(1).cpu(), expected.view(1))  # a fresh host view


def test_an_out_tensor_the_cpu_marks_conjugated_keeps_its_values():
    # The CPU's lu_solve(adjoint=True, left=False, out=...) sets the conjugate bit on out.
    torch.manual_seed(0)
    a = torch.randn(3, 3, dtype=torch.complex64)
    b = torch.randn(4, 3, dtype=torch.complex64)
    lu, pivots = torch.linalg.lu_factor(a)
    expected = torch.linalg.lu_solve(lu, pivots, b, adjoint=True, left=False)
    got = torch.linalg.lu_solve(lu.to("neuron"), pivots.to("neuron"), b.to("neuron"),
                                adjoint=True, left=False)
    assert torch.allclose(got.cpu(), expected, atol=1e-5)
    assert torch.allclose(got.t().contiguous().cpu(), expected.t().contiguous(), atol=1e-5)
