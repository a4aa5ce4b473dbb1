"""Dynamic masking (pretrain.data.masking): BERT's statistics, specials, determinism, units,
schedule."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bertforge.pretrain.data.masking import (
    IGNORE_INDEX,
    Masker,
    MaskingConfig,
    mask_prob_at,
    merge_stats,
)

SPECIAL = {"pad": 0, "unk": 100, "cls": 101, "sep": 102, "mask": 103}  # BERT's layout
VOCAB = 30522


def make_batch(n: int, length: int = 128, seed: int = 0, vocab: int = VOCAB, ragged: bool = False):
    """[CLS] body [SEP] sequences with specials sprinkled inside the body, padded to `length`."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(8, length + 1, size=n) if ragged else np.full(n, length)
    ids = np.full((n, length), SPECIAL["pad"], dtype=np.int64)
    word_start = np.zeros((n, length), dtype=bool)
    for i, L in enumerate(lengths):
        body = rng.integers(0, vocab, size=L)
        body[rng.random(L) < 0.02] = SPECIAL["sep"]  # nsp-style inner [SEP]s, and a few others
        body[rng.random(L) < 0.01] = SPECIAL["unk"]
        body[0], body[L - 1] = SPECIAL["cls"], SPECIAL["sep"]
        ids[i, :L] = body
        word_start[i, :L] = rng.random(L) < 0.6
    return ids, lengths, word_start


def run(
    cfg: MaskingConfig,
    ids,
    lengths,
    word_start,
    index=None,
    epoch=0,
    positions=None,
    vocab=VOCAB,
    special=SPECIAL,
):
    n = len(ids)
    index = np.arange(n) if index is None else np.asarray(index)
    positions = index if positions is None else np.asarray(positions)
    return Masker(cfg, vocab, special)(
        ids, lengths, word_start, index, np.full(n, epoch), positions
    )


def maskable(ids, lengths, special=SPECIAL):
    in_seq = np.arange(ids.shape[1])[None, :] < lengths[:, None]
    return in_seq & ~np.isin(ids, list(special.values()))


def test_exact_counts_and_80_10_10_split():
    ids, lengths, ws = make_batch(4000, ragged=True)
    cfg = MaskingConfig()
    out, labels, stats = run(cfg, ids, lengths, ws)
    sel = labels != IGNORE_INDEX
    n_maskable = maskable(ids, lengths).sum(axis=1)
    expected = np.maximum(np.floor(0.15 * n_maskable + 0.5), 1).astype(int)  # Google's rule
    np.testing.assert_array_equal(sel.sum(axis=1), expected)
    np.testing.assert_array_equal(labels[sel], ids[sel])  # labels are the original tokens
    n = int(sel.sum())
    is_mask = sel & (out == SPECIAL["mask"])
    kept = sel & (out == ids)
    rand = sel & ~is_mask & ~kept
    for frac, p in ((is_mask.sum() / n, 0.8), (rand.sum() / n, 0.1), (kept.sum() / n, 0.1)):
        assert abs(frac - p) < 4 * math.sqrt(p * (1 - p) / n), (frac, p)
    # Unselected tokens are untouched, and the stats report what was done.
    np.testing.assert_array_equal(out[~sel], ids[~sel])
    assert stats["selected_tokens"] == n and stats["maskable_tokens"] == int(n_maskable.sum())
    assert stats["mask_tokens"] == int(is_mask.sum())
    # A random draw can hit the original token (then it counts as random but looks kept).
    assert abs(stats["random_tokens"] + stats["kept_tokens"] - (rand.sum() + kept.sum())) == 0
    assert abs(stats["selected_fraction"] - 0.15) < 0.005
    assert stats["mask_token_fraction"] + stats["random_fraction"] + stats[
        "kept_fraction"
    ] == pytest.approx(1.0)


