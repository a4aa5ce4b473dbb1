"""The data pipeline (pretrain.data.loader) on real shards: order, determinism, collation,
errors."""

from __future__ import annotations

import io
import itertools
import json
import math
import shutil

import numpy as np
import pytest
from helpers.commands import run_cli

from bertforge.data_prep.reader import ShardError, ShardReader
from bertforge.pretrain.config.cli import parse_args
from bertforge.pretrain.data.loader import DataConfig, GlobalSampler, build_loader
from bertforge.pretrain.data.masking import IGNORE_INDEX, MaskingConfig
from bertforge.pretrain.dry_run import main as dry_run_main
from bertforge.pretrain.dry_run import run_dry_run
from bertforge.pretrain.model.registry import PRESETS


def take(loader, n: int) -> list[dict]:
    return list(itertools.islice(iter(loader), n))


def rows_by_position(loader, n_batches: int) -> dict[int, tuple]:
    """{global position: (input_ids, labels, token types) trimmed to the sequence length}."""
    plans = list(itertools.islice(iter(loader.batch_sampler), n_batches))
    out = {}
    for plan, batch in zip(plans, take(loader, n_batches)):
        for r, pos in enumerate(plan.positions):
            L = int(batch["attention_mask"][r].sum())
            out[int(pos)] = tuple(
                batch[k][r, :L].numpy().copy() for k in ("input_ids", "labels", "token_type_ids")
            )
    return out


@pytest.mark.parametrize("world", [1, 2, 3])
def test_ranks_partition_the_global_order_every_epoch(world):
    n, micro = 103, 4
    samplers = [GlobalSampler(n, micro, r, world, seed=5) for r in range(world)]
    steps = 3 * n // (micro * world) + 1
    per_rank = [list(itertools.islice(iter(s), steps)) for s in samplers]
    positions = np.sort(np.concatenate([p.positions for plans in per_rank for p in plans]))
    np.testing.assert_array_equal(positions, np.arange(steps * micro * world))  # no gap, no repeat
    by_pos = {
        int(q): (int(e), int(i))
        for plans in per_rank
        for p in plans
        for q, e, i in zip(p.positions, p.epochs, p.indices)
    }
    for epoch in range(3):  # every epoch is a permutation of the dataset, and a different one
        idx = [by_pos[q][1] for q in range(epoch * n, (epoch + 1) * n)]
        assert sorted(idx) == list(range(n))
        assert {by_pos[q][0] for q in range(epoch * n, (epoch + 1) * n)} == {epoch}
    assert [by_pos[q][1] for q in range(n)] != [by_pos[q][1] for q in range(n, 2 * n)]
    # The order is the one of a single rank (world size 1): independent of the world size.
    single = list(itertools.islice(iter(GlobalSampler(n, micro * world, 0, 1, seed=5)), steps))
    assert by_pos == {
        int(q): (int(e), int(i))
        for p in single
        for q, e, i in zip(p.positions, p.epochs, p.indices)
    }


def test_resume_on_another_world_size_continues_the_global_order():
    n, consumed = 50, 36  # saved after 3 steps of global batch 12
    ref = GlobalSampler(n, 12, 0, 1, seed=9)
    expected = np.concatenate([p.indices for p in itertools.islice(iter(ref), 6)])[consumed:]
    resumed = [
        list(itertools.islice(iter(GlobalSampler(n, 3, r, 4, consumed, seed=9)), 3))
        for r in range(4)
    ]
    got = {
        int(q): int(i) for plans in resumed for p in plans for q, i in zip(p.positions, p.indices)
    }
    assert [got[q] for q in range(consumed, consumed + 36)] == expected.tolist()


def test_validation_pass_covers_every_sample_once():
    n, micro, world = 103, 4, 3
    seen, counts = [], []
    for r in range(world):
        s = GlobalSampler(n, micro, r, world, train=False)
        plans = list(s)
        counts.append(len(plans))
        assert len(s) == len(plans)
        seen += [int(i) for p in plans for i in p.indices]
    assert sorted(seen) == list(range(n))
    assert max(counts) - min(counts) <= 1


