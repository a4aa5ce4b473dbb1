"""Weighted mixtures (pretrain.data.mixture): syntax, realised weights, determinism across world
sizes and resumes, per-source mask rates and validation readers, incompatible builds refused."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from helpers.commands import run_cli

from bertforge.data_prep.sample_corpus import write_english_corpus
from bertforge.data_prep.sources import MixtureError, Source, parse_mixture
from bertforge.pretrain.data.loader import DataConfig, build_loader
from bertforge.pretrain.data.masking import IGNORE_INDEX, MaskingConfig
from bertforge.pretrain.data.mixture import (
    MixtureReader,
    MixtureSampler,
    open_training,
    quotas,
    validation_readers,
)


@pytest.fixture(scope="module")
def small_shards(tmp_path_factory, english_shards) -> Path:
    """A second build with the first one's tokenizer (30 pydoc topics, 20% validation)."""
    tmp = tmp_path_factory.mktemp("mix_small")
    corpus = write_english_corpus(tmp / "small.txt", max_docs=30)
    out = tmp / "shards"
    run_cli(
        "-m",
        "data_prep",
        "build",
        "--input",
        str(corpus),
        "--output",
        str(out),
        "--tokenizer",
        str(english_shards / "tokenizer"),
        "--max_seq_len",
        "128",
        "--validation_fraction",
        "0.2",
        "--workers",
        "1",
    )
    return out


def test_syntax_and_its_errors(tmp_path):
    assert parse_mixture(str(tmp_path)) == [Source(tmp_path.name, tmp_path, 1.0)]
    got = parse_mixture(["wiki=/d/wiki:0.5", "law=/d/a:b/law:0.3:0.2"])
    assert got == [
        Source("wiki", Path("/d/wiki"), 0.5),
        Source("law", Path("/d/a:b/law"), 0.3, 0.2),
    ]
    for bad, msg in (
        (["a=/d:0.5", "/plain"], "needs a name and a weight"),
        (["a=/d"], "no weight"),
        (["a=/d:0"], "positive"),
        (["a=/d:1", "a=/e:1"], "given twice"),
        (["a=/d:1:1.5"], "mask_prob"),
    ):
        with pytest.raises(MixtureError, match=msg):
            parse_mixture(bad)


