"""Triton softmax cross-entropy: an online-softmax forward saving lse, a recomputing backward.

One program per row. The forward makes ONE pass over the row in vocabulary blocks (online softmax:
running max and rescaled running sum, in fp32), and writes per row: the loss (lse - x_label, fp32),
the log-sum-exp (fp32) and whether the argmax equals the label. The backward makes one more pass,
recomputes p = exp(x - lse) in fp32, forms g * (p - [col == label]) in fp32 (so the true-class term
p_y - 1 does not cancel in bf16) and stores it in the gradient buffer's dtype. The gradient buffer
may be the logits buffer itself (in place, when the caller owns it).

Columns >= vocab_size (vocabulary padded to a multiple of 8) are skipped by the forward and get a
zero gradient. Row offsets are computed in int64 (row * stride overflows int32 past 2^31 elements).
Labels outside [0, vocab_size) that are not ignore_index give a NaN loss rather than a wrong number
(the kernel cannot raise, and a host-side check would cost a device sync).

This module imports triton at the top: import it lazily (kernels.api does).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


def interpreting() -> bool:
    """True when Triton runs kernels on the CPU (TRITON_INTERPRET=1, set before triton's import)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _config(n_cols: int) -> tuple[int, int]:
    """Fixed (BLOCK, num_warps); no autotuning: reproducible results, and the interpreter works.

    On a GPU a 4096-column block (16 KB of fp32 per pass over 8 warps) keeps enough bytes in flight
    per SM for a memory-bound row loop; in the interpreter every block is one numpy call, so bigger
    blocks mean fewer Python-level iterations.
    """
    cap = 16384 if interpreting() else 4096
    block = min(cap, triton.next_power_of_2(max(n_cols, 16)))
    return block, (8 if block >= 2048 else 4)


@triton.jit
def _ce_forward_kernel(
    logits_ptr, logits_row_stride, labels_ptr, labels_stride, loss_ptr, lse_ptr, correct_ptr,
    vocab_size, ignore_index, BLOCK: tl.constexpr,
):  # fmt: skip
    """One program per row. logits [n_rows, n_cols >= vocab_size] with unit column stride;
    labels [n_rows] (any integer dtype); outputs loss, lse (fp32) and correct (int32), [n_rows]."""
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * logits_row_stride
    label = tl.load(labels_ptr + row * labels_stride).to(tl.int64)
    cols = tl.arange(0, BLOCK)

    m = tl.full([], float("-inf"), tl.float32)  # running max
    d = tl.full([], 0.0, tl.float32)  # running sum of exp(x - m)
    best = tl.full([], float("-inf"), tl.float32)  # argmax value and index (first one on ties)
    best_idx = tl.full([], 0, tl.int64)
    for start in range(0, vocab_size, BLOCK):
        idx = start + cols
        # Upcast at once: fp32 math for every input dtype (the interpreter has no bf16 math).
        x = tl.load(row_ptr + idx, mask=idx < vocab_size, other=float("-inf")).to(tl.float32)
        block_max = tl.max(x, axis=0)
        block_arg = tl.argmax(x, axis=0).to(tl.int64) + start
        better = block_max > best
        best_idx = tl.where(better, block_arg, best_idx)
        best = tl.where(better, block_max, best)
        m_new = tl.maximum(m, block_max)
        d = d * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    lse = m + tl.log(d)

    ignored = label == ignore_index
    in_range = (label >= 0) & (label < vocab_size)
    safe_label = tl.where(in_range, label, 0)
    x_label = tl.load(row_ptr + safe_label).to(tl.float32)
    # (m - x_label) + log(d) rather than lse - x_label: exact 0 + log(d) when the label is the max,
    # so a peaked row's small loss does not drown in the rounding of lse ~ x_label.
    loss = tl.where(in_range, (m - x_label) + tl.log(d), float("nan"))
    loss = tl.where(ignored, 0.0, loss)
    correct = (best_idx == label) & in_range & (label != ignore_index)
    tl.store(loss_ptr + row, loss)
    tl.store(lse_ptr + row, lse)
    tl.store(correct_ptr + row, correct.to(tl.int32))


@triton.jit
def _ce_backward_kernel(
    logits_ptr, logits_row_stride, grad_ptr, grad_row_stride, labels_ptr, labels_stride, lse_ptr,
    dloss_ptr, dloss_stride, n_cols, vocab_size, ignore_index, BLOCK: tl.constexpr,
):  # fmt: skip
    """One program per row. grad [n_rows, n_cols] (may alias logits) gets dloss[row] times the
    gradient of the row's loss; lse from the forward; dloss may have stride 0 (a summed loss)."""
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * logits_row_stride
    out_ptr = grad_ptr + row * grad_row_stride
    label = tl.load(labels_ptr + row * labels_stride).to(tl.int64)
    lse = tl.load(lse_ptr + row)
    g = tl.load(dloss_ptr + row * dloss_stride).to(tl.float32)
    g = tl.where(label == ignore_index, 0.0, g)  # ignored rows: zero gradient, whatever came in
    cols = tl.arange(0, BLOCK)
    for start in range(0, n_cols, BLOCK):
        idx = start + cols
        x = tl.load(row_ptr + idx, mask=idx < vocab_size, other=float("-inf")).to(tl.float32)
        p = tl.exp(x - lse)  # 0 on padding columns (x = -inf there)
        # fp32 (p - 1) for the true class: no bf16 cancellation when p_y ~ 0.999.
        dx = g * tl.where(idx == label, p - 1.0, p)
        tl.store(out_ptr + idx, dx.to(grad_ptr.dtype.element_ty), mask=idx < n_cols)


def _check_2d(logits: torch.Tensor, labels: torch.Tensor) -> None:
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(
            f"triton CE needs 2-D logits with unit column stride, got shape "
            f"{tuple(logits.shape)} strides {logits.stride()}"
        )
    if labels.dim() != 1 or labels.shape[0] != logits.shape[0]:
        raise ValueError(
            f"labels must be 1-D with {logits.shape[0]} entries, got {tuple(labels.shape)}"
        )


def ce_forward(
    logits: torch.Tensor, labels: torch.Tensor, ignore_index: int, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row (loss fp32, lse fp32, correct int32) for 2-D logits [N, C >= vocab_size]."""
    _check_2d(logits, labels)
    n_rows = logits.shape[0]
    loss = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    lse = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    correct = torch.empty(n_rows, dtype=torch.int32, device=logits.device)
    if n_rows:
        block, warps = _config(vocab_size)
        _ce_forward_kernel[(n_rows,)](
            logits,
            logits.stride(0),
            labels,
            labels.stride(0),
            loss,
            lse,
            correct,
            vocab_size,
            ignore_index,
            BLOCK=block,
            num_warps=warps,
        )
    return loss, lse, correct


def ce_backward(
    logits: torch.Tensor,
    labels: torch.Tensor,
    lse: torch.Tensor,
    dloss: torch.Tensor,
    grad: torch.Tensor,
    ignore_index: int,
    vocab_size: int,
) -> torch.Tensor:
    """Write dloss[row] * d(loss_row)/d(logits) into `grad` (may be `logits` itself); return it."""
    _check_2d(logits, labels)
    if grad.shape != logits.shape or grad.stride(1) != 1:
        raise ValueError("gradient buffer must match the logits' shape with unit column stride")
    n_rows, n_cols = logits.shape
    if n_rows:
        block, warps = _config(n_cols)
        _ce_backward_kernel[(n_rows,)](
            logits,
            logits.stride(0),
            grad,
            grad.stride(0),
            labels,
            labels.stride(0),
            lse,
            dloss,
            dloss.stride(0),
            n_cols,
            vocab_size,
            ignore_index,
            BLOCK=block,
            num_warps=warps,
        )
    return grad
