"""--share_layers with --arch modernbert (pretrain.model.sharing): layer 0 has no attn_norm, so
a group's attn_norm is held by its next layer; every layer keeps its own attention type.

Against an unrolled twin (the same weights copied into independent layers): loss and the
gradient of each shared weight (the sum over its users), with and without torch activation
checkpointing; the export's state dict loads strictly into transformers' ModernBertForMaskedLM
and gives our logits; a state dict whose shared copies differ is refused; the dry run and the
doctor count shared weights once.
"""

from __future__ import annotations

import dataclasses
import io

import pytest
import torch
from test_bert import VOCAB, masked_batch
from test_modernbert import hf_twin

from bertforge.pretrain.model.registry import PRESETS, build_model
from bertforge.pretrain.model.sharing import layer_groups

FOUR = dataclasses.replace(
    PRESETS["modernbert-tiny"], num_hidden_layers=4, local_attention=8, loss_impl="torch"
)  # layer types: global, local, local, global


def build(spec: str):
    torch.manual_seed(0)
    return build_model(dataclasses.replace(FOUR, share_layers=spec), VOCAB)


def layer_numel(model, i: int) -> int:
    return sum(p.numel() for p in model.model.layers[i].parameters())


@pytest.mark.parametrize("spec", ["all", "groups:2"])
def test_layers_share_one_set_and_the_attn_norm_layer_0_lacks(spec):
    model, groups = build(spec), layer_groups(spec, 4)
    layers = model.model.layers
    assert isinstance(layers[0].attn_norm, torch.nn.Identity)
    for i, src in enumerate(groups):
        assert layers[i].attn.Wqkv.weight is layers[src].attn.Wqkv.weight
        assert layers[i].mlp.Wo.weight is layers[src].mlp.Wo.weight
        assert layers[i].mlp_norm.weight is layers[src].mlp_norm.weight
    # The norm layer 0 lacks is the next member's: all -> layers 1-3 share layer 1's.
    owner = {"all": [None, 1, 1, 1], "groups:2": [None, 1, 2, 2]}[spec]
    for i in (1, 2, 3):
        assert layers[i].attn_norm.weight is layers[owner[i]].attn_norm.weight
    # Each layer keeps its own attention type (global layers 0 and 3, sliding 1 and 2).
    assert [layer.attention_type for layer in layers] == list(model.config.layer_types)
    assert model.config.layer_types[0] != model.config.layer_types[1]
    none = build("none")
    # Distinct: layer 0's weights (no attn_norm) + one attn_norm per group (hidden 128 each).
    distinct = {"all": layer_numel(none, 0) + 128, "groups:2": 2 * (layer_numel(none, 0) + 128)}
    saved = sum(layer_numel(none, i) for i in range(4)) - distinct[spec]
    assert sum(p.numel() for p in none.parameters()) - model.num_parameters() == saved
    assert model.state_dict().keys() == none.state_dict().keys()  # every layer's name


@pytest.mark.parametrize("checkpointing", ["none", "torch"])
def test_loss_and_gradients_equal_the_unrolled_model(checkpointing):
    shared = build("all").train()
    unrolled = build("none").train()
    unrolled.load_state_dict(shared.state_dict())
    shared.set_activation_checkpointing(checkpointing)
    batch = masked_batch()
    loss_s, loss_u = shared(**batch)["loss"], unrolled(**batch)["loss"]
    torch.testing.assert_close(loss_s, loss_u)
    loss_s.backward()
    loss_u.backward()
    grads_u = {n: p.grad for n, p in unrolled.named_parameters()}
    users: dict[str, list[str]] = {}  # the shared weight's first name -> every name it has
    for key in shared.state_dict():
        users.setdefault(key, [key])
    for s in shared.shared_keys:
        users[s.owner].append(s.key)
        users.pop(s.key, None)
    for name, p in shared.named_parameters():
        expected = sum(grads_u[k] for k in users[name])
        torch.testing.assert_close(p.grad, expected, atol=1e-6, rtol=1e-5, msg=name)


