"""pretrain.evaluate on a ModernBERT folder written by transformers itself: the evaluator runs on
it, and its task model at step 0 is transformers' ModernBertForSequenceClassification loaded from
the same folder (encoder and prediction head pretrained, only the classifier new)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.tiny_bert import build_tiny_modernbert

from benchmarks.tasks.pydoc_tasks import write_tasks
from bertforge.pretrain.evaluate.__main__ import main as evaluate_main
from bertforge.pretrain.evaluate.models import ModelSource


@pytest.fixture(scope="module")
def tiny_modernbert(tmp_path_factory) -> Path:
    return build_tiny_modernbert(tmp_path_factory.mktemp("tiny_mb") / "modernbert")


def test_task_model_at_step_0_is_transformers_own(tiny_modernbert):
    from transformers import AutoTokenizer, ModernBertForSequenceClassification

    torch.manual_seed(0)
    ours = ModelSource.from_hf_dir(tiny_modernbert).build("classification", ["a", "b", "c"])
    ref = ModernBertForSequenceClassification.from_pretrained(tiny_modernbert, num_labels=3)
    assert type(ours).__name__ == "ModernBertForSequenceClassification"
    # the prediction head is the folder's (as from_pretrained loads it), not a fresh one
    assert torch.equal(ours.head.dense.weight, ref.head.dense.weight)
    ref.classifier.load_state_dict(ours.classifier.state_dict())  # the only new weights
    tok = AutoTokenizer.from_pretrained(tiny_modernbert)
    texts = ["The function returns a list of values.", "Raise an error when the file is missing."]
    enc = tok(texts, padding=True, return_tensors="pt", return_token_type_ids=False)
    ours.eval()
    ref.eval()
    with torch.no_grad():
        got, want = ours(**enc).logits, ref(**enc).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_evaluator_runs_on_a_modernbert_folder(tiny_modernbert, tmp_path):
    tasks = write_tasks(tmp_path / "tasks", topics=2, per_topic=40)
    out = tmp_path / "eval"
    argv = (
        f"--models mb={tiny_modernbert} --tasks {tasks} --only pydoc_topic --out {out} "
        "--seeds 1 --lrs 1e-3 --epochs 1 --min_steps 0 --max_length 32"
    ).split()
    assert evaluate_main(argv) == 0
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert [m["label"] for m in results["models"]] == ["mb"]
    (row,) = results["results"]
    assert 0.0 <= row["test"]["accuracy"]["values"][0] <= 1.0
