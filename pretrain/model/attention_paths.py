"""ModernBERT's attention paths: one attention function for transformers' ``ModernBertAttention``.

transformers' ``ModernBertModel`` passes a dict ``{layer_type: mask}`` to its layers unchanged and
each layer calls ``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]``. Our model
(:mod:`pretrain.model.modernbert`) sets ``_attn_implementation`` to :data:`ATTN_IMPLEMENTATION`
and puts a :class:`DocumentLayout` (the batch's document ids, padding -1) under both layer types;
:func:`document_attention_forward` then picks, per layer:

- the unpadded form on CUDA (``layout.cu_seqlens`` set, one row of real tokens): PyTorch's
  flash-attention varlen kernel (``torch.nn.attention.varlen.varlen_attn``) over the documents,
  ``window_size=(w, w)`` in the local layers, so no padding token and no cross-document score is
  computed. That kernel needs CUDA and half precision; its plumbing is tested on the CPU against a
  pure-PyTorch varlen reference, the kernel itself by ``make gpu-check`` (which trains
  ``--arch modernbert``);
- global layers, padded form: SDPA with the block-diagonal document mask
  (:func:`pretrain.model.document_attention.document_mask`, one additive copy shared by the
  global layers of a forward), O(T^2);
- local layers, padded form (CPU, or a GPU run in fp32): :func:`blocked_local_attention`, exact
  and O(T * window).

The window: transformers passes ``sliding_window = config.sliding_window + 1`` (flash-attention's
inclusive bound) and masks ``|q - k| <= config.sliding_window`` (= local_attention / 2) in its
own SDPA path; :func:`window_of` undoes the +1, so every path here keeps ``|q - k| <= w``.

Any other mask (a plain tensor, or None: transformers' own callers, e.g. ``model.model(ids,
attention_mask=...)`` on a model of ours) goes to transformers' SDPA function unchanged; for
that, the same name is registered with transformers' mask interface as its SDPA mask builder.
An exported config.json does not carry the name (transformers drops ``_attn_implementation`` on
save), so exported folders load in plain transformers as SDPA models.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from bertforge.logs import get_logger
from bertforge.pretrain.model.band_chunks import (
    DENSE_LOCAL_CHUNKS,
    default_chunk,
    runs_dense_band,
)
from bertforge.pretrain.model.document_attention import document_mask

try:  # torch >= 2.10; raises NotImplementedError on the CPU
    from torch.nn.attention.varlen import varlen_attn
except ImportError:  # pragma: no cover - older torch: the padded paths only
    varlen_attn = None

log = get_logger(__name__)

#: The ``config._attn_implementation`` name of :func:`document_attention_forward`.
ATTN_IMPLEMENTATION = "bertforge_document"
#: Document id of the positions the blocked path adds around the sequence (never a real id, and
#: not padding's -1, so neither attends to them).
OUTSIDE = -2
#: Dtypes flash-attention's varlen kernel takes.
VARLEN_DTYPES = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class DocumentLayout:
    """Which tokens may attend to which: ``document_ids`` [B, T] (padding -1; equal ids attend to
    each other). The unpadded form (:meth:`unpadded`) is one row [1, N] of real tokens with ids
    unique across sequences, plus ``cu_seqlens`` [D + 1] (int32: where each document starts, then
    N) and ``max_seqlen`` for the varlen kernel."""

    document_ids: torch.Tensor
    cu_seqlens: torch.Tensor | None = None
    max_seqlen: int = 0
    _global_masks: dict = field(default_factory=dict, repr=False, compare=False)

    def global_mask(self, dtype: torch.dtype, window: int | None = None) -> torch.Tensor:
        """The block-diagonal document mask (with ``window``: also the band |q - k| <= window)
        as an additive [B, 1, T, T] mask in ``dtype``, built once per forward: SDPA keeps its
        mask for backward and turns a boolean one into a float copy per call, so the layers of
        one kind share this one instead (T^2 x 4 bytes a layer saved in fp32: 256 MiB at 8k)."""
        if (dtype, window) not in self._global_masks:
            allowed = document_mask(self.document_ids, window)
            additive = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
            self._global_masks[dtype, window] = additive.masked_fill_(~allowed, float("-inf"))
        return self._global_masks[dtype, window]

    @classmethod
    def unpadded(cls, document_ids: torch.Tensor) -> DocumentLayout:
        """The layout of an unpadded row [1, N] (:func:`document_attention.unpad`'s ids:
        consecutive tokens of one document share an id, and ids change at every boundary)."""
        docs = document_ids[0]
        n = docs.numel()
        starts = (docs[1:] != docs[:-1]).nonzero().squeeze(1) + 1
        ends = torch.tensor([n], device=docs.device)
        cu = torch.cat([torch.zeros_like(ends), starts, ends]).to(torch.int32)
        return cls(document_ids, cu, int((cu[1:] - cu[:-1]).max()))


def window_of(sliding_window: int | None) -> int | None:
    """The band half-width w (|q - k| <= w) from the ``sliding_window`` transformers passes
    (``config.sliding_window + 1``); None for a global layer."""
    return None if sliding_window is None else int(sliding_window) - 1


def dense_document_attention(
    query, key, value, document_ids, window=None, scale=None, dropout=0.0
) -> torch.Tensor:
    """SDPA with the dense [B, 1, T, T] document mask (and the band with ``window``); q, k, v
    [B, H, T, d] -> [B, H, T, d]. O(T^2): the global layers' path, and the local layers' oracle."""
    mask = document_mask(document_ids, window)
    return F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout, scale=scale
    )


def global_document_attention(
    query, key, value, layout: DocumentLayout, scale=None, dropout=0.0, window=None
) -> torch.Tensor:
    """A global layer of the padded form (with ``window``: a local layer on a short sequence):
    SDPA with the layout's shared additive document mask; q, k, v [B, H, T, d] -> [B, H, T, d]
    (what :func:`dense_document_attention` computes)."""
    mask = layout.global_mask(query.dtype, window)
    return F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout, scale=scale
    )


def blocked_local_attention(
    query, key, value, document_ids, window: int, scale=None, dropout=0.0, chunk=None
) -> torch.Tensor:
    """Exact sliding-window attention (|q - k| <= window, same document) in O(T * window).

    q, k, v [B, H, T, d], document_ids [B, T] (padding -1) -> [B, H, T, d]. The sequence is cut
    into chunks of c >= window tokens (``chunk``, default :func:`default_chunk`); the queries of
    chunk i see the keys of chunks i-1, i, i+1 (positions [(i-1)c, (i+2)c), which hold every key
    within the window), the band and the document mask applied inside that block: one SDPA over
    [B, H, n, c, 3c] scores instead of [B, H, T, T]. T need not be a multiple of c."""
    if window < 1:
        raise ValueError(f"blocked_local_attention: window {window} must be at least 1")
    c = int(chunk or default_chunk(window))
    if c < window:
        raise ValueError(f"blocked_local_attention: chunk {c} is shorter than the window {window}")
    B, H, T, d = query.shape
    n = -(-T // c)
    tail = n * c - T
    # Key frame of chunk i: padded positions [i c, i c + 3c) = original [(i-1) c, (i+2) c).
    keys = F.pad(key, (0, 0, c, c + tail)).unfold(2, 3 * c, c).transpose(-1, -2)
    values = F.pad(value, (0, 0, c, c + tail)).unfold(2, 3 * c, c).transpose(-1, -2)
    queries = F.pad(query, (0, 0, 0, tail)).view(B, H, n, c, d)
    docs = F.pad(document_ids, (c, c + tail), value=OUTSIDE)
    key_docs = docs.unfold(1, 3 * c, c)  # [B, n, 3c]
    query_docs = docs[:, c : c + n * c].view(B, n, c)
    # Query r of a chunk sits at c + r in its key frame.
    offsets = (
        torch.arange(3 * c, device=query.device)[None, :]
        - torch.arange(c, device=query.device)[:, None]
    )
    band = (offsets - c).abs() <= window  # [c, 3c]
    mask = (query_docs[..., None] == key_docs[:, :, None, :]) & band
    out = F.scaled_dot_product_attention(
        queries, keys, values, attn_mask=mask[:, None], dropout_p=dropout, scale=scale
    )
    return out.reshape(B, H, n * c, d)[:, :, :T]


def varlen_document_attention(query, key, value, layout: DocumentLayout, window, scale=None):
    """Flash-attention varlen over ``layout``'s documents: q, k, v [1, H, N, d] of an unpadded
    row -> [1, N, H, d] (the layout transformers' attention functions return)."""
    if varlen_attn is None:
        raise RuntimeError(
            "the unpadded attention path needs torch.nn.attention.varlen (torch>=2.10)"
        )
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # [N, H, d]
    cu, longest = layout.cu_seqlens, layout.max_seqlen
    band = (window, window) if window is not None else (-1, -1)
    out = varlen_attn(q, k, v, cu, cu, longest, longest, scale=scale, window_size=band)
    return out[None]


def document_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function interface (registered as :data:`ATTN_IMPLEMENTATION`):
    q, k, v [B, H, T, d] -> ([B, T, H, d], None). A :class:`DocumentLayout` picks the path (module
    doc); any other mask goes to transformers' SDPA function."""
    if not isinstance(attention_mask, DocumentLayout):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    window = window_of(sliding_window)
    layout = attention_mask
    if layout.cu_seqlens is not None:
        if dropout:
            raise ValueError(
                "the unpadded (varlen) attention path has no attention dropout: "
                "train with --attention_probs_dropout_prob 0"
            )
        return varlen_document_attention(query, key, value, layout, window, scaling), None
    if window is None or runs_dense_band(query.shape[2], default_chunk(window)):
        out = global_document_attention(query, key, value, layout, scaling, dropout, window)
    else:
        out = blocked_local_attention(
            query, key, value, layout.document_ids, window, scaling, dropout
        )
    return out.transpose(1, 2).contiguous(), None


def use_varlen(device: torch.device, dtype: torch.dtype, dropout: float) -> tuple[bool, str]:
    """(whether a forward on ``device`` computing in ``dtype`` runs unpadded through the varlen
    kernel, why): CUDA, half precision, no attention dropout and a torch that ships the kernel."""
    if device.type != "cuda":
        return False, f"{device.type} device"
    if varlen_attn is None:
        return False, "this torch has no torch.nn.attention.varlen"
    if dtype not in VARLEN_DTYPES:
        return False, f"{dtype} (the varlen kernel needs fp16/bf16)"
    if dropout:
        return False, f"attention dropout {dropout} (the varlen kernel has none)"
    return True, "CUDA, half precision"


_logged: set[str] = set()
#: How the path's log line starts (``make gpu-check`` reads the path from it).
PATH_LOG_PREFIX = "ModernBERT attention: "


def log_path_once(varlen: bool, why: str) -> None:
    """Log once per process which attention path a ModernBERT forward takes."""
    line = PATH_LOG_PREFIX + (
        f"unpadded varlen flash-attention ({why})"
        if varlen
        else f"padded; global layers SDPA with the document mask, local "
        f"layers blocked sliding-window SDPA (dense band SDPA up to {DENSE_LOCAL_CHUNKS} "
        f"chunks) ({why})"
    )
    if line not in _logged:
        _logged.add(line)
        log.info(line)


AttentionInterface.register(ATTN_IMPLEMENTATION, document_attention_forward)
AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)
