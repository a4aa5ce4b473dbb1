"""Functional API: masked_lm_loss and softmax_cross_entropy, with the `impl` switch.

impl="triton": the Triton kernel (CUDA tensors, or CPU tensors when TRITON_INTERPRET=1 was set
before triton was imported). impl="torch": the pure-PyTorch reference (kernels.reference).
impl="auto": triton for CUDA tensors when triton imports, torch otherwise (on CUDA tensors with a
triton that fails to import, "auto" warns once, naming the import error, and uses torch).
Importing this module never imports triton; that happens on the first triton call.
"""

from __future__ import annotations

import functools
import numbers
import os
import sys
import warnings
from typing import NamedTuple

import torch

from . import reference
from .constants import IGNORE_INDEX

IMPLS = ("auto", "triton", "torch")
REDUCTIONS = ("mean", "sum", "none")


class MaskedLMOutput(NamedTuple):
    """Result of masked_lm_loss; every field is a tensor on the input's device (no host sync)."""

    # fp32 scalar (fp64 for fp64 inputs): sum of per-token losses / (normalizer or max(count, 1))
    loss: torch.Tensor
    num_masked: torch.Tensor  # int64 scalar: rows whose label is not ignore_index
    num_correct: torch.Tensor  # int64 scalar: masked rows whose argmax (true vocab) == label


_TRITON_ERROR: str | None = None


@functools.cache
def _triton_available() -> bool:
    """Whether kernels.triton_ce imports (triton installed and importable); remembers the reason."""
    global _TRITON_ERROR
    try:
        from . import triton_ce  # noqa: F401
    except Exception as exc:  # noqa: BLE001  (ImportError, or a broken triton raising at import)
        _TRITON_ERROR = f"{type(exc).__name__}: {exc}"
        return False
    return True


def enable_interpreter_without_cuda() -> bool:
    """Run Triton kernels on CPU tensors (TRITON_INTERPRET=1) when no CUDA device is usable.

    For tests and dry runs: sets the variable only when torch sees no CUDA device and the user has
    not set it. It must happen before triton is first imported (DeepSpeed imports it too); a later
    call warns. Returns whether the interpreter is on.
    """
    if not torch.cuda.is_available() and "TRITON_INTERPRET" not in os.environ:
        if "triton" in sys.modules:
            warnings.warn(
                "triton was imported before TRITON_INTERPRET could be set: the Triton "
                "kernel cannot run on CPU tensors in this process",
                RuntimeWarning,
                stacklevel=2,
            )
        os.environ["TRITON_INTERPRET"] = "1"
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.cache
def _warn_auto_without_triton() -> None:
    """Once per process: CUDA tensors, impl="auto", and triton does not import."""
    warnings.warn(
        f"kernels: impl='auto' on CUDA tensors uses the PyTorch path because triton cannot be "
        f"imported ({_TRITON_ERROR}); install a working triton for the fused kernel, or pass "
        f"impl='torch' to choose the PyTorch path explicitly",
        RuntimeWarning,
        stacklevel=4,
    )


def _resolve_impl(impl: str, device: torch.device) -> str:
    """Map impl ("auto" | "triton" | "torch") to "triton" or "torch" for tensors on `device`."""
    if impl not in IMPLS:
        raise ValueError(f"unknown impl {impl!r}; valid values: {', '.join(map(repr, IMPLS))}")
    if impl == "torch":
        return "torch"
    if impl == "auto":
        if device.type != "cuda":
            return "torch"
        if _triton_available():
            return "triton"
        _warn_auto_without_triton()
        return "torch"
    if not _triton_available():
        raise RuntimeError(
            f"impl='triton' but triton cannot be imported ({_TRITON_ERROR}); "
            "install triton or use impl='torch'"
        )
    # Lazy: triton_ce imports triton, which may be missing or broken (CPU machines);
    # _triton_available says which.
    from .triton_ce import interpreting

    if device.type != "cuda" and not (device.type == "cpu" and interpreting()):
        raise RuntimeError(
            f"impl='triton' needs CUDA tensors (got {device.type}), or CPU tensors "
            "with TRITON_INTERPRET=1 set before triton is imported; or use impl='torch'"
        )
    return "triton"