def test_masks_identical_across_worker_counts_world_sizes_and_resume(english_shards):
    reader = ShardReader(english_shards)
    masking = MaskingConfig(whole_word=True)
    ref = rows_by_position(
        build_loader(reader, DataConfig(num_workers=0), masking, micro_batch_size=8), 6
    )
    assert sorted(ref) == list(range(48))
    got = {}
    for rank in range(2):  # two ranks, two workers each, micro-batch 4: same global batches
        got.update(
            rows_by_position(
                build_loader(
                    reader,
                    DataConfig(num_workers=2),
                    masking,
                    rank=rank,
                    world_size=2,
                    micro_batch_size=4,
                ),
                6,
            )
        )
    resumed = rows_by_position(
        build_loader(
            reader,
            DataConfig(num_workers=1),
            masking,
            rank=1,
            world_size=3,
            micro_batch_size=2,
            consumed_samples=24,
        ),
        4,
    )
    assert sorted(got) == sorted(ref) and set(resumed) <= set(ref) and len(resumed) == 8
    for pos, (ids, labels, _types) in itertools.chain(got.items(), resumed.items()):
        np.testing.assert_array_equal(ids, ref[pos][0])
        np.testing.assert_array_equal(labels, ref[pos][1])
    # And the masks really are dynamic: the same sample in the next epoch is masked differently.
    assert not np.array_equal(first_sample_next_epoch(reader, masking), ref[0][1])


def first_sample_next_epoch(reader, masking: MaskingConfig) -> np.ndarray:
    """The labels of stream position 0's sample where it comes again in epoch 1."""
    sampler = GlobalSampler(len(reader), 8, seed=DataConfig().seed)
    idx0 = int(sampler.plan(np.array([0])).indices[0])
    later = next(
        p
        for p in range(len(reader), 2 * len(reader))
        if int(sampler.plan(np.array([p])).indices[0]) == idx0
    )
    b = take(
        build_loader(
            reader, DataConfig(num_workers=0), masking, micro_batch_size=1, consumed_samples=later
        ),
        1,
    )[0]
    return b["labels"][0, : int(b["attention_mask"][0].sum())].numpy()


def test_static_masking_flag_fixes_each_samples_mask_for_the_run(english_shards):
    """--static_masking: the mask a sample gets in epoch 0 is the one it gets in epoch 1."""
    cfg = parse_args(["--data", str(english_shards), "--static_masking", "true"])
    assert cfg.masking.static_masking
    reader = ShardReader(english_shards)
    ref = rows_by_position(
        build_loader(reader, DataConfig(num_workers=0), cfg.masking, micro_batch_size=8), 1
    )
    np.testing.assert_array_equal(first_sample_next_epoch(reader, cfg.masking), ref[0][1])
    assert len({labels.tobytes() for _ids, labels, _t in ref.values()}) == len(ref)


def test_collation_padding_segments_and_nsp_labels(english_nsp_shards):
    reader = ShardReader(english_nsp_shards)
    loader = build_loader(reader, DataConfig(num_workers=0), MaskingConfig(), micro_batch_size=16)
    plans = list(itertools.islice(iter(loader.batch_sampler), 4))
    for plan, batch in zip(plans, take(loader, 4)):
        samples = [reader[int(i)] for i in plan.indices]
        lengths = [len(s.input_ids) for s in samples]
        T = batch["input_ids"].shape[1]
        assert T % 8 == 0 and T - 8 < max(lengths) <= T
        assert batch["attention_mask"].sum(1).tolist() == lengths
        assert batch["next_sentence_label"].tolist() == [s.is_random_next for s in samples]
        for r, s in enumerate(samples):
            L = lengths[r]
            types = batch["token_type_ids"][r].numpy()
            assert (types[: s.segment_a_len] == 0).all() and (types[s.segment_a_len : L] == 1).all()
            assert (types[L:] == 0).all()
            assert (batch["input_ids"][r, L:] == reader.special_tokens["pad"]).all()
            labels = batch["labels"][r].numpy()
            sel = labels != IGNORE_INDEX
            np.testing.assert_array_equal(labels[sel], s.input_ids[sel[:L].nonzero()[0]])
            keep = ~sel[:L]
            np.testing.assert_array_equal(
                batch["input_ids"][r, :L].numpy()[keep], s.input_ids[keep]
            )
        for k in ("input_ids", "attention_mask", "token_type_ids", "labels"):
            assert str(batch[k].dtype) == "torch.int64"


