"""Our runs in software nobody here wrote, each checked against our own numbers (issue 36, 14).

One saved run per architecture (BERT, ModernBERT; two steps of a tiny model, one process) goes
through what users put it through:

- transformers: the exported tokenizer knows the trained length (``truncation=True`` and the
  fill-mask pipeline take a text of any length); the fill-mask pipeline's top tokens and scores
  are our model's; ``AutoModel``'s hidden states are our encoder's; classes with a pooler load
  without MISSING weights; ``AutoModelForSequenceClassification`` fine-tunes under HF Trainer.
- sentence-transformers: a plain folder loads by its convention (mean pooling) and embeds as our
  encoder's mean over real tokens does.
- DeepSpeed's own tools: each checkpoint folder's README.md names the command for Hugging Face
  weights and says what zero_to_fp32 (with and without --safe_serialization) and ds_to_universal
  give instead; every claim of it is checked against the tools themselves and transformers'
  loader (BERT: 2,000 rows, no padding, zero_to_fp32's weights load; ModernBERT: padded to 2,048
  rows, they do not).
- TensorBoard's own event reader: the scalars of the run's event file are metrics.jsonl's.
- The model card names no absolute path of the training machine.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from helpers.commands import REPO, run_cli, train_cli

from bertforge.pretrain.checkpoints.checkpoint_files import README, readme_text
from bertforge.pretrain.export.hf_export import export, load_weights
from bertforge.pretrain.model.model_config import ModelConfig
from bertforge.pretrain.model.registry import build_model
from bertforge.pretrain.run_folder.run_checkpoints import (
    consolidated_state_dict,
    find_latest,
    read_state,
)

# Each client runs on two trained checkpoints, DeepSpeed's tools in processes of their own:
# minutes, not the quick lane.
pytestmark = pytest.mark.slow
TRAINED = 128  # the english_shards fixture's --max_seq_len
ARCHS = {"bert": ("tiny", 2000), "modernbert": ("modernbert-tiny", 2048)}  # preset, trained rows
SENTENCES = [
    "The function returns a list of values.",
    "A module may define classes, functions and variables; the import statement loads it.",
]


@pytest.fixture(scope="module", params=sorted(ARCHS))
def trained(request, english_shards, tmp_path_factory) -> tuple[str, Path, Path]:
    """Two saved steps of a tiny model of ``arch`` (one process) and its export:
    (arch, run folder, exported folder)."""
    arch = request.param
    folder = tmp_path_factory.mktemp(f"clients_{arch}")
    run = folder / "run"
    train_cli(
        run,
        *("--data", str(english_shards), "--arch", arch, "--model", ARCHS[arch][0]),
        *("--global_batch_size", "4", "--micro_batch_size", "4", "--eval_batches", "1"),
        *("--max_steps", "2"),
    )
    export(run, folder / "hf")
    return arch, run, folder / "hf"


@pytest.fixture(scope="module")
def ours(trained) -> torch.nn.Module:
    """Our own model class with the run's last checkpoint loaded: the numbers to match."""
    _, run, _ = trained
    ckpt = find_latest(run / "checkpoints")
    state = read_state(ckpt)
    model = build_model(
        ModelConfig(**state["config"]["model_cfg"]), vocab_size=int(state["vocab_size"])
    )
    load_weights(model, consolidated_state_dict(ckpt), ckpt)
    return model.eval()


def _batch(hf: Path, texts: list[str]) -> dict[str, torch.Tensor]:
    tok = transformers.AutoTokenizer.from_pretrained(str(hf))
    return tok(texts, padding=True, return_tensors="pt")


def _our_hidden(ours, batch) -> torch.Tensor:
    with torch.no_grad():
        return ours.encode(batch["input_ids"], batch["attention_mask"]).float()


def _long_text(mask: str) -> str:
    from pydoc_data.topics import topics

    return f"The function returns a {mask} of values. " + " ".join(topics.values())[:8000]


# transformers


