"""autograd.Function around the Triton softmax-cross-entropy (kernels.triton_ce).

Design: the forward saves the fp32 lse per row and the backward recomputes the softmax from the
logits (flash-attention's scheme), rather than writing the gradient into the logits during the
forward (Liger's scheme). Why, in short (details in docs/benchmarks.md): both move
the same bytes for a training step (3 passes over [rows x V]) and hold the same single [rows x V]
buffer, but recompute also (a) multiplies by the incoming gradient inside the same pass, so a
per-row or scaled grad_output (fp16 loss scaling, a global normaliser, reduction="none") costs no
extra pass and is applied in fp32 before rounding to fp16/bf16, (b) does no gradient work in
evaluation, under no_grad or when activation checkpointing recomputes a forward.

`inplace_backward=True` writes the gradient into the logits buffer during backward: only for
callers that own that buffer (masked_lm_loss creates its logits itself and nothing else saves
them). The buffer is then consumed, so a second backward through the same graph raises.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from . import triton_ce


class SoftmaxCrossEntropyFunction(torch.autograd.Function):
    """(logits [N, C], labels [N]) -> (per-row loss [N] fp32, per-row correct [N] int32)."""

    @staticmethod
    def forward(
        ctx,
        logits: torch.Tensor,
        labels: torch.Tensor,
        ignore_index: int,
        vocab_size: int,
        inplace_backward: bool,
    ):
        loss, lse, correct = triton_ce.ce_forward(logits, labels, ignore_index, vocab_size)
        ctx.save_for_backward(logits, labels, lse)
        ctx.ignore_index = ignore_index
        ctx.vocab_size = vocab_size
        ctx.inplace_backward = inplace_backward
        ctx.consumed = False
        ctx.mark_non_differentiable(correct)
        return loss, correct

    @staticmethod
    @once_differentiable
    def backward(ctx, dloss: torch.Tensor, _dcorrect: torch.Tensor | None):
        if ctx.consumed:
            raise RuntimeError(
                "masked_lm_loss (impl='triton') wrote its gradient into its own logits buffer "
                "during the first backward, so it cannot run backward twice "
                "(retain_graph=True). Use impl='torch' if you need a second backward."
            )
        logits, labels, lse = ctx.saved_tensors
        if ctx.inplace_backward:
            ctx.consumed = True
            grad = logits
        else:
            grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        triton_ce.ce_backward(
            logits, labels, lse, dloss.float(), grad, ctx.ignore_index, ctx.vocab_size
        )
        return grad, None, None, None, None