def _check_vocab(vocab_size: int | None, width: int, what: str) -> int:
    if vocab_size is None:
        return width
    if not isinstance(vocab_size, numbers.Integral) or not 1 <= vocab_size <= width:
        raise ValueError(
            f"vocab_size must be an int in [1, {width}] ({what} has {width} columns), "
            f"got {vocab_size!r}"
        )
    return int(vocab_size)


def _denominator(normalizer, count: torch.Tensor) -> torch.Tensor | float:
    """Divisor: the given normalizer (python number or 0-d tensor) or max(count, 1) as fp32.

    A python number stays a python number: turning it into a CUDA tensor would be a blocking
    host-to-device copy, i.e. a sync.
    """
    if normalizer is None:
        return count.clamp_min(1).to(torch.float32)
    if isinstance(normalizer, torch.Tensor):
        if normalizer.numel() != 1:
            raise ValueError(
                f"normalizer must be a number or a 0-d tensor, got shape {tuple(normalizer.shape)}"
            )
        if normalizer.device.type == "cpu" and count.device.type != "cpu":
            return float(normalizer)  # read on the host; moving it to the GPU would block
        # A device tensor is not checked for > 0: that would need a host sync.
        return normalizer.reshape(()).to(device=count.device, dtype=torch.float32)
    if not isinstance(normalizer, numbers.Real) or not normalizer > 0:
        raise ValueError(
            f"normalizer must be > 0 (the global count of masked tokens), got {normalizer!r}"
        )
    return float(normalizer)


def masked_lm_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    *,
    ignore_index: int = IGNORE_INDEX,
    vocab_size: int | None = None,
    normalizer: float | torch.Tensor | None = None,
    impl: str = "auto",
) -> MaskedLMOutput:
    """Masked-LM loss computed on the masked rows only.

    hidden: [..., H] (any leading shape, any strides); labels: [...] (same leading shape), integer,
    ignore_index where no prediction is wanted; weight: [V_padded, H] decoder (tied embeddings);
    bias: [V_padded] or None; vocab_size: true vocabulary (<= V_padded; padding columns take no part
    in softmax, loss, gradient or argmax); normalizer: divide the summed loss by this (e.g. the
    masked-token count of the whole global batch) instead of max(local count, 1).

    Selecting the masked rows costs one device->host sync (their count); nothing else syncs.
    A batch without masked tokens gives loss 0 and zero gradients.
    """
    if hidden.dim() < 1 or hidden.shape[:-1] != labels.shape:
        raise ValueError(
            f"hidden must be [..., H] with labels [...] of the same leading shape; got "
            f"hidden {tuple(hidden.shape)} and labels {tuple(labels.shape)}"
        )
    # weight, bias and label dtype are checked by masked_lm_loss_rows.
    flat_labels = labels.reshape(-1)
    rows = (flat_labels != ignore_index).nonzero().squeeze(1)  # the one inherent host sync
    hidden_rows = hidden.reshape(-1, hidden.shape[-1]).index_select(0, rows)
    return masked_lm_loss_rows(
        hidden_rows,
        weight,
        bias,
        flat_labels.index_select(0, rows),
        ignore_index=ignore_index,
        vocab_size=vocab_size,
        normalizer=normalizer,
        impl=impl,
    )