def test_the_tokenizer_knows_the_trained_length(trained):
    _, _, hf = trained
    config = json.loads((hf / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["model_max_length"] == TRAINED
    tok = transformers.AutoTokenizer.from_pretrained(str(hf))
    text = _long_text(tok.mask_token)
    assert len(tok(text)["input_ids"]) > 647
    assert len(tok(text, truncation=True)["input_ids"]) == TRAINED
    fill = transformers.pipeline("fill-mask", model=str(hf), device="cpu")
    preds = fill(text, top_k=3, tokenizer_kwargs={"truncation": True})
    assert len(preds) == 3 and all(0 <= p["score"] <= 1 for p in preds)


def test_the_fill_mask_pipeline_gives_our_predictions(trained, ours):
    _, _, hf = trained
    fill = transformers.pipeline("fill-mask", model=str(hf), device="cpu")
    text = f"The function returns a {fill.tokenizer.mask_token} of values."
    preds = fill(text, top_k=5)
    batch = _batch(hf, [text])
    labels = torch.where(batch["input_ids"] == fill.tokenizer.mask_token_id, 0, -100)
    with torch.no_grad():
        logits = ours.predict_masked(batch["input_ids"], batch["attention_mask"], None, labels)
    scores, ids = logits.float().softmax(-1)[0].topk(5)
    assert [p["token"] for p in preds] == ids.tolist()
    torch.testing.assert_close(torch.tensor([p["score"] for p in preds]), scores, atol=1e-5, rtol=0)


def test_auto_model_hidden_states_are_ours(trained, ours):
    _, _, hf = trained
    batch = _batch(hf, SENTENCES)
    model = transformers.AutoModel.from_pretrained(str(hf)).eval()
    with torch.no_grad():
        theirs = model(**batch).last_hidden_state
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(theirs[real], _our_hidden(ours, batch)[real], atol=1e-4, rtol=1e-4)


def test_classes_with_a_pooler_load_without_missing_weights(trained):
    arch, _, hf = trained
    seq_cls = transformers.AutoModelForSequenceClassification
    _, info = seq_cls.from_pretrained(str(hf), num_labels=2, output_loading_info=True)
    assert info["missing_keys"] == {"classifier.weight", "classifier.bias"}  # the task head only
    _, info = transformers.AutoModel.from_pretrained(str(hf), output_loading_info=True)
    assert not info["missing_keys"]
    config = json.loads((hf / "config.json").read_text(encoding="utf-8"))
    card = (hf / "README.md").read_text(encoding="utf-8")
    if arch == "bert":  # the untrained pooler is said to be so
        assert "untrained" in config["bertforge_pooler"]
        assert "- pooler: initialised at export, untrained" in card
    else:
        assert "bertforge_pooler" not in config and "pooler" not in card


def test_hf_trainer_fine_tunes_the_export(trained, ours, tmp_path):
    """Sequence classification under HF Trainer as its users run it: the encoder it starts from
    is ours, and a few steps on a separable task lower the training loss."""
    _, _, hf = trained
    tok = transformers.AutoTokenizer.from_pretrained(str(hf))
    clf = transformers.AutoModelForSequenceClassification.from_pretrained(str(hf), num_labels=2)
    batch = _batch(hf, SENTENCES)
    with torch.no_grad():
        start = clf.base_model(**batch).last_hidden_state
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(start[real], _our_hidden(ours, batch)[real], atol=1e-4, rtol=1e-4)

    texts = [f"the value {w} is returned" for w in ("list", "dict", "set", "tuple")] + [
        f"an error {w} is raised" for w in ("TypeError", "KeyError", "OSError", "IndexError")
    ]
    rows = [
        {**tok(t, truncation=True), "labels": int("error" in t)} for t in texts
    ]  # fmt: skip
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "fine_tuned"),
        per_device_train_batch_size=8,
        max_steps=8,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(
        model=clf,
        args=args,
        train_dataset=rows,
        data_collator=transformers.DataCollatorWithPadding(tok),
    )
    trainer.train()
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    assert len(losses) == 8 and all(map(torch.isfinite, torch.tensor(losses)))
    assert min(losses[-3:]) < losses[0], losses


# sentence-transformers


def test_sentence_transformers_embeds_as_our_mean_pooling(trained, ours, capfd):
    from sentence_transformers import SentenceTransformer

    _, _, hf = trained
    capfd.readouterr()
    st = SentenceTransformer(str(hf), device="cpu")
    said = "".join(capfd.readouterr())
    assert "MISSING" not in said and "newly initialized" not in said, said
    assert st.max_seq_length == TRAINED  # the tokenizer's trained length
    embeddings = torch.as_tensor(st.encode(SENTENCES, convert_to_numpy=True))
    batch = _batch(hf, SENTENCES)
    mask = batch["attention_mask"].unsqueeze(-1).float()
    mean = (_our_hidden(ours, batch) * mask).sum(1) / mask.sum(1)
    torch.testing.assert_close(embeddings, mean, atol=1e-4, rtol=1e-4)


# DeepSpeed's own tools


def _checkpoint(trained) -> Path:
    return find_latest(trained[1] / "checkpoints")


def _from_pretrained(folder: Path):
    return transformers.AutoModelForMaskedLM.from_pretrained(str(folder))


def test_the_readme_command_gives_weights_transformers_loads(trained, tmp_path):
    arch, run, _ = trained
    checkpoint = _checkpoint(trained)
    text = (checkpoint / README).read_text()
    assert text == readme_text(checkpoint.name, arch, 2000, ARCHS[arch][1])
    assert README in json.loads((checkpoint / "COMPLETE").read_text())["files"]
    line = next(s.strip() for s in text.splitlines() if "bertforge export" in s)
    hf = tmp_path / "hf"
    words = line.replace("HF_DIR", str(hf)).replace("RUN", str(run)).split()
    run_cli("-m", *words, cwd=REPO)  # as typed from the repository root (python -m bertforge)
    model = _from_pretrained(hf)
    assert model.config.vocab_size == 2000
    assert model.get_input_embeddings().weight.shape[0] == 2000


def test_zero_to_fp32_weights_load_exactly_when_the_readme_says(trained, tmp_path):
    _, _, hf = trained
    checkpoint = _checkpoint(trained)
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


def test_zero_to_fp32_safe_serialization_fails_as_the_readme_says(trained, tmp_path):
    checkpoint = _checkpoint(trained)
    assert "--safe_serialization` fails" in (checkpoint / README).read_text()
    script = checkpoint.parent / "zero_to_fp32.py"
    out = tmp_path / "safe"
    proc = run_cli(
        str(script), ".", str(out), "--safe_serialization", cwd=checkpoint.parent, check=False
    )
    assert "Some tensors share memory" in proc.stdout + proc.stderr
    assert not list(out.glob("*.safetensors"))


def test_ds_to_universal_gives_resume_state_not_weights(trained, tmp_path):
    checkpoint = _checkpoint(trained)
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


# TensorBoard


def test_tensorboards_reader_gives_the_metrics_of_metrics_jsonl(trained):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, run, _ = trained
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r and r.get("split", "train") == "train"]
    assert [r["step"] for r in steps] == [1, 2]
    (events,) = {p.parent for p in (run / "tensorboard").rglob("events.out.tfevents.*")}
    reader = EventAccumulator(str(events))
    reader.Reload()
    for key in ("loss", "lr", "grad_norm"):
        scalars = reader.Scalars(f"Train/{key}")
        assert [s.step for s in scalars] == [4, 8]  # by samples: global batch 4
        want = torch.tensor([r[key] for r in steps], dtype=torch.float32)
        assert torch.equal(torch.tensor([s.value for s in scalars]), want), key
    (val,) = [r for r in records if r.get("split") == "validation"]
    (tb_val,) = reader.Scalars("Validation/loss")
    assert tb_val.value == pytest.approx(val["val_loss"], rel=1e-6)


# The model card


def test_the_model_card_names_no_absolute_path(trained):
    _, _, hf = trained
    card = (hf / "README.md").read_text(encoding="utf-8")
    root = str(hf.parent)
    assert root not in card and "/tmp/" not in card, card
    assert "python pretrain/main.py --ds_config ds_configs/cpu.json --output_dir . " in card
    assert re.search(r"--data \.\./\.\./shards_en\d*/shards ", card), card  # beside the run
    assert f"model_max_length {TRAINED}" in card
