"""A setting given both in the recipe (or a flag) and in the DeepSpeed JSON is refused, naming
both places; given in one, that one is used; in neither, the documented default (issue 35)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from helpers.launch import ds_config

from bertforge.pretrain.config.cli import parse_args
from bertforge.pretrain.config.ds_config import resolve_deepspeed_config
from bertforge.pretrain.config.one_home import SHARED_KNOBS, TwoHomesError
from bertforge.pretrain.config.recipe import resolved_recipe
from bertforge.pretrain.config.train_config import (
    DEFAULT_GRADIENT_CLIPPING,
    DEFAULT_LR,
    DEFAULT_MICRO_BATCH,
    DEFAULT_WEIGHT_DECAY,
)

ADAMW = {"betas": [0.9, 0.999], "eps": 1e-6, "torch_adam": True}

# (flags, the JSON's blocks, the recipe field, the JSON key as the message names it)
CLASHES = [
    (["--lr", "1e-3"], {"optimizer": {"params": {**ADAMW, "lr": 5e-4}}}, "optim.lr",
     "optimizer.params.lr = 0.0005"),
    (["--weight_decay", "0.1"], {"optimizer": {"params": {**ADAMW, "weight_decay": 0.01}}},
     "optim.weight_decay", "optimizer.params.weight_decay = 0.01"),
    (["--optimizer", "adamw"], {"optimizer": {"type": "AdamW", "params": ADAMW}},
     "optim.optimizer", "optimizer.type = 'AdamW'"),
    (["--gradient_clipping", "0.5"], {"gradient_clipping": 1.0}, "optim.gradient_clipping",
     "gradient_clipping = 1.0"),
    (["--global_batch_size", "16"], {"train_batch_size": 16}, "batch.global_batch_size",
     "train_batch_size = 16"),
    (["--micro_batch_size", "4"], {"train_micro_batch_size_per_gpu": 8},
     "batch.micro_batch_size", "train_micro_batch_size_per_gpu = 8"),
    (["--grad_accum", "2"], {"gradient_accumulation_steps": 2}, "batch.grad_accum",
     "gradient_accumulation_steps = 2"),
    (["--precision", "bf16"], {"bf16": {"enabled": True}}, "precision.precision",
     "bf16.enabled = True"),
    (["--activation_checkpointing", "torch"], {"activation_checkpointing": {"enabled": True}},
     "memory.activation_checkpointing", "activation_checkpointing.enabled = True"),
]  # fmt: skip


def _cfg(shards, path, *flags: str):
    return parse_args(["--ds_config", str(path), "--data", str(shards), *flags])


def test_every_shared_setting_has_a_clash_case():
    assert sorted(k.field for k in SHARED_KNOBS) == sorted(c[2] for c in CLASHES)


@pytest.mark.parametrize("flags,blocks,field,json_part", CLASHES, ids=[c[2] for c in CLASHES])
def test_a_setting_given_in_both_is_refused_naming_both(
    flags, blocks, field, json_part, english_shards, tmp_path
):
    path = ds_config(tmp_path, "both.json", **blocks)
    with pytest.raises(TwoHomesError) as e:
        resolve_deepspeed_config(_cfg(english_shards, path, *flags), 1, "cpu")
    message = str(e.value)
    assert f"{field} = " in message and f"(flag {flags[0]})" in message, message
    assert f"{json_part} ({path})" in message, message


def test_a_recipe_file_is_named_as_the_other_place(english_shards, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("batch:\n  micro_batch_size: 4\noptim:\n  lr: 0.001\n")
    path = ds_config(
        tmp_path,
        "both.json",
        train_micro_batch_size_per_gpu=8,
        optimizer={"params": {**ADAMW, "lr": 5e-4}},
    )
    with pytest.raises(TwoHomesError) as e:
        resolve_deepspeed_config(_cfg(english_shards, path, "--recipe", str(recipe)), 1, "cpu")
    assert "2 setting(s) given in two places" in str(e.value)
    assert str(e.value).count(f"(recipe {recipe})") == 2


def test_given_in_one_place_that_value_is_used_and_auto_means_the_recipes(english_shards, tmp_path):
    in_json = ds_config(
        tmp_path,
        "json.json",
        train_micro_batch_size_per_gpu=8,
        gradient_accumulation_steps=2,
        gradient_clipping=0.5,
        optimizer={"params": {**ADAMW, "lr": 5e-4, "weight_decay": 0.1}},
    )
    setup = resolve_deepspeed_config(_cfg(english_shards, in_json), 2, "cpu")
    params = setup.config["optimizer"]["params"]
    assert (params["lr"], params["weight_decay"], setup.config["gradient_clipping"]) == (
        5e-4,
        0.1,
        0.5,
    )
    assert (setup.batch.micro_batch, setup.batch.grad_accum, setup.batch.global_batch) == (8, 2, 32)
    # HF's DeepSpeed JSONs write "auto" where the trainer fills the value: the recipe's
    hf_style = ds_config(
        tmp_path,
        "auto.json",
        train_micro_batch_size_per_gpu="auto",
        gradient_clipping="auto",
        optimizer={"type": "AdamW", "params": {**ADAMW, "lr": "auto", "weight_decay": "auto"}},
    )
    flags = ["--lr", "2e-3", "--micro_batch_size", "4", "--gradient_clipping", "0.25"]
    setup = resolve_deepspeed_config(_cfg(english_shards, hf_style, *flags), 1, "cpu")
    params = setup.config["optimizer"]["params"]
    assert (params["lr"], setup.batch.micro_batch, setup.config["gradient_clipping"]) == (
        2e-3,
        4,
        0.25,
    )
    assert params["weight_decay"] == DEFAULT_WEIGHT_DECAY


def test_given_nowhere_the_documented_defaults(english_shards, tmp_path):
    bare = ds_config(tmp_path, "bare.json")  # ds_configs/cpu.json: the engine only
    setup = resolve_deepspeed_config(_cfg(english_shards, bare), 2, "cpu")
    params = setup.config["optimizer"]["params"]
    assert setup.config["optimizer"]["type"] == "AdamW"
    assert (params["lr"], params["weight_decay"]) == (DEFAULT_LR, DEFAULT_WEIGHT_DECAY)
    assert setup.config["gradient_clipping"] == DEFAULT_GRADIENT_CLIPPING
    assert (setup.batch.micro_batch, setup.batch.grad_accum) == (DEFAULT_MICRO_BATCH, 1)
    assert setup.batch.global_batch == DEFAULT_MICRO_BATCH * 2
    assert setup.from_json == frozenset()


def test_a_value_resolution_filled_in_is_not_a_second_home(english_shards, tmp_path):
    """--override_lr_schedule takes the checkpoint's peak lr: not the user's, so a JSON lr
    beside it is no clash (the checkpoint's value wins, as the resume promises)."""
    path = ds_config(tmp_path, "lr.json", optimizer={"params": {**ADAMW, "lr": 5e-4}})
    cfg = _cfg(english_shards, path)
    cfg = dataclasses.replace(
        cfg,
        optim=dataclasses.replace(cfg.optim, lr=3e-3),
        sources={**cfg.sources, "optim.lr": "checkpoint RUN/checkpoints/step_10"},
    )
    assert resolve_deepspeed_config(cfg, 1, "cpu").config["optimizer"]["params"]["lr"] == 3e-3


def test_the_runs_recipe_leaves_the_jsons_values_to_it(english_shards, tmp_path):
    """RUN/recipe.yaml names the JSON; what the JSON gave stays out of the recipe, so the pair
    resolves again, to the same DeepSpeed config."""
    path = ds_config(
        tmp_path,
        "json.json",
        train_micro_batch_size_per_gpu=8,
        gradient_accumulation_steps=2,
        optimizer={"params": {**ADAMW, "lr": 5e-4}},
    )
    cfg = _cfg(english_shards, path, "--weight_decay", "0.1", "--max_steps", "7")
    setup = resolve_deepspeed_config(cfg, 2, "cpu")
    assert setup.from_json == {"optim.lr", "batch.micro_batch_size", "batch.grad_accum"}
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(resolved_recipe(cfg, setup))
    again = resolve_deepspeed_config(parse_args(["--recipe", str(recipe)]), 2, "cpu")
    assert json.dumps(again.config, sort_keys=True) == json.dumps(setup.config, sort_keys=True)
    assert again.config["optimizer"]["params"]["weight_decay"] == 0.1