def test_specials_never_selected_and_random_tokens_never_special():
    # Tiny vocabulary: specials are 5 of 12 ids, so a random draw that could hit one would.
    special = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 11}
    vocab = 12
    rng = np.random.default_rng(1)
    ids = rng.integers(0, vocab, size=(3000, 64))
    ids[:, 0], ids[:, -1] = special["cls"], special["sep"]
    lengths = np.full(3000, 64)
    cfg = MaskingConfig(mask_prob=0.3, mask_token_frac=0.0, random_token_frac=1.0)
    out, labels, _ = run(cfg, ids, lengths, None, vocab=vocab, special=special)
    is_special = np.isin(ids, list(special.values()))
    assert (labels[is_special] == IGNORE_INDEX).all()
    np.testing.assert_array_equal(out[is_special], ids[is_special])
    sel = labels != IGNORE_INDEX
    drawn = out[sel]
    assert not np.isin(drawn, list(special.values())).any()
    # Uniform over the 7 non-special ids.
    counts = np.bincount(drawn, minlength=vocab)[[4, 5, 6, 7, 8, 9, 10]]
    expected = len(drawn) / 7
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 30, counts  # 6 degrees of freedom: p ~ 4e-5


def test_padding_and_tail_never_selected():
    ids, lengths, ws = make_batch(500, ragged=True, seed=3)
    ids[np.arange(128)[None, :] >= lengths[:, None]] = 7  # garbage past the end must be ignored
    _, labels, _ = run(MaskingConfig(mask_prob=0.5), ids, lengths, ws)
    assert (labels[np.arange(128)[None, :] >= lengths[:, None]] == IGNORE_INDEX).all()


def test_same_sample_same_mask_in_any_batch():
    ids, lengths, ws = make_batch(64, ragged=True, seed=4)
    index = np.arange(1000, 1064)
    cfg = MaskingConfig(whole_word=True)
    out, labels, _ = run(cfg, ids, lengths, ws, index=index, epoch=3)
    # Another batch composition, order and padded length: sample by sample identical.
    perm = np.random.default_rng(0).permutation(64)[:40]
    wide = np.zeros((40, 136), dtype=np.int64)
    wide_ws = np.zeros((40, 136), dtype=bool)
    wide[:, :128], wide_ws[:, :128] = ids[perm], ws[perm]
    out2, labels2, _ = run(cfg, wide, lengths[perm], wide_ws, index=index[perm], epoch=3)
    np.testing.assert_array_equal(out2[:, :128], out[perm])
    np.testing.assert_array_equal(labels2[:, :128], labels[perm])
    # Another epoch or seed gives another mask.
    _, labels3, _ = run(cfg, ids, lengths, ws, index=index, epoch=4)
    assert (labels3 != labels).any()
    _, labels4, _ = run(
        MaskingConfig(whole_word=True, seed=7), ids, lengths, ws, index=index, epoch=3
    )
    assert (labels4 != labels).any()


def test_max_predictions_cap():
    ids, lengths, ws = make_batch(300, seed=5)
    _, labels, _ = run(MaskingConfig(max_predictions=5), ids, lengths, ws)
    np.testing.assert_array_equal((labels != IGNORE_INDEX).sum(axis=1), 5)
    _, labels, _ = run(MaskingConfig(max_predictions=5, whole_word=True), ids, lengths, ws)
    counts = (labels != IGNORE_INDEX).sum(axis=1)
    assert counts.max() <= 5 and counts.mean() > 3


def units_of(ws_row, maskable_row):
    """Token index ranges of whole-word units (a special token breaks a unit)."""
    units, cur = [], []
    for t, (w, m) in enumerate(zip(ws_row, maskable_row)):
        if not m:
            if cur:
                units.append(cur)
            cur = []
            continue
        if w and cur:
            units.append(cur)
            cur = []
        cur.append(t)
    if cur:
        units.append(cur)
    return units


def test_whole_word_units_masked_together():
    ids, lengths, ws = make_batch(800, ragged=True, seed=6)
    cfg = MaskingConfig(whole_word=True)
    _, labels, stats = run(cfg, ids, lengths, ws)
    mk = maskable(ids, lengths)
    n_units = 0
    for i in range(len(ids)):
        sel = labels[i] != IGNORE_INDEX
        for unit in units_of(ws[i], mk[i]):
            vals = sel[unit]
            assert vals.all() or not vals.any(), (i, unit)
            n_units += int(vals.all())
    assert stats["whole_word_units"] == n_units
    assert abs(stats["selected_fraction"] - 0.15) < 0.01  # counts land near the target
    # Token mode on the same batch splits units.
    _, _, tok_stats = run(MaskingConfig(), ids, lengths, ws)
    assert tok_stats["whole_word_units"] == tok_stats["selected_tokens"]


