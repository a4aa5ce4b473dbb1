"""The pretraining model (pretrain.model.bert) against transformers' own BERT classes."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from transformers import BertForMaskedLM, BertForPreTraining

from bertforge.pretrain.data.masking import Masker, MaskingConfig
from bertforge.pretrain.model.registry import PRESETS, build_model

VOCAB = 1999  # not a multiple of 8: the model pads to 2000, the loss must ignore the padding
SPECIAL = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}


def masked_batch(n: int = 6, length: int = 40, seed: int = 0, nsp: bool = False) -> dict:
    """A ragged, padded, dynamically masked batch (the loader's layout) of random tokens."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(10, length + 1, size=n)
    lengths[0] = length
    ids = np.zeros((n, length), dtype=np.int64)
    seg_a = rng.integers(3, 9, size=n)
    for i, L in enumerate(lengths):
        ids[i, :L] = rng.integers(5, VOCAB, size=L)
        ids[i, 0], ids[i, L - 1], ids[i, seg_a[i] - 1] = 2, 3, 3
    masked, labels, _ = Masker(MaskingConfig(mask_prob=0.2), VOCAB, SPECIAL)(
        ids, lengths, None, np.arange(n), np.zeros(n, dtype=np.int64), np.arange(n)
    )
    attn = (np.arange(length)[None, :] < lengths[:, None]).astype(np.int64)
    types = ((np.arange(length)[None, :] >= seg_a[:, None]) & (attn > 0)).astype(np.int64)
    batch = {
        "input_ids": torch.from_numpy(masked),
        "attention_mask": torch.from_numpy(attn),
        "token_type_ids": torch.from_numpy(types if nsp else np.zeros_like(types)),
        "labels": torch.from_numpy(labels),
    }
    if nsp:
        batch["next_sentence_label"] = torch.from_numpy(rng.integers(0, 2, size=n))
    return batch


def tiny(nsp: bool = False, **overrides):
    torch.manual_seed(0)
    cfg = dataclasses.replace(PRESETS["tiny"], loss_impl="torch", **overrides)
    return build_model(cfg, VOCAB, nsp=nsp).eval()


def test_vocab_padded_and_heads_tied():
    m = tiny()
    assert m.bert_config.vocab_size == 2000 and m.true_vocab_size == VOCAB
    assert m.cls.predictions.decoder.weight is m.bert.embeddings.word_embeddings.weight
    assert m.config._attn_implementation == "sdpa"


def test_loss_and_gradients_equal_hf_bert_for_masked_lm():
    model = tiny()
    hf = BertForMaskedLM(model.hf_config(unpad_vocab=True)).eval()
    hf.load_state_dict(model.hf_state_dict(unpad_vocab=True), strict=True)
    batch = masked_batch()
    out = model(**batch)
    ref = hf(**batch)  # HF computes logits at every position and averages over labels != -100
    torch.testing.assert_close(out["mlm_loss"], ref.loss, rtol=1e-5, atol=1e-5)
    assert int(out["num_masked"]) == int((batch["labels"] != -100).sum())
    pred = ref.logits[batch["labels"] != -100].argmax(-1)
    assert int(out["num_correct"]) == int((pred == batch["labels"][batch["labels"] != -100]).sum())
    out["loss"].backward()
    ref.loss.backward()
    ours = dict(model.named_parameters())
    for name, p in hf.named_parameters():
        g = ours[name].grad
        g = g[:VOCAB] if g.shape[0] == 2000 else g
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-6, msg=name)
    # The padding rows never receive gradient.
    assert ours["bert.embeddings.word_embeddings.weight"].grad[VOCAB:].abs().sum() == 0


def test_padding_columns_take_no_part_in_the_softmax():
    model = tiny()
    batch = masked_batch(seed=1)
    before = model(**batch)
    with torch.no_grad():
        model.cls.predictions.bias[VOCAB:] = 1e4  # would win every argmax and dominate the softmax
    after = model(**batch)
    torch.testing.assert_close(after["mlm_loss"], before["mlm_loss"])
    assert int(after["num_correct"]) == int(before["num_correct"])


def test_state_dict_round_trip_into_bert_for_pretraining_with_identical_logits():
    model = tiny(nsp=True)
    batch = masked_batch(seed=2, nsp=True)
    sel = batch["labels"] != -100
    for unpad in (False, True):
        hf = BertForPreTraining(model.hf_config(unpad_vocab=unpad)).eval()
        result = hf.load_state_dict(model.hf_state_dict(unpad_vocab=unpad), strict=True)
        assert not result.missing_keys and not result.unexpected_keys
        ref = hf(**{k: v for k, v in batch.items() if k != "labels"})
        ours = model.predict_masked(
            batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], batch["labels"]
        )
        torch.testing.assert_close(
            ours, ref.prediction_logits[sel][:, :VOCAB], rtol=1e-5, atol=1e-5
        )
    # Total loss (MLM mean + NSP mean) equals HF's.
    out = model(**batch)
    ref = hf(**batch)
    torch.testing.assert_close(out["loss"], ref.loss, rtol=1e-5, atol=1e-5)
    nsp_pred = ref.seq_relationship_logits.argmax(-1)
    assert int(out["nsp_correct"]) == int((nsp_pred == batch["next_sentence_label"]).sum())
    assert int(out["nsp_count"]) == len(batch["input_ids"])


