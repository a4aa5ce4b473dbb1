"""Fused masked-LM loss: softmax cross-entropy on the masked rows only.

A Triton kernel, with a pure-PyTorch fallback:

    out = kernels.masked_lm_loss(hidden, weight, bias, labels, vocab_size=V, normalizer=None)
    out.loss, out.num_masked, out.num_correct

Importing this package works without a GPU and without triton (impl="torch" is then used).
`kernels.IGNORE_INDEX` is the project's one "no label here" value (kernels/constants.py).
"""

from .api import (
    IMPLS,
    REDUCTIONS,
    MaskedLMOutput,
    masked_lm_loss,
    masked_lm_loss_rows,
    softmax_cross_entropy,
)
from .constants import IGNORE_INDEX

__all__ = [
    "IGNORE_INDEX",
    "IMPLS",
    "REDUCTIONS",
    "MaskedLMOutput",
    "masked_lm_loss",
    "masked_lm_loss_rows",
    "softmax_cross_entropy",
]
