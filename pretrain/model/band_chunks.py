"""The chunk length of the blocked sliding-window path (:mod:`pretrain.model.attention_paths`)
and the length below which it is not used, light to import: the doctor's memory estimate sizes a
local layer's keys with them without loading the attention paths (which register with
transformers' attention interfaces at import)."""

from __future__ import annotations

#: Smallest chunk of the blocked local path: a tiny window would otherwise mean many tiny SDPA
#: problems (each query block still sees only its own and its two neighbouring chunks).
MIN_CHUNK = 32

#: A local layer whose sequence is at most this many chunks long runs as one SDPA with the dense
#: band mask: there the blocked path's copies and masks cost more than the keys it skips
#: (measured, one layer fwd+bwd, bf16 CPU, window 64, 2,048 tokens: at 512 tokens dense 18 ms vs
#: blocked 28, at 1,024 32 vs 32, at 2,048 97 vs 30; docs/model.md).
DENSE_LOCAL_CHUNKS = 8


def default_chunk(window: int) -> int:
    """Chunk length of the blocked local path for a band half-width ``window``: a query chunk
    attends to 3 chunks of keys."""
    return max(int(window), MIN_CHUNK)


def runs_dense_band(seq_len: int, chunk: int) -> bool:
    """Whether a local layer over ``seq_len`` tokens (blocked chunks of ``chunk``) runs one SDPA
    with the dense band instead (:data:`DENSE_LOCAL_CHUNKS`): the attention path's choice and
    the memory estimate's."""
    return seq_len <= DENSE_LOCAL_CHUNKS * chunk