def test_mlm_only_model_loads_strictly_into_bert_for_masked_lm_not_pretraining():
    model = tiny(nsp=False)
    assert model.hf_architecture == "BertForMaskedLM"
    BertForMaskedLM(model.hf_config()).load_state_dict(model.hf_state_dict(), strict=True)
    missing = (
        BertForPreTraining(model.hf_config())
        .load_state_dict(model.hf_state_dict(), strict=False)
        .missing_keys
    )
    assert sorted(missing) == [
        "bert.pooler.dense.bias",
        "bert.pooler.dense.weight",
        "cls.seq_relationship.bias",
        "cls.seq_relationship.weight",
    ]


def test_global_normalizer_and_empty_batch():
    model = tiny()
    batch = masked_batch(seed=3)
    n = int((batch["labels"] != -100).sum())
    plain = model(**batch)["mlm_loss"]
    scaled = model(**batch, mlm_normalizer=4.0 * n)["mlm_loss"]
    torch.testing.assert_close(scaled, plain / 4)
    batch["labels"][:] = -100  # a micro-batch without masked tokens: loss 0, gradients 0
    model.train()
    out = model(**batch)
    out["loss"].backward()
    assert float(out["loss"].detach()) == 0.0 and int(out["num_masked"]) == 0
    assert all(p.grad is None or not p.grad.abs().sum() for p in model.cls.parameters())


def checkpointing_grads(mode: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss and gradients of the tiny model (no dropout) with activation checkpointing `mode`."""
    batch = masked_batch(seed=4)
    model = tiny(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).train()
    model.set_activation_checkpointing(mode)
    out = model(**batch)
    out["loss"].backward()
    return out["loss"].detach(), {k: p.grad.clone() for k, p in model.named_parameters()}


def assert_same(a, b) -> None:
    torch.testing.assert_close(a[0], b[0])
    for k in a[1]:
        torch.testing.assert_close(a[1][k], b[1][k], rtol=1e-5, atol=1e-7, msg=k)


def test_torch_activation_checkpointing_keeps_loss_and_gradients():
    assert_same(checkpointing_grads("torch"), checkpointing_grads("none"))
    model = tiny()
    model.set_activation_checkpointing("torch")
    assert all(layer.gradient_checkpointing for layer in model.bert.encoder.layer)
    model.set_activation_checkpointing("none")
    assert not any(layer.gradient_checkpointing for layer in model.bert.encoder.layer)
    with pytest.raises(ValueError, match="activation checkpointing"):
        tiny().set_activation_checkpointing("always")


# DeepSpeed's checkpoint function needs deepspeed.init_distributed + checkpointing.configure (the
# trainer's job): run it in its own process so no process group leaks into the test session.
_DS_SCRIPT = """
import os, socket
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                  MASTER_PORT=str(port))
import deepspeed
deepspeed.init_distributed(dist_backend="gloo")
deepspeed.checkpointing.configure(None, deepspeed_config={{
    "train_batch_size": 1, "activation_checkpointing": {{"partition_activations": False}}}})
calls = []
original = deepspeed.checkpointing.checkpoint
def counting(*args, **kwargs):
    calls.append(1)
    return original(*args, **kwargs)
deepspeed.checkpointing.checkpoint = counting
import {module} as t
t.assert_same(t.checkpointing_grads("deepspeed"), t.checkpointing_grads("none"))
assert len(calls) == 2, calls  # one call per encoder layer
print("SAME")
"""


@pytest.mark.slow  # runs the trainer, the doctor or DeepSpeed as processes
def test_deepspeed_activation_checkpointing_keeps_loss_and_gradients():
    import os
    import subprocess
    import sys
    from pathlib import Path

    from helpers.commands import REPO

    here = Path(__file__).resolve()
    # the child imports this test module by name: its folder, tests/ (helpers) and the repository
    path = [str(REPO), str(REPO / "tests"), str(here.parent), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    proc = subprocess.run(
        [sys.executable, "-c", _DS_SCRIPT.format(module=here.stem)],
        capture_output=True, text=True, timeout=300, check=False, env=env,
    )  # fmt: skip
    assert proc.returncode == 0 and "SAME" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]


def test_flops_per_token_counts_the_encoder_matmuls():
    model = tiny()
    linears = [m for m in model.bert.encoder.modules() if isinstance(m, torch.nn.Linear)]
    dense = sum(m.weight.numel() for m in linears)
    c = model.config
    for T in (128, 512):
        expected = 6 * dense + 12 * c.num_hidden_layers * T * c.hidden_size
        assert model.flops_per_token(T, masked_fraction=0.0) == pytest.approx(expected)
    head = 6 * (c.hidden_size**2 + c.hidden_size * VOCAB)
    assert model.flops_per_token(128, 0.15) - model.flops_per_token(128, 0.0) == pytest.approx(
        0.15 * head
    )


def test_config_json_sets_the_architecture_and_checks_the_vocab(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "hidden_size": 64,
                "num_hidden_layers": 1,
                "num_attention_heads": 4,
                "intermediate_size": 96,
                "vocab_size": VOCAB,
            }
        )
    )
    m = build_model(dataclasses.replace(PRESETS["tiny"], config_json=str(path)), VOCAB)
    assert (m.config.hidden_size, m.config.num_hidden_layers, m.config.intermediate_size) == (
        64,
        1,
        96,
    )
    path.write_text(json.dumps({"hidden_size": 64, "vocab_size": 30522}))
    with pytest.raises(ValueError, match=r"config\.json: vocab_size 30522 .*\(1999"):
        build_model(dataclasses.replace(PRESETS["tiny"], config_json=str(path)), VOCAB)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        build_model(dataclasses.replace(PRESETS["tiny"], config_json=str(path)), VOCAB)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        build_model(PRESETS["tiny"], VOCAB, max_seq_len=1024)