@pytest.mark.parametrize("shards", ["english_shards", "chinese_shards"])
def test_whole_word_units_of_real_shards_masked_together(shards, request):
    reader = ShardReader(request.getfixturevalue(shards))
    special = set(reader.special_tokens.values())
    loader = build_loader(
        reader,
        DataConfig(num_workers=0),
        MaskingConfig(whole_word=True),
        micro_batch_size=32,
        train=False,
    )
    plans = list(loader.batch_sampler)
    multi_piece_units = selected = maskable = 0
    for plan, batch in zip(plans, loader):
        for r, i in enumerate(plan.indices):
            s = reader[int(i)]
            sel = batch["labels"][r, : len(s.input_ids)].numpy() != IGNORE_INDEX
            unit = -1
            unit_of = np.empty(len(s.input_ids), dtype=np.int64)
            for t, (tok, ws) in enumerate(zip(s.input_ids, s.word_start)):
                unit += bool(ws) or int(tok) in special or unit < 0
                unit_of[t] = unit
            for u in np.unique(unit_of[sel]):
                members = unit_of == u
                assert sel[members].all(), f"unit {u} of sequence {i} partly masked"
                multi_piece_units += int(members.sum() > 1)
            assert not np.isin(s.input_ids[sel], list(special)).any()
            selected += int(sel.sum())
            maskable += int((~np.isin(s.input_ids, list(special))).sum())
    assert multi_piece_units > 10  # words of several pieces really were masked as one
    assert abs(selected / maskable - 0.15) < 0.02


def test_statistics_over_the_corpus_are_tight(english_shards):
    reader = ShardReader(english_shards)
    loader = build_loader(
        reader, DataConfig(num_workers=0), MaskingConfig(), micro_batch_size=128, train=False
    )
    stats = [b["masking_stats"] for b in loader]
    sel = sum(s["selected_tokens"] for s in stats)
    maskable = sum(s["maskable_tokens"] for s in stats)
    assert sum(s["sequences"] for s in stats) == len(reader)
    assert abs(sel / maskable - 0.15) < 0.002  # exact per-sequence counts: only rounding remains
    for key, p in (("mask_tokens", 0.8), ("random_tokens", 0.1), ("kept_tokens", 0.1)):
        frac = sum(s[key] for s in stats) / sel
        assert abs(frac - p) < 4 * math.sqrt(p * (1 - p) / sel), (key, frac)


def test_corrupt_or_foreign_shards_give_a_clear_error(english_shards, tmp_path, capsys):
    bad = tmp_path / "shards"
    shutil.copytree(english_shards, bad)
    tokens = min((bad / "train").glob("*.tokens"))
    # Same size, wrong content (e.g. ids of a larger vocabulary): caught when the batch is built.
    data = np.fromfile(tokens, dtype="<u2")
    data[5] = 60000
    data.tofile(tokens)
    loader = build_loader(
        ShardReader(bad),
        DataConfig(num_workers=0),
        MaskingConfig(),
        micro_batch_size=len(ShardReader(bad)),
        train=False,
    )
    with pytest.raises(
        ValueError, match=r"token id 60000 >= the manifest's vocab_size 2000.*rebuild"
    ):
        next(iter(loader))
    # A truncated file: the reader names it, and the dry run exits with that message.
    with open(tokens, "r+b") as f:
        f.truncate(100)
    with pytest.raises(ShardError, match=tokens.name):
        ShardReader(bad)
    assert dry_run_main(parse_args(["--data", str(bad), "--dry-run"])) == 2
    assert tokens.name in capsys.readouterr().err


