"""A loader over shards in object storage: batches handed out only once their shards are here.

:class:`CachedPlans` is the batch sampler of such a loader (build_loader puts it around the
GlobalSampler or the mixture's). In the rank's main process, before it hands batch j's plan to
the DataLoader (and so to a worker), it waits until this rank's shard cache
(:mod:`data_prep.shard_cache`) holds the shards the plan reads. For training it first starts the
cache's stream: a copy of the sampler, from the same data position, walked ahead by the cache's
planner thread in chunks of :data:`CHUNK` batches (their indices in one vectorised
``sampler.plan`` call), each summarised as the shards in the order the batches first read them
and the last batch that reads each. :class:`Delivered` wraps the
loader's iterator and tells the cache when batch j has come out, so that its shards count as
read. The shards of validation are fetched before training starts
(:func:`keep_validation_shards`) and stay; a validation pass (train=False) fetches anything else
it reads as it goes.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

#: batches the planner summarises at a time: each of their shards counts as needed until the
#: last of them that reads it, so a chunk must be short next to a window (or an epoch)
CHUNK = 16


def shard_reader(reader):
    """The ShardReader that holds a reader's shards (a mixture's joined one)."""
    return getattr(reader, "_joined", reader)


def process_cache():
    from bertforge.data_prep.shard_cache import process_cache as cache  # lazy: fsspec

    return cache()


class CachedPlans:
    """Batch sampler: ``sampler``'s plans, each once the cache holds its shards (module doc)."""

    def __init__(self, sampler, reader, ahead: bool):
        self.sampler, self.shards, self.ahead = sampler, shard_reader(reader), bool(ahead)
        self.cache = process_cache()

    def __len__(self) -> int:
        return len(self.sampler)

    def _chunk_indices(self, sampler, first: int, n: int) -> np.ndarray:
        """[n, micro] dataset indices of this rank's training batches first .. first + n - 1,
        in one vectorised ``sampler.plan`` call (a batch's positions: its block's start, then
        the rank's micro-batch slot, as GlobalSampler.__iter__ cuts them)."""
        m, world = sampler.micro_batch_size, sampler.world_size
        starts = sampler.consumed_samples + (first + np.arange(n, dtype=np.int64)) * m * world
        pos = starts[:, None] + sampler.rank * m + np.arange(m, dtype=np.int64)[None, :]
        return sampler.plan(pos.reshape(-1)).indices.reshape(n, m)

    def _chunks(self, sampler) -> Iterator[tuple[int, list, list[int]]]:
        first = 0
        while True:
            idx = self._chunk_indices(sampler, first, CHUNK)
            shard = self.shards.shard_ids(idx.reshape(-1))
            batch = np.repeat(np.arange(first, first + CHUNK), idx.shape[1])
            uniq, first_seen = np.unique(shard, return_index=True)
            last = np.full(len(uniq), -1, dtype=np.int64)
            np.maximum.at(last, np.searchsorted(uniq, shard), batch)
            order = np.argsort(first_seen, kind="stable")
            units, lasts = [], []
            for k, b in zip(uniq[order].tolist(), last[order].tolist()):
                unit = self.shards._units[k]
                if unit is not None:  # a local source of a mixture needs no fetching
                    units.append(unit)
                    lasts.append(b)
            yield first, units, lasts
            first += CHUNK

    def __iter__(self):
        if self.ahead:
            self.cache.start_stream(self._chunks(self.sampler.clone()))
        for plan in self.sampler:
            units = self.shards.units_of(self.shards.shard_ids(plan.indices))
            if self.ahead:
                self.cache.wait(units)
            else:
                self.cache.ensure(units, keep=True)
            yield plan


class Delivered:
    """The loader's iterator; each batch out marks its plan's shards as read (module doc)."""

    def __init__(self, it, cache):
        self.it, self.cache, self.count = it, cache, 0

    def __iter__(self):
        return self

    def __next__(self):
        batch = next(self.it)
        self.cache.release(self.count)
        self.count += 1
        return batch

    def __getattr__(self, name):
        return getattr(self.it, name)


def keep_validation_shards(val_readers, sequences: int) -> None:
    """Fetch the validation shards every evaluation reads (the first ``sequences`` of each split,
    in index order, all ranks' together) and keep them, before the training stream starts: its
    planner then fills only the rest of the limit, and no evaluation waits for a fetch."""
    for _, reader in val_readers:
        shards = shard_reader(reader)
        n = min(int(sequences), len(reader))
        if shards.remote and n > 0:
            process_cache().ensure(shards.units_of(shards.shard_ids(np.arange(n))), keep=True)
