"""The chunk length of the blocked sliding-window path (:mod:`pretrain.model.attention_paths`),
light to import: the doctor's memory estimate sizes a local layer's keys with it without loading
the attention paths (which register with transformers' attention interfaces at import)."""

from __future__ import annotations

#: Smallest chunk of the blocked local path: a tiny window would otherwise mean many tiny SDPA
#: problems (each query block still sees only its own and its two neighbouring chunks).
MIN_CHUNK = 32


def default_chunk(window: int) -> int:
    """Chunk length of the blocked local path for a band half-width ``window``: a query chunk
    attends to 3 chunks of keys."""
    return max(int(window), MIN_CHUNK)