@pytest.mark.slow  # runs the trainer, the doctor or DeepSpeed as processes
def test_dry_run_reports_model_shards_and_masking(english_nsp_shards):
    proc = run_cli(
        "pretrain/main.py",
        "--data",
        str(english_nsp_shards),
        "--dry-run",
        "--json",
        "--mask_prob",
        "0.2",
    )
    report = json.loads(proc.stdout)
    m = report["masking"]
    assert abs(m["selected_fraction"] - 0.2) < 0.01
    assert abs(m["mask_token_fraction"] - 0.8) < 0.05
    assert m["mask_token_fraction"] + m["random_fraction"] + m["kept_fraction"] == pytest.approx(1)
    assert report["model"]["architecture"] == "BertForPreTraining"
    assert report["model"]["parameters"] > 0 and report["model"]["flops_per_token"] > 0
    assert report["shards"]["format"] == "nsp" and report["shards"]["vocab_size"] == 2000
    assert report["config"]["masking"]["mask_prob"] == 0.2
    out = io.StringIO()
    again = run_dry_run(
        str(english_nsp_shards),
        PRESETS["tiny"],
        MaskingConfig(mask_prob=0.2),
        DataConfig(),
        micro_batch_size=m["micro_batch_size"],  # the DeepSpeed config's, as the CLI resolved it
        stream=out,
    )
    assert again["masking"] == m  # the same batches and masks in another process
    human = out.getvalue()
    assert "parameters" in human and "selected" in human and "[MASK]" in human


def test_schedule_in_training_and_fixed_masks_in_validation(english_shards):
    cfg = MaskingConfig(mask_prob=0.3, mask_prob_end=0.15, schedule_samples=10**6)
    train = take(
        build_loader(
            ShardReader(english_shards), DataConfig(num_workers=0), cfg, micro_batch_size=64
        ),
        1,
    )[0]["masking_stats"]
    assert train["mask_prob"] == pytest.approx(0.3, abs=1e-4)
    assert abs(train["selected_fraction"] - 0.3) < 0.01
    val = ShardReader(english_shards, split="validation")
    passes = [
        list(build_loader(val, DataConfig(num_workers=0), cfg, micro_batch_size=32, train=False))
        for _ in range(2)
    ]
    for a, b in zip(*passes):
        assert a["labels"].equal(b["labels"]) and a["input_ids"].equal(b["input_ids"])
        assert a["masking_stats"]["mask_prob"] == pytest.approx(0.15)
    sel = sum(b["masking_stats"]["selected_tokens"] for b in passes[0])
    assert abs(sel / sum(b["masking_stats"]["maskable_tokens"] for b in passes[0]) - 0.15) < 0.01


@pytest.mark.parametrize("whole_word", [False, True])
def test_batched_read_gives_the_batches_of_per_sequence_reads(english_shards, whole_word):
    """The loader reads with ShardReader.get_batch; the batch must be what padding the
    per-sequence reads (reader[i]) and masking them gives."""
    from bertforge.pretrain.data.masking import Masker

    reader = ShardReader(english_shards)
    cfg = MaskingConfig(whole_word=whole_word)
    loader = build_loader(
        reader,
        DataConfig(num_workers=0),
        cfg,
        micro_batch_size=24,
        consumed_samples=len(reader) - 5,
    )  # a batch across two epochs
    masker = Masker(cfg, reader.vocab_size, reader.special_tokens)
    for plan, batch in zip(itertools.islice(iter(loader.batch_sampler), 3), take(loader, 3)):
        samples = [reader[int(i)] for i in plan.indices]
        lengths = np.array([len(s.input_ids) for s in samples])
        T = int(-(-lengths.max() // 8) * 8)
        ids = np.full((len(samples), T), reader.special_tokens["pad"], dtype=np.int64)
        ws = np.zeros((len(samples), T), dtype=bool)
        for r, s in enumerate(samples):
            ids[r, : len(s.input_ids)] = s.input_ids
            ws[r, : len(s.input_ids)] = s.word_start
        masked, labels, stats = masker(ids, lengths, ws, plan.indices, plan.epochs, plan.positions)
        np.testing.assert_array_equal(batch["input_ids"].numpy(), masked)
        np.testing.assert_array_equal(batch["labels"].numpy(), labels)
        np.testing.assert_array_equal(
            batch["attention_mask"].numpy(),
            (np.arange(T)[None, :] < lengths[:, None]).astype(np.int64),
        )
        assert batch["masking_stats"] == stats
    assert len(set(plan.epochs.tolist())) == 1 and plan.epochs[0] == 1
