"""The window-local training order (``--data_order window``): reads stay within a few shards.

A global order (one seeded permutation of all sequences per epoch) reads every shard in every
few batches: from object storage with a cache smaller than the data, each shard would be fetched
again and again. The window order keeps the reads of a stretch of the stream local, as MosaicML
streaming's ``py1br``/``py1e`` shuffles do: each epoch the shards are shuffled, cut into windows
of ``window`` consecutive shards of that shuffle, and the sequences of each window are shuffled
among themselves; the windows follow one another. A rank's cache then needs this window's shards
and the next one's (fetched while this one is read), not the data.

Like the global order it is a function of (seed, epoch) only, a permutation the samplers index
by global stream position: exact resume at any world size, no replay of what came before.
Shuffle quality: a batch mixes sequences of ``window`` shards (of documents spread over them, as
data_prep cuts documents into shards in input order), and each shard is read in one stretch of
the epoch; more shards per window is closer to the global order.
"""

from __future__ import annotations

import numpy as np

#: mixed into the window order's seed, so it never equals the global order's stream
WINDOW_STREAM = 0x77696E


def window_permutation(counts, window: int, key: list[int]) -> np.ndarray:
    """A permutation of ``range(sum(counts))`` (``counts``: sequences per shard, in index order):
    shards shuffled, cut into windows of ``window`` shards, sequences shuffled within each
    window (see the module doc). ``key``: the seed words ([seed, epoch] or [seed, source,
    epoch])."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    dtype = np.int32 if total < 2**31 else np.int64
    rng = np.random.Generator(np.random.PCG64([*map(int, key), WINDOW_STREAM]))
    shards = rng.permutation(len(counts))
    starts = np.concatenate([[0], np.cumsum(counts)])
    out = np.empty(total, dtype=dtype)
    pos = 0
    for w in range(0, len(shards), max(1, int(window))):
        members = shards[w : w + window]
        ids = np.concatenate([np.arange(starts[s], starts[s + 1], dtype=dtype) for s in members])
        rng.shuffle(ids)
        out[pos : pos + len(ids)] = ids
        pos += len(ids)
    return out


def auto_window(shard_bytes: list[int], sources: int, limit: int) -> int:
    """Shards per window when ``--window_shards`` is 0: a window of every source in a third of the
    cache limit (the one being read, the next one arriving, and room to spare), at least 1."""
    mean = max(1.0, float(np.mean(shard_bytes)) if len(shard_bytes) else 1.0)
    return max(1, int(limit / 3 / (mean * max(1, sources))))