def test_export_loads_into_transformers_and_predicts_as_ours():
    shared = build("groups:2")
    with torch.no_grad():  # not the init values: every shared copy must reach the export
        for p in shared.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    hf = hf_twin(shared)  # strict load of every layer's weights
    layers = hf.model.layers
    assert layers[1].attn.Wqkv.weight is not layers[0].attn.Wqkv.weight  # copies in the folder
    torch.testing.assert_close(layers[1].attn.Wqkv.weight, layers[0].attn.Wqkv.weight)
    torch.testing.assert_close(layers[3].attn_norm.weight, layers[2].attn_norm.weight)
    batch = masked_batch(seed=3)
    sel = batch["labels"] != -100
    ours = shared.predict_masked(batch["input_ids"], batch["attention_mask"], None, batch["labels"])
    with torch.no_grad():
        ref = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    torch.testing.assert_close(ours, ref[sel], rtol=1e-5, atol=1e-5)


def test_state_dicts_whose_shared_copies_differ_are_refused():
    shared = build("all")
    with pytest.raises(ValueError, match="shares layer 1's weights with layer 0"):
        shared.load_state_dict(build("none").state_dict())  # an unshared checkpoint
    sd = shared.state_dict()
    sd = {k: v.clone() for k, v in sd.items()}
    sd["model.layers.3.attn_norm.weight"] += 1.0  # only the norm that layer 0 lacks
    problem = shared.shared_copies_disagree(sd)
    assert "model.layers.3.attn_norm.weight differs from model.layers.1.attn_norm.weight" in problem
    assert "--share_layers" in problem
    assert shared.shared_copies_disagree(shared.state_dict()) is None


def test_dry_run_and_memory_estimate_count_shared_weights_once(english_shards):
    from bertforge.pretrain.data.loader import DataConfig
    from bertforge.pretrain.data.masking import MaskingConfig
    from bertforge.pretrain.doctor.memory_estimate import count_params
    from bertforge.pretrain.dry_run import run_dry_run

    cfg = dataclasses.replace(FOUR, share_layers="all")
    n_none, _ = count_params(FOUR, VOCAB, False)
    n_all, _ = count_params(cfg, VOCAB, False)
    assert n_all == build("all").num_parameters() < n_none
    out = io.StringIO()
    report = run_dry_run(
        str(english_shards), cfg, MaskingConfig(), DataConfig(), num_batches=1,
        micro_batch_size=2, stream=out,
    )  # fmt: skip
    assert report["model"]["architecture"] == "ModernBertForMaskedLM"
    assert report["model"]["parameters"] == count_params(cfg, 2000, False)[0]
    assert "layers 4 (weights shared: all)" in out.getvalue()


def test_export_loads_an_ema_that_names_each_shared_weight_once(tmp_path):
    """The EMA (--ema) keeps each Parameter once (named_parameters), so a --share_layers run's
    ema.safetensors lacks the later layers' names; export's load accounts for them (it refused
    the EMA of every shared run before) and still refuses a checkpoint that lacks a weight."""
    from bertforge.pretrain.components.ema import ema_step
    from bertforge.pretrain.export.hf_export import load_weights
    from bertforge.pretrain.run_folder.run_checkpoints import CheckpointError

    trained = build("groups:2")
    shadow = ema_step(None, dict(trained.named_parameters()), 0.9)
    assert "model.layers.1.attn.Wqkv.weight" not in shadow  # layer 0's, named once
    fresh = build("groups:2")
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    load_weights(fresh, shadow, tmp_path)
    for key, value in trained.hf_state_dict().items():  # every layer's name, as exported
        torch.testing.assert_close(fresh.hf_state_dict()[key], value, msg=key)
    del shadow["model.layers.2.attn.Wqkv.weight"]  # a group's first layer: really missing
    with pytest.raises(CheckpointError, match=r"missing \['model.layers.2.attn.Wqkv.weight'"):
        load_weights(build("groups:2"), shadow, tmp_path)
