"""--arch modernbert (pretrain.model.modernbert) against transformers' own ModernBertForMaskedLM,
its presets in the dry run and the memory estimate, and what the arch refuses."""

from __future__ import annotations

import dataclasses
import io

import pytest
import torch
from helpers.commands import REPO
from test_bert import VOCAB, masked_batch
from transformers import ModernBertForMaskedLM

from bertforge.pretrain.model.attention_paths import ATTN_IMPLEMENTATION
from bertforge.pretrain.model.registry import PRESETS, ArchError, build_model, check_supported
from bertforge.pretrain.model.specs import MLM_NSP

PADDED = 2048  # VOCAB 1999 padded to a multiple of 64


def tiny(**overrides):
    """modernbert-tiny with a window shorter than the batch's 40 tokens, so that the local
    layers really attend through it."""
    torch.manual_seed(0)
    fields = {"loss_impl": "torch", "local_attention": 8, **overrides}
    cfg = dataclasses.replace(PRESETS["modernbert-tiny"], **fields)
    return build_model(cfg, VOCAB).eval()


def hf_twin(model) -> ModernBertForMaskedLM:
    """transformers' ModernBertForMaskedLM holding `model`'s weights (vocabulary unpadded)."""
    hf = ModernBertForMaskedLM(model.hf_config(unpad_vocab=True)).eval()
    hf.load_state_dict(model.hf_state_dict(unpad_vocab=True), strict=True)
    hf.tie_weights()
    return hf


def test_the_modern_block_as_transformers_defines_it():
    model = tiny()
    c = model.config
    assert model.hf_architecture == "ModernBertForMaskedLM" and model.arch == "modernbert"
    assert c.vocab_size == PADDED and model.true_vocab_size == VOCAB
    assert model.decoder.weight is model.model.embeddings.tok_embeddings.weight  # tied
    assert c.layer_types == ["full_attention", "sliding_attention", "sliding_attention"]
    assert c.rope_parameters["full_attention"]["rope_theta"] == 160000.0
    assert c.rope_parameters["sliding_attention"]["rope_theta"] == 10000.0
    assert c.local_attention == 8 and c._attn_implementation == ATTN_IMPLEMENTATION
    assert "_attn_implementation" not in model.hf_config().to_dict()  # exports load as SDPA
    # No biases but the decoder's (as in the released models); GeGLU doubles Wi.
    biases = [n for n, _ in model.named_parameters() if n.endswith("bias")]
    assert biases == ["decoder.bias"]
    assert model.model.layers[0].mlp.Wi.weight.shape == (2 * c.intermediate_size, c.hidden_size)


def test_loss_logits_and_gradients_equal_transformers_modernbert():
    model = tiny()
    hf = hf_twin(model)
    batch = masked_batch()  # ragged and padded: the attention mask matters
    sel = batch["labels"] != -100
    out = model(**batch)
    ref = hf(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        labels=batch["labels"],
    )
    torch.testing.assert_close(out["mlm_loss"], ref.loss, rtol=1e-5, atol=1e-6)
    assert int(out["num_masked"]) == int(sel.sum())
    pred = ref.logits[sel].argmax(-1)
    assert int(out["num_correct"]) == int((pred == batch["labels"][sel]).sum())
    ours = model.predict_masked(batch["input_ids"], batch["attention_mask"], None, batch["labels"])
    torch.testing.assert_close(ours, ref.logits[sel], rtol=1e-5, atol=1e-5)
    out["loss"].backward()
    ref.loss.backward()
    mine = dict(model.named_parameters())
    for name, p in hf.named_parameters():
        g = mine[name].grad
        g = g[:VOCAB] if g.shape[0] == PADDED else g
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-6, msg=name)
    assert mine["model.embeddings.tok_embeddings.weight"].grad[VOCAB:].abs().sum() == 0


def test_sliding_window_changes_what_local_layers_see():
    batch = masked_batch(seed=4)
    states = [
        tiny(local_attention=w).model(batch["input_ids"], batch["attention_mask"]).last_hidden_state
        for w in (8, 128)  # 128 covers all 40 tokens
    ]
    assert (states[0] - states[1]).abs().max() > 1e-2


def test_raising_the_global_rope_theta_equals_a_model_built_with_it():
    """A phase's rope_theta re-bases the global layers only: the re-based model's hidden states
    equal those of transformers' ModernBertModel built with that theta and the same weights."""
    batch = masked_batch(seed=5)
    ours = tiny(global_rope_theta=10000.0)
    before = ours.model(batch["input_ids"], batch["attention_mask"]).last_hidden_state
    ours.set_global_rope_theta(160000.0)
    got = ours.model(batch["input_ids"], batch["attention_mask"]).last_hidden_state
    ref = hf_twin(tiny(global_rope_theta=160000.0))  # built at 160k ...
    ref.load_state_dict(hf_twin(ours).state_dict())  # ... holding the same weights
    want = ref.model(batch["input_ids"], batch["attention_mask"]).last_hidden_state
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert (got - before).abs().max() > 1e-4  # the global layers see 40 positions differently
    assert ours.hf_config().rope_parameters["sliding_attention"]["rope_theta"] == 10000.0


