"""kernels.softmax_cross_entropy: both impls against a float64 oracle and against each other.

Every test runs on conftest's `device` (CUDA and the compiled kernel on a GPU node, CPU tensors
under the Triton interpreter elsewhere); the oracle runs in float64 on the CPU.
"""

from __future__ import annotations

import pytest
import torch

from bertforge.kernels import api as kernels
from bertforge.kernels.constants import IGNORE_INDEX

IMPLS = ("torch", "triton")
TOL = {torch.float32: 1e-5, torch.float16: 1e-5, torch.bfloat16: 1e-5}  # loss math is fp32 for all

GRAD_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}  # grad rounded to dtype


def oracle_rows(
    logits: torch.Tensor, labels: torch.Tensor, V: int, ignore_index: int = IGNORE_INDEX
):
    """float64 per-row loss (0 where ignored) and its leaf, from the rounded inputs."""
    x = logits.detach().cpu().double().requires_grad_()
    labels = labels.cpu()
    y = labels.reshape(-1)
    valid = y != ignore_index
    z = x.reshape(-1, x.shape[-1])[:, :V]
    per = torch.logsumexp(z, -1) - z.gather(1, torch.where(valid, y, 0)[:, None])[:, 0]
    return (per * valid).reshape(labels.shape), x


def reduce(
    per: torch.Tensor, labels: torch.Tensor, reduction: str, ignore_index: int = IGNORE_INDEX
):
    if reduction == "none":
        return per
    if reduction == "sum":
        return per.sum()
    return per.sum() / max(int((labels != ignore_index).sum()), 1)


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    a, ref = a.detach().cpu().double(), ref.detach().cpu()
    return float((a - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def check(logits, labels, V, reduction="mean", grad_scale=1.0, vocab_size=None, grad_tol=None):
    """Both impls: loss and d(loss * grad_scale)/d(logits) against the oracle; returns the grads."""
    per, x64 = oracle_rows(logits, labels, V)
    ref = reduce(per, labels.cpu(), reduction)
    (ref_grad,) = torch.autograd.grad((ref * grad_scale).sum(), x64)
    grads = {}
    for impl in IMPLS:
        x = logits.detach().clone().requires_grad_()
        before = x.detach().clone()
        loss = kernels.softmax_cross_entropy(
            x, labels, reduction=reduction, vocab_size=vocab_size, impl=impl
        )
        assert loss.dtype == torch.float32 and loss.shape == ref.shape
        assert torch.isfinite(loss).all()
        # fp32 rounding of lse ~ |x| per row bounds the absolute error of lse - x_label.
        n = int((labels != IGNORE_INDEX).sum()) if reduction == "sum" else 1
        atol = 1e-6 * (1 + float(logits.double().abs().max())) * max(n, 1)
        assert float((loss.detach().cpu().double() - ref.detach()).abs().max()) <= (
            TOL[logits.dtype] * float(ref.detach().abs().max()) + atol
        ), impl
        (loss * grad_scale).sum().backward()
        assert torch.equal(x.detach(), before), "the caller's logits must not be modified"
        assert x.grad.dtype == logits.dtype and torch.isfinite(x.grad).all()
        assert rel_err(x.grad, ref_grad) < (grad_tol or GRAD_TOL[logits.dtype]), impl
        grads[impl] = x.grad
    assert rel_err(grads["triton"], grads["torch"].double()) < (grad_tol or GRAD_TOL[logits.dtype])
    return grads, ref_grad


def make(
    rows: int,
    V: int,
    dtype,
    scale: float = 3.0,
    seed: int = 0,
    ignore_every: int = 4,
    device: torch.device | str = "cpu",
):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(rows, V, generator=g) * scale).to(dtype)
    labels = torch.randint(0, V, (rows,), generator=g)
    labels[0] = 0
    labels[-1] = V - 1
    labels[1::ignore_every] = IGNORE_INDEX
    return logits.to(device), labels.to(device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("V", [8, 4097, 21128, 30522])
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_matches_float64(dtype, V, rows, device):
    if rows * V > 64 * 21128 and dtype != torch.float32:
        rows = 32  # keep the interpreter's time in budget; fp32 covers the full size
    check(*make(rows, V, dtype, device=device), V)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reductions_and_grad_output(reduction, dtype, device):
    logits, labels = make(9, 300, dtype, device=device)
    check(logits, labels, 300, reduction=reduction, grad_scale=-2.5)


@pytest.mark.parametrize("impl", IMPLS)
def test_all_rows_ignored(impl, device):
    logits = torch.randn(5, 33, device=device, requires_grad=True)
    labels = torch.full((5,), IGNORE_INDEX, device=device)
    for reduction in ("mean", "sum"):
        loss = kernels.softmax_cross_entropy(logits, labels, reduction=reduction, impl=impl)
        (g,) = torch.autograd.grad(loss, logits)
        assert float(loss.detach()) == 0.0 and torch.equal(g, torch.zeros_like(g))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_peaked_rows_keep_true_class_gradient(dtype, device):
    """p_y ~ 0.999: the true-class gradient p_y - 1 ~ -1e-3 must not cancel to 0 or to -2e-3."""
    V = 4097
    logits = torch.zeros(6, V)
    labels = torch.tensor([5, 0, V - 1, 17, 4000, 99])
    margin = torch.log(torch.tensor(0.999 * (V - 1) / 0.001))
    logits[torch.arange(6), labels] = margin
    logits, labels = logits.to(device, dtype), labels.to(device)
    # torch's fp32 log_softmax route loses 1e-3 to 3e-3 relative on p_y - 1 (its vectorised exp
    # differs between CPUs: 3.0e-3 on the project machine, 2026-12-03); the kernel does not.
    grads, ref_grad = check(logits, labels, V, reduction="sum", grad_tol=max(5e-3, GRAD_TOL[dtype]))
    rows, cpu_labels = torch.arange(6), labels.cpu()
    for impl, g in grads.items():
        got, want = g.cpu()[rows, cpu_labels].double(), ref_grad[rows, cpu_labels]
        tol = 5e-4 if (impl, dtype) == ("triton", torch.float32) else 1e-2
        assert ((got - want).abs() / want.abs()).max() < tol, impl
        assert float(want.max()) < -5e-4
    # The kernel's loss, (max - x_label) + log(sum), keeps a small per-row loss accurate in fp32.
    per = kernels.softmax_cross_entropy(logits, labels, reduction="none", impl="triton")
    assert (
        rel_err(
            per.cpu() / oracle_rows(logits, labels, V)[0].detach(),
            torch.ones(6, dtype=torch.float64),
        )
        < 5e-4
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_large_logits(dtype, device):
    logits, labels = make(8, 4097, dtype, scale=1e4, device=device)
    check(logits, labels, 4097)


def test_noncontiguous_rows_and_padded_vocab(device):
    V, width = 1000, 1008
    buf = torch.randn(20, width + 24, device=device) * 2
    buf[:, V:width] = 80.0  # padding columns that must take no part
    logits = buf[::2, :width]  # row stride 2 * 1032, not contiguous
    labels = torch.randint(0, V, (10,), device=device)
    labels[3] = IGNORE_INDEX
    assert not logits.is_contiguous()
    grads, _ = check(logits, labels, V, vocab_size=V)
    for g in grads.values():
        assert torch.equal(g[:, V:], torch.zeros_like(g[:, V:]))


@pytest.mark.parametrize("impl", IMPLS)
def test_leading_dims(impl, device):
    logits = torch.randn(2, 3, 50, device=device)
    labels = torch.randint(0, 50, (2, 3), device=device)
    per = kernels.softmax_cross_entropy(logits, labels, reduction="none", impl=impl)
    assert per.shape == (2, 3)
    assert torch.allclose(per.cpu(), oracle_rows(logits, labels, 50)[0].float(), rtol=1e-5)


def test_out_of_range_label_is_not_silent(device):
    logits = torch.randn(3, 10)
    labels = torch.tensor([1, 10, IGNORE_INDEX])
    with pytest.raises((IndexError, RuntimeError)):  # on CPU: on CUDA it is a device-side assert
        kernels.softmax_cross_entropy(logits, labels, impl="torch")
    logits, labels = logits.to(device), labels.to(device)
    per = kernels.softmax_cross_entropy(logits, labels, reduction="none", impl="triton")
    assert torch.isfinite(per[0]) and torch.isnan(per[1]) and per[2] == 0


def test_bad_arguments_are_explained(device):
    logits, labels = torch.randn(3, 10, device=device), torch.tensor([1, 2, 3], device=device)
    with pytest.raises(ValueError, match="'mean', 'sum', 'none'"):
        kernels.softmax_cross_entropy(logits, labels, reduction="avg")
    with pytest.raises(ValueError, match="'auto', 'triton', 'torch'"):
        kernels.softmax_cross_entropy(logits, labels, impl="liger")
    with pytest.raises(ValueError, match="integer"):
        kernels.softmax_cross_entropy(logits, labels.float())


def test_reference_gradcheck_float64(device):
    logits = torch.randn(6, 11, dtype=torch.float64, device=device, requires_grad=True)
    labels = torch.tensor([0, 9, IGNORE_INDEX, 3, 7, 9], device=device)
    for reduction in ("mean", "none"):
        assert torch.autograd.gradcheck(
            lambda x, r=reduction: kernels.softmax_cross_entropy(
                x, labels, reduction=r, vocab_size=10, impl="torch"
            ),
            (logits,),
        )
