"""python -m pretrain.export RUN --average: the exported weights are exactly the mean of the
named checkpoints' consolidated weights, the card lists their steps, and checkpoints of another
architecture are refused naming both and the first key that differs; the card carries the GLUE
scores of the exported checkpoint (--glue_results)."""

from __future__ import annotations

import shutil

import pytest
import torch
from helpers.commands import train_cli

from bertforge.pretrain.export.average import AverageError, average_checkpoints, parse_average
from bertforge.pretrain.export.hf_export import main as export_main
from bertforge.pretrain.export.hf_extras import POOLER_KEYS
from bertforge.pretrain.run_folder.run_checkpoints import consolidated_state_dict

pytestmark = pytest.mark.slow


def _train(shards, run, *extra: str):
    sizes = ("--global_batch_size", "4", "--micro_batch_size", "4", "--eval_batches", "1")
    return train_cli(run, "--data", str(shards), "--model", "tiny", *sizes, *extra)


@pytest.fixture(scope="module")
def run(english_shards, tmp_path_factory):
    """A run with complete checkpoints at steps 1 and 2."""
    folder = tmp_path_factory.mktemp("average") / "run"
    _train(english_shards, folder, "--max_steps", "2", "--save_interval", "1", "--lr", "1e-3")
    return folder


def test_the_average_of_two_checkpoints_is_the_mean_of_their_weights(run, tmp_path, capsys):
    one, two = (run / "checkpoints" / f"step_{s:08d}" for s in (1, 2))
    a, b = consolidated_state_dict(one), consolidated_state_dict(two)
    mean = average_checkpoints([one, two])
    assert set(mean) == set(a) == set(b)
    for key in a:
        assert torch.equal(mean[key], (a[key] + b[key]) / 2), key
    assert any(not torch.equal(a[k], b[k]) for k in a)  # two steps apart: not the same weights

    # The command writes that mean, mapped to Hugging Face names, and the card says so.
    from safetensors.torch import load_file

    from bertforge.pretrain.model.bert import ModelConfig
    from bertforge.pretrain.model.registry import build_model
    from bertforge.pretrain.run_folder.run_checkpoints import read_state

    assert export_main([str(run), "--output", str(tmp_path / "hf"), "--average", "last:2"]) == 0
    assert "the mean of the checkpoints of steps 1, 2" in capsys.readouterr().out
    state = read_state(two)
    model = build_model(ModelConfig(**state["config"]["model_cfg"]), int(state["vocab_size"]))
    model.load_state_dict(mean, strict=False)
    written = load_file(tmp_path / "hf" / "model.safetensors")
    for key in POOLER_KEYS:  # a masked-LM run's pooler: initialised at export, not averaged
        written.pop(key)
    expected = model.hf_state_dict(unpad_vocab=True)  # the tied decoder is not written again
    assert set(written) <= set(expected) and len(written) >= len(expected) - 2
    for key, value in written.items():
        assert torch.equal(value, expected[key]), key
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "- weights: the mean of the checkpoints of steps [1, 2]" in card


def test_checkpoints_of_another_architecture_are_refused(run, english_shards, tmp_path, capsys):
    other = tmp_path / "other"
    _train(english_shards, other, "--max_steps", "1", "--intermediate_size", "256")
    mixed = tmp_path / "mixed"
    shutil.copytree(run, mixed)
    shutil.copytree(
        other / "checkpoints" / "step_00000001", mixed / "checkpoints" / "step_00000003"
    )
    argv = [str(mixed), "--output", str(tmp_path / "hf"), "--average", "1,3", "--no_verify"]
    assert export_main(argv) == 2
    err = capsys.readouterr().err
    for part in ("step_00000001 and ", "step_00000003 do not hold the same weights", "(first "):
        assert part in err, err
    assert "bert.encoder.layer.0.intermediate.dense.bias (shape (512,) vs (256,))" in err
    assert not (tmp_path / "hf").exists()


def test_average_specs_that_name_nothing_usable_are_refused(run, tmp_path, capsys):
    for spec, message in (
        ("last:3", "holds 2 complete checkpoint(s) that verify (steps 1, 2)"),
        ("1,7", "step 7 of"),
        ("2,2", "steps once each"),
    ):
        assert export_main([str(run), "--output", str(tmp_path / "hf"), "--average", spec]) == 2
        assert message in capsys.readouterr().err, spec
    with pytest.raises(AverageError, match="at least 1"):
        parse_average("last:0")
    assert parse_average("last:4") == 4 and parse_average("300,100") == [300, 100]


def test_the_card_carries_the_glue_of_the_exported_checkpoint(run, tmp_path, capsys):
    """pretrain.evaluate --glue on the run's checkpoint, then export --glue_results: the card has
    each task's dev scores and how they were run; a label the file lacks is refused first."""
    from helpers.glue import write_glue

    from bertforge.pretrain.evaluate.__main__ import main as evaluate_main

    glue, out = write_glue(tmp_path / "glue_data", n_train=16, n_dev=8), tmp_path / "eval"
    argv = ["--models", f"demo={run}@2", "--glue", str(glue), "--out", str(out), "--no_progress"]
    assert evaluate_main([*argv, "--only", "RTE", "STS-B", "--epochs", "1"]) == 0
    results = str(out / "glue.json")
    bad = [str(run), "--output", str(tmp_path / "bad"), "--glue_results", results]
    assert export_main([*bad, "--glue_model", "other"]) == 2
    assert "--glue_model other: not in" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
    assert export_main([str(run), "--output", str(tmp_path / "hf"), "--glue_results", results]) == 0
    card = (tmp_path / "hf" / "README.md").read_text()
    assert (
        "## GLUE (dev)" in card and "| STS-B | spearmanr |" in card and "| RTE | accuracy |" in card
    )
    assert "Protocol `run_glue`" in card and "median [min, max] over 1 seed(s)" in card
