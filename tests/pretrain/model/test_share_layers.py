"""Cross-layer parameter sharing (``--share_layers``, ALBERT-style).

In-process: one Parameter per shared set, gradients equal to the sum over the layers that use it
(against a hand-unrolled model: the same weights copied into independent layers), with and without
torch activation checkpointing; checkpoint bytes; refusal of unshared weights; the doctor's
memory estimate. Through the trainer (one rank each, DeepSpeed activation checkpointing on):
ZeRO-3 matches ZeRO-2, exact resume, and the exported HF folder predicts what the trained model
predicts.
"""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers.launch import ds_config, launch

from bertforge.kernels.constants import IGNORE_INDEX
from bertforge.pretrain.components.metrics import read_metrics
from bertforge.pretrain.model.bert import ModelConfig
from bertforge.pretrain.model.registry import build_model, preset
from bertforge.pretrain.model.sharing import layer_groups
from bertforge.pretrain.run_folder.run_checkpoints import tag_for

VOCAB = 300
TINY4 = dataclasses.replace(
    preset("tiny"), num_hidden_layers=4, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
)


def _batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (3, 16), generator=g)
    labels = torch.full_like(ids, IGNORE_INDEX)
    pick = torch.rand(ids.shape, generator=g) < 0.3
    labels[pick] = ids[pick]
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def test_layer_groups_and_bad_specs():
    assert layer_groups("none", 4) == [0, 1, 2, 3]
    assert layer_groups("all", 4) == [0, 0, 0, 0]
    assert layer_groups("groups:2", 8) == [0, 0, 0, 0, 4, 4, 4, 4]
    for bad in ("groups:3", "groups:0", "groups:x", "some"):
        with pytest.raises(ValueError, match="--share_layers"):
            layer_groups(bad, 4)


@pytest.mark.parametrize("checkpointing", ["none", "torch"])
@pytest.mark.parametrize("spec", ["all", "groups:2"])
def test_shared_weights_are_one_tensor_and_gradients_sum_over_layers(spec, checkpointing):
    torch.manual_seed(0)
    shared = build_model(dataclasses.replace(TINY4, share_layers=spec), VOCAB)
    groups = layer_groups(spec, 4)
    layers = shared.bert.encoder.layer
    for i, src in enumerate(groups):
        for (name, p), (_, q) in zip(layers[i].named_parameters(), layers[src].named_parameters()):
            assert p is q, name
    unrolled = build_model(TINY4, VOCAB)  # the same weights, copied into independent layers
    unrolled.load_state_dict(shared.state_dict())
    assert len(set(groups)) * sum(p.numel() for p in layers[0].parameters()) == sum(
        p.numel() for p in layers.parameters()
    )
    shared.train()
    unrolled.train()
    shared.set_activation_checkpointing(checkpointing)
    batch = _batch()
    loss_s = shared(**batch)["loss"]
    loss_u = unrolled(**batch)["loss"]
    loss_s.backward()
    loss_u.backward()
    torch.testing.assert_close(loss_s, loss_u)
    grads_u = {n: p.grad for n, p in unrolled.named_parameters()}
    for name, p in shared.named_parameters():  # each shared weight under its group's first name
        if not name.startswith("bert.encoder.layer."):
            torch.testing.assert_close(p.grad, grads_u[name], atol=1e-6, rtol=1e-5)
            continue
        first, rest = int(name.split(".")[3]), name.split(".", 4)[4]
        users = [i for i, src in enumerate(groups) if src == first]
        expected = sum(grads_u[f"bert.encoder.layer.{i}.{rest}"] for i in users)
        torch.testing.assert_close(p.grad, expected, atol=1e-6, rtol=1e-5)


def _saved_bytes(model: torch.nn.Module) -> int:
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return buf.tell()


def test_state_dict_names_every_layer_but_stores_shared_weights_once():
    none = build_model(TINY4, VOCAB)
    shared = build_model(dataclasses.replace(TINY4, share_layers="all"), VOCAB)
    assert shared.state_dict().keys() == none.state_dict().keys()  # HF names for every layer
    distinct = sum(p.numel() for p in shared.parameters())
    layer = sum(p.numel() for p in shared.bert.encoder.layer[0].parameters())
    assert sum(p.numel() for p in none.parameters()) - distinct == 3 * layer
    size = _saved_bytes(shared)
    assert 4 * distinct <= size < 4 * distinct * 1.05  # fp32 bytes of the distinct weights
    assert size < 0.6 * _saved_bytes(none)


def test_loading_unshared_weights_into_a_shared_model_is_refused():
    shared = build_model(dataclasses.replace(TINY4, share_layers="groups:2"), VOCAB)
    with pytest.raises(ValueError, match="shares layer 1's weights with layer 0"):
        shared.load_state_dict(build_model(TINY4, VOCAB).state_dict())


