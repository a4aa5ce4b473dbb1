"""DeepSpeed's own tools on our checkpoints, run as a user runs them (issue 36, item 4).

Each checkpoint folder's README.md names the command for Hugging Face weights (the export) and
says what zero_to_fp32 (with and without --safe_serialization) and ds_to_universal give instead.
Here every claim of it is checked against the tools themselves and transformers' own loader, on
a BERT checkpoint (2,000-token vocabulary, no rows padded: zero_to_fp32's weights load) and a
ModernBERT one (padded to 2,048 rows: they do not).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers.commands import REPO, run_cli, train_cli

from bertforge.pretrain.components.checkpoint_files import README, readme_text
from bertforge.pretrain.model.run_checkpoints import find_latest

# Each tool runs in its own process, on two trained checkpoints: minutes, not the quick lane.
pytestmark = pytest.mark.slow

ARCHS = {"bert": ("tiny", 2000), "modernbert": ("modernbert-tiny", 2048)}


@pytest.fixture(scope="module", params=sorted(ARCHS))
def checkpoint(request, english_shards, tmp_path_factory) -> Path:
    """One saved step of a tiny model of each architecture, one process."""
    arch = request.param
    run = tmp_path_factory.mktemp(arch) / "run"
    preset = ARCHS[arch][0]
    train_cli(
        run,
        *("--data", str(english_shards), "--arch", arch, "--model", preset, "--max_steps", "1"),
        *("--global_batch_size", "4", "--micro_batch_size", "4"),
    )
    return find_latest(run / "checkpoints")


def _from_pretrained(folder: Path):
    import transformers

    return transformers.AutoModelForMaskedLM.from_pretrained(str(folder))


def test_the_readme_command_gives_weights_transformers_loads(checkpoint, tmp_path):
    run, tag = checkpoint.parents[1], checkpoint.name
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    arch = state["config"]["model_cfg"]["arch"]
    text = (checkpoint / README).read_text()
    assert text == readme_text(tag, arch, 2000, ARCHS[arch][1])
    assert README in json.loads((checkpoint / "COMPLETE").read_text())["files"]
    line = next(s.strip() for s in text.splitlines() if "python -m pretrain.export" in s)
    hf = tmp_path / "hf"
    words = line.replace("HF_DIR", str(hf)).replace("RUN", str(run)).split()
    run_cli(*words[1:], cwd=REPO)  # as typed from the repository root
    model = _from_pretrained(hf)
    assert model.config.vocab_size == 2000
    assert model.get_input_embeddings().weight.shape[0] == 2000


def test_zero_to_fp32_weights_load_exactly_when_the_readme_says(checkpoint, tmp_path):
    run = checkpoint.parents[1]
    hf = tmp_path / "hf"
    run_cli("-m", "bertforge.pretrain.export", str(run), "--output", str(hf), "--no_verify")
    out = tmp_path / "fp32"
    script = checkpoint.parent / "zero_to_fp32.py"
    run_cli(str(script), ".", str(out), "--tag", checkpoint.name, cwd=checkpoint.parent)
    sd = torch.load(out / "pytorch_model.bin", map_location="cpu", weights_only=True)
    rows = max(t.shape[0] for k, t in sd.items() if k.endswith("embeddings.weight"))
    shutil.copy(hf / "config.json", out / "config.json")
    if "refuses it" in (checkpoint / README).read_text():
        assert rows > 2000
        with pytest.raises(RuntimeError, match="size"):
            _from_pretrained(out)
    else:
        assert rows == 2000
        mine = _from_pretrained(out).state_dict()
        theirs = _from_pretrained(hf).state_dict()
        assert all(torch.equal(mine[k], theirs[k]) for k in theirs)


def test_zero_to_fp32_safe_serialization_fails_as_the_readme_says(checkpoint, tmp_path):
    assert "--safe_serialization` fails" in (checkpoint / README).read_text()
    script = checkpoint.parent / "zero_to_fp32.py"
    out = tmp_path / "safe"
    proc = run_cli(
        str(script), ".", str(out), "--safe_serialization", cwd=checkpoint.parent, check=False
    )
    assert "Some tensors share memory" in proc.stdout + proc.stderr
    assert not list(out.glob("*.safetensors"))


def test_ds_to_universal_gives_resume_state_not_weights(checkpoint, tmp_path):
    assert "universal checkpoint for resuming" in (checkpoint / README).read_text()
    out = tmp_path / "universal"
    run_cli(
        *("-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", str(checkpoint)),
        *("--output_folder", str(out), "--inject_missing_state", "--num_extract_workers", "1"),
        "--num_merge_workers",
        "1",
    )
    params = {p.name for p in (out / "zero").iterdir()}
    assert any(name.endswith("embeddings.weight") for name in params), params
    assert not list(out.glob("*.safetensors")) and not (out / "config.json").exists()