def test_weights_realised_and_each_source_epoch_a_permutation():
    lengths, weights = [1000, 300, 50], [0.5, 0.3, 0.2]
    sampler = MixtureSampler(lengths, weights, micro_batch_size=100, seed=3)
    E = sum(lengths)
    assert quotas(weights, E).tolist() == [675, 405, 270]
    plans = list(itertools.islice(iter(sampler), 10 * E // 100))  # ten mixture epochs
    idx = np.concatenate([p.indices for p in plans])
    epochs = np.concatenate([p.epochs for p in plans])
    src = np.searchsorted([0, 1000, 1300, 1350], idx, side="right") - 1
    for window in (E, 500, 2000):  # any stretch of the stream holds the weights
        for start in range(0, len(src) - window, window):
            share = np.bincount(src[start : start + window], minlength=3) / window
            assert np.abs(share - weights).max() <= 2 / window + 1e-9, (window, share)
    # Source 2 (50 sequences, 270 a mixture epoch) is repeated: each of its epochs is a
    # permutation; source 0 (1000, 675 a mixture epoch) is subsampled and continues.
    for s, base in ((2, 1300), (0, 0)):
        sel = src == s
        for e in range(int(epochs[sel].max())):
            local = np.sort(idx[sel & (epochs == e)]) - base
            assert local.tolist() == list(range(lengths[s]))
        assert idx[sel][: lengths[s]].tolist() != sorted(idx[sel][: lengths[s]].tolist())


def rows_by_position(loader, n_batches: int) -> dict[int, tuple]:
    plans = list(itertools.islice(iter(loader.batch_sampler), n_batches))
    out = {}
    for plan, batch in zip(plans, itertools.islice(iter(loader), n_batches)):
        for r, pos in enumerate(plan.positions):
            L = int(batch["attention_mask"][r].sum())
            out[int(pos)] = (
                batch["input_ids"][r, :L].numpy().copy(),
                batch["labels"][r, :L].numpy().copy(),
                int(batch["source"][r]),
            )
    return out


def test_same_batches_on_any_world_size_and_after_resume(english_shards, small_shards):
    sources = parse_mixture([f"gen={english_shards}:0.6", f"dom={small_shards}:0.4:0.3"])
    reader = open_training(sources)
    assert isinstance(reader, MixtureReader) and len(reader) > 0
    masking = MaskingConfig(whole_word=True)
    ref = rows_by_position(
        build_loader(reader, DataConfig(num_workers=0), masking, micro_batch_size=8), 12
    )
    got = {}
    for rank in range(2):
        got.update(
            rows_by_position(
                build_loader(
                    reader,
                    DataConfig(num_workers=1),
                    masking,
                    rank=rank,
                    world_size=2,
                    micro_batch_size=4,
                ),
                12,
            )
        )
    resumed = rows_by_position(
        build_loader(
            reader,
            DataConfig(num_workers=0),
            masking,
            rank=1,
            world_size=3,
            micro_batch_size=2,
            consumed_samples=30,
        ),
        10,
    )
    assert sorted(got) == sorted(ref) == list(range(96))
    assert set(resumed) <= set(ref) and len(resumed) == 20 and min(resumed) >= 30
    for pos, (ids, labels, src) in itertools.chain(got.items(), resumed.items()):
        np.testing.assert_array_equal(ids, ref[pos][0])
        np.testing.assert_array_equal(labels, ref[pos][1])
        assert src == ref[pos][2]
    shares = np.bincount([v[2] for v in ref.values()], minlength=2) / len(ref)
    assert abs(shares[0] - 0.6) < 0.03
    # Each row is its source's sequence (the tokens before masking), read from that build.
    plan = reader.sampler(8, seed=DataConfig().seed).plan(np.arange(16))
    for pos, i in zip(plan.positions.tolist(), plan.indices.tolist()):
        s, local = reader.locate([i])
        ids, labels, src = ref[pos]
        assert int(s[0]) == src
        original = np.where(labels != IGNORE_INDEX, labels, ids)
        np.testing.assert_array_equal(original, reader.readers[src][int(local[0])].input_ids)


def test_per_source_mask_rate_and_validation_readers(english_shards, small_shards):
    sources = parse_mixture([f"gen={english_shards}:0.5", f"dom={small_shards}:0.5:0.3"])
    loader = build_loader(
        open_training(sources), DataConfig(num_workers=0), MaskingConfig(), micro_batch_size=64
    )
    selected, maskable = np.zeros(2), np.zeros(2)
    special = list(set(open_training(sources).special_tokens.values()))
    for batch in itertools.islice(iter(loader), 8):
        sel = batch["labels"].numpy() != IGNORE_INDEX
        ids = np.where(sel, batch["labels"].numpy(), batch["input_ids"].numpy())
        can = (batch["attention_mask"].numpy() == 1) & ~np.isin(ids, special)
        for s in (0, 1):
            rows = batch["source"].numpy() == s
            selected[s] += sel[rows].sum()
            maskable[s] += can[rows].sum()
    rates = selected / maskable
    assert abs(rates[0] - 0.15) < 0.01 and abs(rates[1] - 0.3) < 0.01, rates

    vals = validation_readers(sources)
    assert [name for name, _ in vals] == ["gen", "dom"]
    for k, (_name, reader) in enumerate(vals):
        batches = list(
            build_loader(
                reader, DataConfig(num_workers=0), MaskingConfig(), micro_batch_size=16, train=False
            )
        )
        assert sum(len(b["input_ids"]) for b in batches) == len(reader) > 0
        assert all((b["source"] == k).all() for b in batches)
        stats = [b["masking_stats"] for b in batches]
        rate = sum(s["selected_tokens"] for s in stats) / sum(s["maskable_tokens"] for s in stats)
        assert abs(rate - (0.15, 0.3)[k]) < 0.02


def test_incompatible_builds_refused_with_the_differences(
    english_shards, chinese_shards, english_nsp_shards
):
    with pytest.raises(MixtureError) as err:
        open_training(
            parse_mixture(
                [f"en={english_shards}:1", f"zh={chinese_shards}:1", f"nsp={english_nsp_shards}:1"]
            )
        )
    msg = str(err.value)
    assert "tokenizer fingerprint differs" in msg and "format differs" in msg
    assert "max_seq_len differs" not in msg  # all three are 128
    for name, path in (("en", english_shards), ("zh", chinese_shards), ("nsp", english_nsp_shards)):
        assert f"{name} ({path})" in msg
    assert f"nsp ({english_nsp_shards}): nsp" in msg