def masked_lm_loss_rows(
    hidden_rows: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    row_labels: torch.Tensor,
    *,
    ignore_index: int = IGNORE_INDEX,
    vocab_size: int | None = None,
    normalizer: float | torch.Tensor | None = None,
    impl: str = "auto",
) -> MaskedLMOutput:
    """masked_lm_loss on rows the caller has already gathered: hidden_rows [N, H], row_labels [N].

    For a model that selects the masked positions itself (to run its MLM transform on them only):
    no second selection and no host sync of its own. A row labelled ignore_index still counts as
    ignored (it costs a decoder row, nothing else).
    """
    if hidden_rows.dim() != 2 or row_labels.shape != hidden_rows.shape[:1]:
        raise ValueError(
            f"hidden_rows must be [N, H] with row_labels [N]; got hidden_rows "
            f"{tuple(hidden_rows.shape)} and row_labels {tuple(row_labels.shape)}"
        )
    if weight.dim() != 2 or weight.shape[1] != hidden_rows.shape[-1]:
        raise ValueError(
            f"weight must be [V, H={hidden_rows.shape[-1]}], got {tuple(weight.shape)}"
        )
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"bias must be [V={weight.shape[0]}], got {tuple(bias.shape)}")
    if row_labels.dtype.is_floating_point or row_labels.dtype == torch.bool:
        raise ValueError(f"labels must be an integer tensor, got {row_labels.dtype}")
    vocab = _check_vocab(vocab_size, weight.shape[0], "weight")
    which = _resolve_impl(impl, hidden_rows.device)
    num_masked = (row_labels != ignore_index).sum()  # int64, stays on the device

    if which == "torch":
        loss_sum, num_correct = reference.masked_lm_loss_sum(
            hidden_rows, weight, bias, row_labels, ignore_index, vocab
        )
    else:
        # Lazy: autograd imports triton_ce (see _resolve_impl).
        from .autograd import SoftmaxCrossEntropyFunction

        # Full padded width: aligned rows for the GEMM; the kernel skips columns >= vocab. These
        # logits belong to this function alone, so the backward may overwrite them with the
        # gradient.
        logits = torch.nn.functional.linear(hidden_rows, weight, bias)
        row_loss, correct = SoftmaxCrossEntropyFunction.apply(
            logits, row_labels, ignore_index, vocab, True
        )
        loss_sum, num_correct = row_loss.sum(), correct.sum(dtype=torch.int64)
    # fp32 (fp64 stays fp64, so the reference can be gradchecked).
    loss = loss_sum.to(torch.promote_types(loss_sum.dtype, torch.float32))
    denom = _denominator(normalizer, num_masked)
    loss = loss / (denom.to(loss.dtype) if isinstance(denom, torch.Tensor) else denom)
    return MaskedLMOutput(loss, num_masked, num_correct.to(torch.int64))


def softmax_cross_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    ignore_index: int = IGNORE_INDEX,
    reduction: str = "mean",
    vocab_size: int | None = None,
    impl: str = "auto",
) -> torch.Tensor:
    """Softmax cross-entropy of logits [..., C] against integer labels [...], in fp32.

    reduction: "mean" (over non-ignored rows; 0 when every row is ignored, never NaN), "sum", or
    "none" (per-row loss of labels' shape, 0 on ignored rows). The result is fp32 for fp16/bf16/fp32
    logits (fp64 for fp64 with impl="torch"). vocab_size: true vocabulary when the last dim has
    padding columns. The caller's logits are never modified (the backward allocates the gradient).
    """
    if reduction not in REDUCTIONS:
        raise ValueError(
            f"unknown reduction {reduction!r}; valid values: {', '.join(map(repr, REDUCTIONS))}"
        )
    if logits.dim() < 1 or logits.shape[:-1] != labels.shape:
        raise ValueError(
            f"logits must be [..., C] with labels [...] of the same leading shape; got "
            f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)}"
        )
    if labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise ValueError(f"labels must be an integer tensor, got {labels.dtype}")
    vocab = _check_vocab(vocab_size, logits.shape[-1], "logits")
    which = _resolve_impl(impl, logits.device)

    x = logits.reshape(-1, logits.shape[-1])
    y = labels.reshape(-1)
    if which == "torch":
        row_loss = reference.softmax_cross_entropy_rows(x, y, ignore_index, vocab)
    else:
        # Lazy: autograd imports triton_ce (see _resolve_impl).
        from .autograd import SoftmaxCrossEntropyFunction

        if x.stride(-1) != 1:
            x = x.contiguous()
        row_loss, _ = SoftmaxCrossEntropyFunction.apply(x, y, ignore_index, vocab, False)
    if reduction == "none":
        return row_loss.reshape(labels.shape)
    if reduction == "sum":
        return row_loss.sum()
    return row_loss.sum() / (y != ignore_index).sum().clamp_min(1).to(row_loss.dtype)
