"""One recipe per run (issue 35): a YAML recipe's values are the flags' defaults, a flag wins,
bad recipes fail naming the file and key, the flags are generated from the config fields, and
the user-found traps of the five places a setting used to live are refused."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bertforge.pretrain.config.cli import config_from_args, parse_args, trainer_parser
from bertforge.pretrain.config.recipe import SECTIONS, dump_recipe, load_recipe
from bertforge.pretrain.config.train_config import CONCERNS, foreign_concerns

REPO = Path(__file__).resolve().parents[3]
FROZEN = Path(__file__).with_name("cli_flags.txt")


def _parse(*argv: str):
    parser, names = trainer_parser()
    return config_from_args(parser.parse_args(list(argv)), names, parser)


def _error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as e:
        parse_args(list(argv))
    assert e.value.code == 2
    return capsys.readouterr().err


def test_a_recipes_values_are_the_defaults_and_a_flag_wins_with_its_source(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "run: {max_steps: 40, data_sources: [a]}\noptim: {lr: 0.002, warmup_steps: 4}\n"
        "model: {hidden_dropout_prob: 0}\nmasking: {mask_prob: 0.3, whole_word: true}\n"
    )
    cfg = _parse("--recipe", str(recipe), "--lr", "1e-3", "--mask_prob", "0.2")
    assert cfg.run.max_steps == 40 and cfg.optim.warmup_steps == 4
    assert cfg.optim.lr == 1e-3 and cfg.masking.mask_prob == 0.2  # the flags win
    assert cfg.masking.whole_word is True and cfg.model_cfg.hidden_dropout_prob == 0.0
    assert cfg.sources["optim.lr"] == "flag --lr"
    assert cfg.sources["optim.warmup_steps"] == f"recipe {recipe}"
    assert cfg.sources["model.hidden_dropout_prob"] == f"recipe {recipe}"
    assert "optim.decay" not in cfg.sources  # a default has no source


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("optim: {learning_rate: 0.1}", "unknown key optim.learning_rate"),
        ("optimizer: {lr: 0.1}", "unknown section optimizer; did you mean optim?"),
        ("optim: {lr: fast}", "optim.lr must be float, got 'fast'"),
        ("run: {max_steps: 2.5}", "run.max_steps must be int, got 2.5"),
        ("run: [1, 2]", "section run must be a mapping of field: value"),
        ("[1, 2]", "a recipe is a mapping of sections"),
        ("model: {name: x}", "unknown key model.name"),
    ],
)
def test_a_bad_recipe_fails_naming_the_file_and_the_key(tmp_path, capsys, text, expected):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(text + "\n")
    err = _error(capsys, "--recipe", str(recipe))
    assert str(recipe) in err and expected in err, err


def test_a_missing_recipe_is_named(capsys, tmp_path):
    err = _error(capsys, "--recipe", str(tmp_path / "none.yaml"))
    assert f"--recipe {tmp_path / 'none.yaml'}: cannot read it" in err


def test_a_dumped_recipe_loads_back_to_the_same_config(tmp_path):
    cfg = _parse("--data", "x", "--lr", "3e-3", "--schedule", "wsd", "--model", "small")
    cfg = dataclasses.replace(cfg, sources={})
    text = dump_recipe(cfg.to_dict(), "a header")
    assert text.startswith("# a header\n")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text)
    again = _parse("--recipe", str(recipe))
    launch = {("run", k) for k in ("output_dir", "resume", "dry_run", "json", "show_masks")}
    for group, values in cfg.to_dict().items():
        for key, value in values.items():
            if (group, key) not in launch:
                assert again.to_dict()[group][key] == value, (group, key)
    assert set(load_recipe(recipe, {**CONCERNS, **foreign_concerns()})) >= {("optim", "lr")}


def test_every_config_field_is_a_recipe_key_and_has_a_generated_flag():
    groups = {**CONCERNS, **foreign_concerns()}
    assert set(SECTIONS.values()) == set(groups)
    parser, names = trainer_parser()
    flags = set(parser.option_strings())
    for group, cls in groups.items():
        for f in dataclasses.fields(cls):
            if (group, f.name) in {("model_cfg", "name")}:  # run.model_preset (--model) names it
                continue
            spelled = f.metadata.get("flag", {}).get("flags") or (f"--{names[group, f.name]}",)
            assert set(spelled) <= flags, (group, f.name)


def test_the_flags_not_generated_from_a_field_are_frozen():
    parser, names = trainer_parser()
    generated = set()
    for action in parser._actions:
        if action.dest in set(names.values()):
            generated.update(action.option_strings)
    hand_written = {s for s in parser.option_strings() if s not in generated}
    frozen = {ln for ln in FROZEN.read_text().splitlines() if ln and not ln.startswith("#")}
    assert hand_written == frozen, (
        f"pretrain/main.py's hand-written flags changed: {sorted(hand_written ^ frozen)}. A new "
        f"setting is a field of a config dataclass (a recipe section); if this is on purpose, "
        f"update {FROZEN}"
    )


@pytest.mark.parametrize(
    ("flag", "meant"),
    [
        ("--learning_rate", "--lr"),
        ("--gradient_accumulation_steps", "--grad_accum"),
        ("--mlm_probability", "--mask_prob"),
        ("--train_iters", "--max_steps"),
        ("--max_stepps", "--max_steps"),
    ],
)
def test_a_misspelt_or_foreign_flag_suggests_ours(capsys, flag, meant):
    err = _error(capsys, "--data", "x", flag, "1")
    assert f"unrecognized argument {flag}; did you mean {meant}?" in err, err


def test_a_warmup_longer_than_the_run_is_refused(capsys):
    # Before: accepted, although docs/training.md said it fails (the lr never reached its peak).
    err = _error(capsys, "--data", "x", "--max_steps", "10", "--warmup_steps", "20")
    assert "--warmup_steps 20 is longer than the run (--max_steps 10)" in err
    demo = REPO / "recipes" / "demo.yaml"  # a value from a recipe is named with its file
    err = _error(capsys, "--recipe", str(demo), "--max_steps", "10")
    assert f"--warmup_steps 30 (from recipe {demo}) is longer than the run" in err


def test_a_deepspeed_scheduler_block_is_refused_naming_both_places(tmp_path):
    from bertforge.pretrain.config.ds_config import ConfigError, resolve_deepspeed_config

    ds = json.loads((REPO / "ds_configs" / "cpu.json").read_text())
    ds["scheduler"] = {"type": "WarmupLR", "params": {"warmup_num_steps": 5}}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(ds))
    # Before: it silently replaced --lr, --warmup_steps and --decay (the dry run printed no lr).
    cfg = _parse("--data", "x", "--ds_config", str(path), "--lr", "1e-3")
    with pytest.raises(ConfigError) as e:
        resolve_deepspeed_config(cfg, 1, "cpu")
    assert str(path) in str(e.value) and '"scheduler" block' in str(e.value)
    assert "optim.lr" in str(e.value) and "the recipe's schedule" in str(e.value)


def test_old_flags_keep_working_beside_a_recipe():
    cfg = _parse(
        "--recipe", str(REPO / "recipes" / "demo.yaml"), "--data", "d1", "--max_steps", "70"
    )
    assert cfg.run.data_sources == ["d1"] and cfg.run.max_steps == 70
    assert cfg.optim.lr == 0.002 and cfg.run.model_preset == "tiny"
