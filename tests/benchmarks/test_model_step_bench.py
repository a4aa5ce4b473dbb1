"""benchmarks.training.model_step: each dropout rate gets a pair of models with the same weights
(ours and transformers' BertForMaskedLM agree on the loss), and the command prints a row per rate.
"""

from __future__ import annotations

import contextlib
import io

import pytest
import torch

from benchmarks.training import model_step
from bertforge.pretrain.model.registry import PRESETS


@pytest.mark.parametrize("dropout", [0.1, 0.0])
def test_a_pair_is_the_same_model_with_the_rate_given(dropout):
    pair = model_step.model_pair(PRESETS["tiny"], dropout, 1000, torch.float32)
    assert pair["hf"].config.hidden_dropout_prob == dropout
    assert pair["hf"].config.attention_probs_dropout_prob == dropout
    assert pair["ours"].training and pair["hf"].training
    torch.manual_seed(1)
    ids = torch.randint(5, 1000, (2, 16))
    labels = torch.full_like(ids, -100)
    labels[:, 3:9] = ids[:, 3:9]
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    with torch.no_grad():
        losses = [float(pair[side].eval()(**batch)["loss"]) for side in ("ours", "hf")]
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


def test_the_command_prints_a_row_per_dropout_rate():
    printed = io.StringIO()
    args = ["--models", "tiny", "--batch", "2", "--seq_len", "16", "--vocab_size", "1000"]
    args += ["--steps", "1", "--dropout", "0.1", "0", "--precision", "bf16-autocast"]
    with contextlib.redirect_stdout(printed):
        assert model_step.main(args) == 0
    rows = [line.split() for line in printed.getvalue().splitlines() if line.startswith("tiny ")]
    assert [row[1] for row in rows] == ["0.1", "0"]


def test_the_flop_count_agrees_with_the_models_own_formula(tmp_path):
    """torch's FlopCounterMode (an independent count) against each model's flops_per_token:
    ours runs the head on the masked rows, HF on every row, so HF's step costs more by the
    head's share; the count matches the formula up to the ops it leaves out (norms, softmax)."""
    from transformers import DataCollatorForLanguageModeling

    torch.manual_seed(0)
    pair = model_step.model_pair(PRESETS["tiny"], 0.0, 1000, torch.float32)
    tok = model_step.bert_tokenizer(1000, tmp_path)
    seqs = torch.randint(104, 1000, (4, 32)).tolist()
    collate = DataCollatorForLanguageModeling(tok, mlm_probability=0.15)
    batch = collate([{"input_ids": s} for s in seqs])
    batch["attention_mask"] = torch.ones_like(batch["input_ids"])
    masked = float((batch["labels"] != -100).float().mean())
    with contextlib.redirect_stdout(io.StringIO()):
        counted = model_step.report_flops("tiny", pair, batch, contextlib.nullcontext(), 128)
    ours = pair["ours"]
    expected = {"ours": ours.flops_per_token(32, masked), "hf": ours.flops_per_token(32, 1.0)}
    for side in ("ours", "hf"):
        assert counted[side] == pytest.approx(128 * expected[side], rel=0.05)
    assert counted["ratio"] == pytest.approx(expected["hf"] / expected["ours"], rel=0.05)
    assert counted["ratio"] > 1.2


def test_a_folder_gives_its_shape_and_must_match_the_vocabulary(tmp_path):
    import json

    from transformers import BertConfig

    shape = dict(hidden_size=96, num_hidden_layers=3, num_attention_heads=4, intermediate_size=192)
    BertConfig(vocab_size=1000, **shape).save_pretrained(tmp_path)
    cfg = model_step.model_shape(str(tmp_path), 1000)
    assert {k: getattr(cfg, k) for k in shape} == shape
    with pytest.raises(SystemExit, match="pass --vocab_size 1000"):
        model_step.model_shape(str(tmp_path), 30522)
    assert json.loads((tmp_path / "config.json").read_text())["vocab_size"] == 1000
