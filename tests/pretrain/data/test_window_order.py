"""The window order (``--data_order window``): shards shuffled, sequences shuffled within
windows of shards; a function of (seed, epoch) like the global order, so a stream resumes at its
exact next sample on any world size without replaying what came before; mixtures window each
source; a loader over remote shards plans its fetches from the resume point on."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from bertforge.data_prep.reader import ShardReader
from bertforge.pretrain.data.cached_plans import CHUNK, CachedPlans
from bertforge.pretrain.data.loader import DataConfig, GlobalSampler
from bertforge.pretrain.data.mixture import MixtureSampler
from bertforge.pretrain.data.window_order import auto_window, window_permutation

COUNTS = np.array([7, 3, 11, 5, 9, 4, 8, 6, 2, 10])


def shard_of(index: np.ndarray, counts=COUNTS) -> np.ndarray:
    return np.searchsorted(np.cumsum(counts), index, side="right")


@pytest.mark.parametrize("window", [1, 3, 4, 10])
def test_each_window_is_a_run_of_whole_shards(window):
    perm = window_permutation(COUNTS, window, [1234, 0])
    assert sorted(perm.tolist()) == list(range(COUNTS.sum()))
    shards = shard_of(perm)
    # every window's sequences come in one stretch, its shards in the order first entered
    order, pos = list(dict.fromkeys(shards.tolist())), 0
    for w in range(0, len(COUNTS), window):
        members = set(order[w : w + window])
        size = int(COUNTS[list(members)].sum())
        assert set(shards[pos : pos + size].tolist()) == members
        pos += size
    assert pos == COUNTS.sum()


def test_the_order_is_a_function_of_seed_and_epoch():
    a = window_permutation(COUNTS, 3, [1, 0])
    assert np.array_equal(a, window_permutation(COUNTS, 3, [1, 0]))
    assert not np.array_equal(a, window_permutation(COUNTS, 3, [1, 1]))
    assert not np.array_equal(a, window_permutation(COUNTS, 3, [2, 0]))


def sampler(world: int, rank: int, consumed: int = 0, micro: int = 2, **kw) -> GlobalSampler:
    return GlobalSampler(
        int(COUNTS.sum()), micro, rank, world, consumed, window=3, shard_counts=COUNTS, **kw
    )


def stream(world: int, consumed: int, blocks: int, micro: int = 2) -> list[int]:
    """The global stream from ``consumed`` on: every rank's plans of each block, in rank order."""
    its = [iter(sampler(world, r, consumed, micro)) for r in range(world)]
    out = []
    for _ in range(blocks):
        for it in its:
            out += next(it).indices.tolist()
    return out


def test_resume_continues_the_stream_on_any_world_size():
    """Two epochs and more: the same sequence of samples whether read by 1, 2 or 3 ranks, and
    from any resume point (no replay: the resumed sampler starts at its position)."""
    full = stream(1, 0, 80, micro=2)  # 160 samples: over two epochs of 65
    for world in (2, 3):
        assert stream(world, 0, 160 // (2 * world) + 1)[:150] == full[:150]
    for consumed in (6, 12, 66):
        assert stream(2, consumed, 20)[:40] == full[consumed : consumed + 40]


def test_windows_are_local_to_few_shards():
    """A batch of the window order reads at most two windows' shards; the global order reads
    across the corpus."""

    def shards_per_batch(s):
        return [len(set(shard_of(p.indices).tolist())) for p in itertools.islice(s, 8)]

    window = shards_per_batch(sampler(1, 0, micro=8))
    spread = shards_per_batch(GlobalSampler(int(COUNTS.sum()), 8))
    assert max(window) <= 6 and np.mean(spread) > np.mean(window)


def test_mixture_windows_each_source():
    counts = [COUNTS[:4], COUNTS[4:]]
    lengths = [int(c.sum()) for c in counts]
    mix = MixtureSampler(lengths, [0.5, 0.5], 4, window=2, shard_counts=counts)
    for source in (0, 1):
        got = mix.source_order(source, 0)
        assert np.array_equal(got, window_permutation(counts[source], 2, [1234, source, 0]))
    again = mix.clone()
    assert np.array_equal(again.plan(np.arange(40)).indices, mix.plan(np.arange(40)).indices)


def test_window_flags_and_auto_size():
    assert DataConfig(data_order="window", window_shards=4).window == 4
    assert DataConfig(window_shards=4).window == 0  # the global order ignores it
    with pytest.raises(ValueError, match="--data_order"):
        DataConfig(data_order="shuffled")
    assert auto_window([10**6] * 10, 1, 30 * 10**6) == 10  # a third of 30 MB: 10 shards
    assert auto_window([10**6] * 10, 2, 30 * 10**6) == 5  # two sources share it
    assert auto_window([10**9], 1, 10**6) == 1


def test_a_loader_over_remote_shards_plans_from_the_resume_point(english_many_shards):
    """The planner's first chunk starts with the shards of the resume position: what the stream
    read before it is not fetched again."""
    reader = ShardReader(english_many_shards)
    reader._units = [f"unit-{k}" for k in range(len(reader._units))]  # stand-ins for Units
    counts = reader.shard_sequence_counts()
    full = GlobalSampler(len(reader), 4, window=1, shard_counts=counts)
    order = full.order(0)
    resume = int(counts[reader.shard_ids(order[:1])[0]]) + 5  # inside the second window
    plans = CachedPlans.__new__(CachedPlans)
    plans.shards = reader
    resumed = GlobalSampler(len(reader), 4, consumed_samples=resume, window=1, shard_counts=counts)
    for j, plan in enumerate(itertools.islice(resumed.clone(), 40)):  # the vectorised plans
        assert np.array_equal(plans._chunk_indices(resumed, j, 1)[0], plan.indices)
    first, units, last = next(plans._chunks(resumed.clone()))
    assert first == 0
    assert units[0] == f"unit-{reader.shard_ids(order[resume : resume + 1])[0]}"
    assert f"unit-{reader.shard_ids(order[:1])[0]}" not in units  # the first window: read
    assert all(0 <= b < CHUNK for b in last)  # the last batch of the chunk that reads each
