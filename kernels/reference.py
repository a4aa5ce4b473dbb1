"""Pure-PyTorch masked-LM loss: the CPU fallback (`impl="torch"`) and the kernel's test oracle.

Plain autograd throughout (no custom backward), so `torch.autograd.gradcheck` applies directly and
every gradient is PyTorch's own. The loss is computed in fp32 (or fp64 for fp64 inputs) whatever
the logits dtype; padding columns (>= vocab_size) are sliced off before the softmax, so they get
exactly zero gradient and can never win the argmax.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _loss_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp64 stays fp64 (for gradcheck); everything else is computed in fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def cross_entropy_rows(
    logits: torch.Tensor, labels: torch.Tensor, ignore_index: int, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row loss (0 where ignored) and per-row correctness of the argmax.

    logits: [N, C] with C >= vocab_size; labels: [N] integer, in [0, vocab_size) or ignore_index.
    Returns (loss [N] in fp32/fp64, correct [N] bool; False on ignored rows).
    """
    x = logits if vocab_size == logits.shape[1] else logits[:, :vocab_size]
    x = x.to(_loss_dtype(logits.dtype))
    valid = labels != ignore_index
    # reduction="none" gives 0 on ignored rows; out-of-range labels raise.
    loss = F.cross_entropy(x, labels.long(), ignore_index=ignore_index, reduction="none")
    with torch.no_grad():
        correct = (x.argmax(dim=-1) == labels) & valid if x.shape[0] else valid
    return loss, correct


def masked_lm_loss_sum(
    hidden_rows: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    ignore_index: int,
    vocab_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoder on the already gathered masked rows, then the summed loss and the correct count.

    hidden_rows: [N_m, H]; weight: [V_padded, H]; bias: [V_padded] or None; labels: [N_m].
    Only the first `vocab_size` decoder rows take part, so the padding rows get zero gradient.
    """
    logits = F.linear(hidden_rows, weight, bias)
    width = logits.shape[1]
    if vocab_size < width:
        # -inf in place on the padding columns: no copy (addmm does not save its output),
        # softmax weight exactly 0 there, so their gradient (and weight/bias rows') is exactly 0.
        # Slicing the weight instead would cost a zero-filled [V_padded, H] buffer in the backward.
        logits.index_fill_(1, torch.arange(vocab_size, width, device=logits.device), float("-inf"))
    loss, correct = cross_entropy_rows(logits, labels, ignore_index, width)
    return loss.sum(), correct.sum()


def softmax_cross_entropy_rows(
    logits: torch.Tensor, labels: torch.Tensor, ignore_index: int, vocab_size: int
) -> torch.Tensor:
    """Per-row loss of 2-D logits (0 on ignored rows), fp32 (fp64 for fp64 input)."""
    return cross_entropy_rows(logits, labels, ignore_index, vocab_size)[0]