def test_memory_estimate_counts_shared_weights_once(tmp_path):
    from bertforge.pretrain.doctor.memory_estimate import count_params, estimate_memory, model_shape

    cfg8 = dataclasses.replace(preset("small"), num_hidden_layers=8)
    n_none, _ = count_params(cfg8, 30522, False)
    assert n_none == count_params("small", 30522, False)[0] + 4 * _layer_numel(cfg8)
    for spec, distinct_layers in (("all", 1), ("groups:2", 2)):
        n, _ = count_params(dataclasses.replace(cfg8, share_layers=spec), 30522, False)
        assert n == n_none - (8 - distinct_layers) * _layer_numel(cfg8)
    shape = model_shape(dataclasses.replace(cfg8, share_layers="all"), tmp_path, 128, False)
    assert shape.layers == 8  # shared layers still compute (and keep activations) per layer
    ds = {"zero_optimization": {"stage": 2}}
    est = estimate_memory(shape, ds, world=1, micro_batch=8, on_gpu=False)
    assert est.params == 4 * shape.params and est.optimizer == 12 * shape.params


def _layer_numel(cfg: ModelConfig) -> int:
    """Parameters of one encoder layer, counted from transformers' own BertLayer."""
    from transformers.models.bert.modeling_bert import BertLayer

    from bertforge.pretrain.model.bert import bert_config

    with torch.device("meta"):
        return sum(p.numel() for p in BertLayer(bert_config(cfg, 100)).parameters())


# --- through the trainer: one rank, DeepSpeed activation checkpointing, --share_layers all ---

TRAIN = [
    "--model",
    "tiny",
    "--num_hidden_layers",
    "4",
    "--share_layers",
    "all",
    "--num_workers",
    "0",
    "--progress",
    "false",
    "--global_batch_size",
    "8",
    "--micro_batch_size",
    "4",
    "--lr",
    "1e-3",
    "--warmup_steps",
    "1",
    "--max_steps",
    "4",
    "--save_interval",
    "2",
    "--eval_batches",
    "2",
    "--keep_last",
    "5",
]


def _ds_config(tmp: Path, stage: int) -> Path:
    zero = {"stage": stage, "overlap_comm": False}
    if stage == 3:
        zero["stage3_param_persistence_threshold"] = 0  # every weight partitioned and gathered
    act = {
        "enabled": True,
        "partition_activations": False,
        "cpu_checkpointing": False,
        "contiguous_memory_optimization": False,
        "number_checkpoints": None,
        "synchronize_checkpoint_boundary": False,
        "profile": False,
    }
    return ds_config(tmp, f"zero{stage}.json", zero_optimization=zero, activation_checkpointing=act)


@pytest.fixture(scope="module")
def shared_runs(english_shards, tmp_path_factory) -> dict[int, Path]:
    tmp = tmp_path_factory.mktemp("share_layers")
    runs = {}
    for stage in (2, 3):
        runs[stage] = tmp / f"zero{stage}"
        launch(
            [
                "--ds_config",
                str(_ds_config(tmp, stage)),
                "--data",
                str(english_shards),
                "--output_dir",
                str(runs[stage]),
            ]
            + TRAIN,
            nproc=1,
        )
    return runs


def _losses(run: Path, split: str = "train") -> dict[int, float]:
    key = "loss" if split == "train" else "val_loss"
    return {r["step"]: r[key] for r in read_metrics(run / "metrics.jsonl", split)}


@pytest.mark.slow
def test_zero3_matches_zero2_with_shared_layers(shared_runs):
    config = json.loads((shared_runs[3] / "config.json").read_text())
    assert config["activation_checkpointing"] == "deepspeed"
    assert config["model_cfg"]["share_layers"] == "all"
    z2, z3 = _losses(shared_runs[2]), _losses(shared_runs[3])
    assert sorted(z3) == [1, 2, 3, 4]
    for step in z2:
        assert z3[step] == pytest.approx(z2[step], abs=1e-5), (z2, z3)
    assert _losses(shared_runs[3], "validation")[4] == pytest.approx(
        _losses(shared_runs[2], "validation")[4], abs=1e-5
    )


@pytest.mark.slow
def test_exact_resume_with_shared_layers(shared_runs, english_shards, tmp_path):
    run = tmp_path / "resumed"
    shutil.copytree(shared_runs[3], run)
    shutil.rmtree(run / "checkpoints" / tag_for(4))  # as if the run had stopped after step 2
    (run / "metrics.jsonl").unlink()
    launch(
        [
            "--ds_config",
            str(_ds_config(tmp_path, 3)),
            "--data",
            str(english_shards),
            "--output_dir",
            str(run),
            "--resume",
            "auto",
        ]
        + TRAIN,
        nproc=1,
    )
    ref, got = _losses(shared_runs[3]), _losses(run)
    assert sorted(got) == [3, 4]
    for step in got:
        assert got[step] == pytest.approx(ref[step], abs=1e-6), (ref, got)