@pytest.mark.parametrize(
    ("changes", "flag"),
    [
        ({"config_json": "bert_config.json"}, "--config_json"),
        ({"objective": MLM_NSP}, "NSP shards"),
    ],
)
def test_bert_only_features_are_refused_naming_the_flag(changes, flag):
    fields = {k: v for k, v in changes.items() if k == "config_json"}
    inputs = {k: v for k, v in changes.items() if k not in fields}
    cfg = dataclasses.replace(PRESETS["modernbert-tiny"], **fields)
    with pytest.raises(ArchError, match=flag):
        check_supported(cfg, **inputs)
    check_supported(dataclasses.replace(cfg, arch="bert"), **inputs)  # bert: nothing refused
    if not inputs or "objective" in inputs:  # the model itself refuses them too
        with pytest.raises(ArchError, match=flag):
            build_model(cfg, VOCAB, objective=inputs.get("objective"))


REFUSED = {  # what a modernbert launch cannot train: (flags, what the message names)
    "nsp": ([], ["NSP shards", "--format nsp"]),
    "config_json": (["--config_json", "bert_config.json"], ["--config_json bert_config.json"]),
    "zero3_deepspeed_sharing": (
        ["--ds_config", str(REPO / "ds_configs" / "zero3_bf16.json"), "--share_layers", "all",
         "--activation_checkpointing", "deepspeed"],
        ["--share_layers all", "--activation_checkpointing deepspeed", "ZeRO-3",
         "--activation_checkpointing torch"],
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_the_trainer_refuses_what_modernbert_cannot_train(
    case, english_shards, english_nsp_shards, capsys
):
    """Exit status 2 from the checks the launch runs before any rendezvous (the dry run runs
    the same ones), the message naming the flags and what to do."""
    from bertforge.errors import USER_ERROR_EXIT
    from bertforge.pretrain.main import main

    flags, named = REFUSED[case]
    shards = english_nsp_shards if case == "nsp" else english_shards
    code = main(["--data", str(shards), "--arch", "modernbert", *flags, "--dry-run"])
    err = capsys.readouterr().err
    assert code == USER_ERROR_EXIT, err[-2000:]
    assert all(words in err for words in named), err[-2000:]


def test_sharing_trains_under_zero2_or_torch_checkpointing():
    from bertforge.pretrain.model.registry import check_engine

    shared = dataclasses.replace(PRESETS["modernbert-tiny"], share_layers="all")
    for stage, mode in ((2, "deepspeed"), (3, "torch"), (3, "none")):
        check_engine(shared, stage, mode)
    check_engine(dataclasses.replace(shared, share_layers="none"), 3, "deepspeed")
    check_engine(dataclasses.replace(shared, arch="bert"), 3, "deepspeed")  # BERT trains


def test_command_line_arch_and_preset(english_shards):
    from bertforge.errors import USER_ERROR_EXIT
    from bertforge.pretrain.config.cli import parse_args

    data = ["--data", str(english_shards)]
    assert parse_args([*data, "--arch", "modernbert"]).model_cfg.name == "modernbert-tiny"
    cfg = parse_args([*data, "--model", "modernbert-base"])
    assert cfg.model_cfg.arch == "modernbert" and cfg.model_cfg.num_hidden_layers == 22
    assert parse_args(data).model_cfg.arch == "bert"  # the default stays BERT
    with pytest.raises(SystemExit) as e:  # a preset of the other arch: argparse, status 2
        parse_args([*data, "--arch", "bert", "--model", "modernbert-base"])
    assert e.value.code == USER_ERROR_EXIT


def test_dry_run_and_memory_estimate_know_the_presets(english_shards):
    from bertforge.pretrain.data.loader import DataConfig
    from bertforge.pretrain.data.masking import MaskingConfig
    from bertforge.pretrain.doctor.memory_estimate import count_params
    from bertforge.pretrain.dry_run import run_dry_run

    out = io.StringIO()
    report = run_dry_run(
        str(english_shards),
        PRESETS["modernbert-tiny"],
        MaskingConfig(),
        DataConfig(),
        num_batches=1,
        micro_batch_size=2,
        stream=out,
    )
    assert report["model"]["architecture"] == "ModernBertForMaskedLM"
    assert report["model"]["padded_vocab_size"] == 2048 and report["model"]["flops_per_token"] > 0
    assert "modernbert-tiny: ModernBertForMaskedLM" in out.getvalue()
    assert "global every 3 layers, the others a window of 128 tokens" in out.getvalue()
    # The published sizes with ModernBERT's own 50,280-token vocabulary (padded to 50,368).
    base, _ = count_params("modernbert-base", 50280, nsp=False)
    large, _ = count_params("modernbert-large", 50280, nsp=False)
    assert round(base / 1e6) == 150 and round(large / 1e6) == 396


def test_torch_activation_checkpointing_keeps_the_gradients():
    batch = masked_batch(seed=5)
    grads = []
    for mode in ("none", "torch"):
        model = tiny().train()  # no dropout in the preset: both passes compute the same
        model.set_activation_checkpointing(mode)
        model(**batch)["loss"].backward()
        grads.append(model.model.layers[1].mlp.Wi.weight.grad)
    assert model.checkpointing == "torch" and model.model.gradient_checkpointing
    torch.testing.assert_close(grads[0], grads[1])