def test_schedule_values():
    const = MaskingConfig(mask_prob=0.2)
    assert mask_prob_at(const, 0) == 0.2 and mask_prob_at(const, 10**9) == 0.2
    lin = MaskingConfig(mask_prob=0.3, mask_prob_end=0.15, schedule_samples=1000)
    assert mask_prob_at(lin, 0) == pytest.approx(0.3)
    assert mask_prob_at(lin, 500) == pytest.approx(0.225)
    assert mask_prob_at(lin, 1000) == pytest.approx(0.15)
    assert mask_prob_at(lin, 5000) == pytest.approx(0.15)
    np.testing.assert_allclose(mask_prob_at(lin, np.array([0, 250, 2000])), [0.3, 0.2625, 0.15])
    # The masker applies the value at each sample's global position.
    ids, lengths, ws = make_batch(200, seed=7)
    _, _, early = run(lin, ids, lengths, ws, positions=np.zeros(200))
    _, _, late = run(lin, ids, lengths, ws, positions=np.full(200, 1000))
    assert abs(early["selected_fraction"] - 0.3) < 0.005
    assert abs(late["selected_fraction"] - 0.15) < 0.005
    assert early["mask_prob"] == pytest.approx(0.3) and late["mask_prob"] == pytest.approx(0.15)


def test_merge_stats_recomputes_fractions():
    ids, lengths, ws = make_batch(100, seed=8)
    s1 = run(MaskingConfig(), ids[:60], lengths[:60], ws[:60])[2]
    s2 = run(MaskingConfig(), ids[60:], lengths[60:], ws[60:], index=np.arange(60, 100))[2]
    whole = run(MaskingConfig(), ids, lengths, ws)[2]
    merged = merge_stats([s1, s2])
    for k in ("selected_tokens", "mask_tokens", "random_tokens", "kept_tokens", "maskable_tokens"):
        assert merged[k] == whole[k]
    assert merged["selected_fraction"] == pytest.approx(whole["selected_fraction"])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"mask_prob": 1.5},
        {"mask_token_frac": 0.9, "random_token_frac": 0.2},
        {"mask_prob_end": 0.1},
        {"max_predictions": 0},
        {"static_masking": True, "mask_prob_end": 0.1, "schedule_samples": 100},
    ],
)
def test_bad_config_is_rejected(kwargs):
    with pytest.raises(ValueError, match="MaskingConfig"):
        MaskingConfig(**kwargs)


def test_whole_word_needs_word_starts_and_specials_need_mask():
    ids, lengths, _ = make_batch(4, seed=9)
    with pytest.raises(ValueError, match="word-start"):
        run(MaskingConfig(whole_word=True), ids, lengths, None)
    with pytest.raises(ValueError, match="mask"):
        Masker(MaskingConfig(), VOCAB, {"cls": 101, "sep": 102, "pad": 0})


def test_static_masking_keeps_a_samples_mask_across_epochs():
    ids, lengths, ws = make_batch(32, ragged=True, seed=11)
    index = np.arange(500, 532)
    for whole_word in (False, True):
        cfg = MaskingConfig(whole_word=whole_word, static_masking=True)
        first = run(cfg, ids, lengths, ws, index=index, epoch=0)
        for epoch in (1, 7):  # the same masked ids and labels in every later epoch
            later = run(cfg, ids, lengths, ws, index=index, epoch=epoch)
            np.testing.assert_array_equal(later[0], first[0])
            np.testing.assert_array_equal(later[1], first[1])
        # ... and it is epoch 0's dynamic mask, while samples still differ from each other.
        dynamic = run(MaskingConfig(whole_word=whole_word), ids, lengths, ws, index=index)
        np.testing.assert_array_equal(dynamic[1], first[1])
        same_ids = np.repeat(ids[:1], 32, axis=0)
        rows = (
            run(
                cfg,
                same_ids,
                np.repeat(lengths[:1], 32),
                np.repeat(ws[:1], 32, axis=0),
                index=index,
                epoch=3,
            )[1]
            != IGNORE_INDEX
        )
        assert len({r.tobytes() for r in rows}) > 1  # one text, other sample indices: other masks