@pytest.mark.slow
def test_export_copies_shared_weights_and_matches_trained_logits(shared_runs, tmp_path):
    import transformers

    from bertforge.pretrain.export.hf_export import export
    from bertforge.pretrain.export.hf_extras import POOLER_KEYS
    from bertforge.pretrain.run_folder.run_checkpoints import consolidated_state_dict

    run = shared_runs[3]  # ZeRO-3 shards: the consolidation must restore every layer's name
    res = export(run, tmp_path / "hf")
    assert res["architecture"] == "BertForMaskedLM" and res["share_layers"] == "all"
    hf, info = transformers.BertForMaskedLM.from_pretrained(
        tmp_path / "hf", output_loading_info=True
    )
    # the only unused keys: the masked-LM run's untrained pooler, kept for BertModel (issue 36.9)
    assert info["unexpected_keys"] == set(POOLER_KEYS), info
    assert not any(info[k] for k in ("missing_keys", "mismatched_keys", "error_msgs")), info
    hf_layers = hf.bert.encoder.layer
    assert hf_layers[3].output.dense.weight is not hf_layers[0].output.dense.weight  # copies
    torch.testing.assert_close(hf_layers[3].output.dense.weight, hf_layers[0].output.dense.weight)
    state = json.loads((run / "checkpoints" / tag_for(4) / "trainer_state.json").read_text())
    ours = build_model(ModelConfig(**state["config"]["model_cfg"]), int(state["vocab_size"]))
    ours.load_state_dict(consolidated_state_dict(run / "checkpoints" / tag_for(4)), strict=False)
    assert (
        ours.bert.encoder.layer[3].output.dense.weight
        is ours.bert.encoder.layer[0].output.dense.weight
    )
    ours.eval()
    hf.eval()
    batch = _batch(1)
    with torch.no_grad():
        ref = ours.predict_masked(
            batch["input_ids"], batch["attention_mask"], None, batch["labels"]
        )
        logits = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    torch.testing.assert_close(logits[batch["labels"] != IGNORE_INDEX], ref, atol=1e-4, rtol=1e-4)


def test_init_from_unshared_bert_into_shared_layers_is_refused(tmp_path):
    from helpers.tiny_bert import build_tiny_bert

    from bertforge.pretrain.model.init_from import load_initial_weights
    from bertforge.pretrain.model.init_source import InitError, init_model_config

    folder = build_tiny_bert(tmp_path / "bert", layers=2)
    cfg = init_model_config(folder, dataclasses.replace(TINY4, share_layers="all"), {})
    assert cfg.share_layers == "all" and cfg.num_hidden_layers == 2  # depth from the checkpoint
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    model = build_model(cfg, vocab)
    with pytest.raises(InitError, match="shares layer 1's weights with layer 0"):
        load_initial_weights(model, folder, tokenizer_dir_of_shards=folder)


def test_dry_run_reports_distinct_parameters(english_shards):
    from bertforge.pretrain.data.loader import DataConfig
    from bertforge.pretrain.data.masking import MaskingConfig
    from bertforge.pretrain.dry_run import run_dry_run

    counts, out = {}, io.StringIO()
    for spec in ("none", "groups:2"):
        report = run_dry_run(
            str(english_shards),
            dataclasses.replace(TINY4, share_layers=spec),
            MaskingConfig(),
            DataConfig(),
            num_batches=1,
            micro_batch_size=2,
            stream=out,
        )
        counts[spec] = report["model"]["parameters"]
    assert counts["none"] - counts["groups:2"] == 2 * _layer_numel(TINY4)
    assert "layers 4 (weights shared: groups:2)" in out.getvalue()


@pytest.mark.slow
def test_universal_resume_on_two_ranks_with_shared_layers(shared_runs, english_shards, tmp_path):
    run = tmp_path / "two_ranks"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copytree(shared_runs[3] / "checkpoints" / tag_for(2), run / "checkpoints" / tag_for(2))
    proc = launch(
        [
            "--ds_config",
            str(_ds_config(tmp_path, 3)),
            "--data",
            str(english_shards),
            "--output_dir",
            str(run),
            "--resume",
            "auto",
        ]
        + TRAIN,
        nproc=2,
    )
    assert "saved on 1 ranks, now 2" in proc.stdout + proc.stderr
    ref, got = _losses(shared_runs[3]), _losses(run)
    assert sorted(got) == [3, 4]
    # Same weights, optimizer state and data; only dropout's random stream differs.
    assert got[3] == pytest.approx(ref[3], rel=0.02)
