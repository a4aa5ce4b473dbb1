"""Sentence-order pairs (ALBERT's SOP, ``--objective mlm+sop``) from NSP shards: half of the
consecutive pairs swapped, every token kept, the segment types following the swap, random-next
pairs left out of the order task, and every swap a function of (seed, epoch, sample index)."""

from __future__ import annotations

import numpy as np
import pytest

from bertforge.data_prep.reader import ShardReader
from bertforge.pretrain.data.loader import BatchPlan, DataConfig, MaskedBatches, build_loader
from bertforge.pretrain.data.masking import IGNORE_INDEX, MaskingConfig
from bertforge.pretrain.data.sentence_order import order_pairs, swap_coins


def test_a_swapped_pair_is_b_then_a_with_its_own_segment_lengths():
    # [CLS]=1 A=(10, 11) [SEP]=2 B=(20, 21, 22) [SEP]=2, padded; a second, random-next pair
    ids = np.array([[1, 10, 11, 2, 20, 21, 22, 2, 0], [1, 30, 2, 40, 2, 0, 0, 0, 0]])
    ws = ids.astype(bool)
    lengths, a_len = np.array([8, 5]), np.array([4, 3])
    swap = np.array([True, True])
    got, got_ws, got_a, labels = order_pairs(ids, ws, lengths, a_len, np.array([0, 1]), swap)
    assert got[0].tolist() == [1, 20, 21, 22, 2, 10, 11, 2, 0]
    assert got_a.tolist() == [5, 3] and labels.tolist() == [1, IGNORE_INDEX]
    assert got[1].tolist() == ids[1].tolist()  # random-next: no order to tell, not swapped
    assert got_ws[0].tolist() == ws[0][[0, 4, 5, 6, 3, 1, 2, 7, 8]].tolist()
    assert ids[0, 1] == 10  # the input is not changed
    kept, *_ = order_pairs(ids, ws, lengths, a_len, np.array([0, 1]), np.array([False, True]))
    assert kept.tolist() == ids.tolist()


def test_the_coin_is_fair_and_a_function_of_seed_epoch_and_index():
    index = np.arange(4000)
    coins = swap_coins(1234, np.zeros_like(index), index)
    assert 0.47 < coins.mean() < 0.53
    again = swap_coins(1234, np.zeros(10, dtype=np.int64), index[::-1][:10])
    assert again.tolist() == coins[::-1][:10].tolist()  # batch order and company do not matter
    assert (swap_coins(1234, np.ones_like(index), index) != coins).mean() > 0.4  # a new epoch
    assert (swap_coins(99, np.zeros_like(index), index) != coins).mean() > 0.4  # a new seed


def test_loader_batches_of_pair_shards_carry_the_order_label(english_nsp_shards):
    reader = ShardReader(english_nsp_shards)
    masking = MaskingConfig(mask_prob=0.0)  # nothing masked: the tokens themselves are compared
    plain = MaskedBatches(reader, masking)
    sop = MaskedBatches(reader, masking, sentence_order=True)
    idx = np.arange(64)
    plan = BatchPlan(idx, np.zeros_like(idx), idx)
    before, after = plain.__getitems__(plan), sop.__getitems__(plan)
    assert "next_sentence_label" not in after and "sentence_order_label" in after
    label, random_next = after["sentence_order_label"], before["next_sentence_label"]
    assert (label[random_next == 1] == IGNORE_INDEX).all()
    consecutive = label[random_next == 0]
    assert 0 < int(consecutive.sum()) < len(consecutive)  # both orders in the batch
    for row in range(len(idx)):
        ids, types = before["input_ids"][row], before["token_type_ids"][row]
        n = int(before["attention_mask"][row].sum())
        a, b = ids[1 : n - 1][types[1 : n - 1] == 0], ids[1 : n - 1][types[1 : n - 1] == 1]
        got, got_types = after["input_ids"][row], after["token_type_ids"][row]
        first = got[1 : n - 1][got_types[1 : n - 1] == 0]
        if int(label[row]) == 1:  # B and a [SEP] first (type 0), then A (before the last [SEP])
            assert got[1 : n - 1].tolist() == b.tolist() + [int(a[-1])] + a.tolist()[:-1]
            assert first.tolist() == b.tolist() + [int(a[-1])]
        else:
            assert got.tolist() == ids.tolist() and got_types.tolist() == types.tolist()


def test_training_and_validation_loaders_swap_the_same_way_on_any_world_size(english_nsp_shards):
    reader = ShardReader(english_nsp_shards, "validation")

    def labels(world: int) -> list[int]:
        out = []
        for rank in range(world):
            loader = build_loader(
                reader,
                DataConfig(),
                MaskingConfig(),
                rank=rank,
                world_size=world,
                micro_batch_size=8 // world,
                train=False,
                sentence_order=True,
            )
            out += [int(v) for b in loader for v in b["sentence_order_label"]]
        return sorted(out)

    assert labels(1) == labels(2)


def test_sentence_order_on_packed_shards_is_refused_naming_the_fix(english_shards):
    with pytest.raises(ValueError, match="build them with `bertforge prep build --format nsp`"):
        MaskedBatches(ShardReader(english_shards), MaskingConfig(), sentence_order=True)
