"""The evaluator's long-document strategies (``--long_documents``): the windows of a text against
hand-written ones, a document's prediction from its windows' mean probabilities (not logits),
key sentences that fit the length, and each strategy through the command on a tiny task."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import transformers
from helpers.tiny_bert import build_tiny_bert

from bertforge.pretrain.data.downstream_tasks import TaskData, TaskError, TaskSpec
from bertforge.pretrain.evaluate.__main__ import main as evaluate_main
from bertforge.pretrain.evaluate.long_documents import (
    DOC,
    aggregate_windows,
    check,
    key_sentence_text,
    window_features,
)

WORDS = [f"w{i}" for i in range(12)]


@pytest.fixture(scope="module")
def word_tokenizer(tmp_path_factory):
    """A fast BERT tokenizer whose every word ``wN`` is one token (id N + 5)."""
    vocab = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    return transformers.BertTokenizerFast(str(vocab))


@pytest.mark.parametrize(
    ("stride", "starts"),
    [
        (0, [0, 2, 4, 6, 8]),  # 0: half a window (4 text tokens -> 2)
        (2, [0, 2, 4, 6, 8]),
        (3, [0, 3, 6, 9]),
        (4, [0, 4, 8]),  # back to back
    ],
)
def test_windows_cover_the_text_at_the_stride(word_tokenizer, stride, starts):
    text = " ".join(WORDS[:11])  # 11 tokens; windows of 6 = [CLS] + 4 + [SEP]
    feats = window_features(word_tokenizer, [text, "w0 w1"], [3, 1], 6, stride)
    ids = [i + 5 for i in range(11)]
    want = [[2, *ids[s : s + 4], 3] for s in starts] + [[2, 5, 6, 3]]
    assert [f["input_ids"] for f in feats] == want
    assert [f[DOC] for f in feats] == [0] * len(starts) + [1]
    assert [f["labels"] for f in feats] == [3] * len(starts) + [1]


def test_a_stride_over_the_window_is_refused(word_tokenizer):
    with pytest.raises(TaskError, match="window_stride 5"):
        window_features(word_tokenizer, ["w0 w1"], [0], 6, 5)


def test_a_document_is_the_mean_of_its_windows_probabilities():
    # document 0: one window sure of class 0 (logit 10), two leaning to class 1. The mean of the
    # logits, (3.33, 1.33), says class 0; the mean of the probabilities says class 1.
    logits = torch.tensor([[10.0, 0.0], [0.0, 2.0], [0.0, 2.0], [1.0, 0.0]])
    probs = aggregate_windows(logits, [0, 0, 0, 1], 2)
    p1 = math.exp(2) / (1 + math.exp(2))  # softmax of (0, 2): 0.8808
    q = 1 / (1 + math.exp(-10))  # softmax of (10, 0): 0.99995
    doc0 = [(q + 2 * (1 - p1)) / 3, ((1 - q) + 2 * p1) / 3]
    doc1 = [math.e / (1 + math.e), 1 / (1 + math.e)]
    torch.testing.assert_close(probs, torch.tensor([doc0, doc1]), atol=1e-6, rtol=0)
    assert probs.argmax(-1).tolist() == [1, 0]


CENTRAL = [
    "The event loop runs the callbacks of the tasks.",
    "Every task of the loop schedules its callbacks on the event loop.",
    "Unrelated words sit here alone.",
    "The loop calls the callbacks of every task in order.",
]


def test_key_sentences_fit_the_budget_in_document_order():
    text = " ".join(CENTRAL)

    def words(sentences):
        return [len(s.split()) for s in sentences]

    assert key_sentence_text(text, 100, words) == text  # fits: untouched
    kept = key_sentence_text(text, 22, words)
    assert sum(words([kept])) <= 22
    sentences = [s for s in CENTRAL if s in kept]
    assert " ".join(sentences) == kept, "whole sentences, in document order"
    assert CENTRAL[2] not in kept, "the sentence that shares no word ranks last"
    assert len(sentences) == 2
    # the top sentence alone is longer than the budget: kept whole (the encoder truncates it)
    assert key_sentence_text(text, 3, words) in CENTRAL


def _task(scheme_pair: bool = False) -> TaskData:
    spec = TaskSpec(name="t", type="classification", train="x.jsonl")
    return TaskData(spec, [], [], [], ["a", "b"], "pair" if scheme_pair else "single")


def test_bad_values_are_refused_with_the_choices():
    with pytest.raises(TaskError, match="first, windows, key_sentences"):
        check(_task(), "middle", 64, 0)
    with pytest.raises(TaskError, match="single-text classification"):
        check(_task(scheme_pair=True), "windows", 64, 0)
    with pytest.raises(TaskError, match="window_stride -1"):
        check(_task(), "windows", 64, -1)
    check(_task(scheme_pair=True), "first", 64, 0)  # the default works everywhere


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("tiny") / "bert", hidden=16, layers=1)


@pytest.fixture(scope="module")
def long_task(tmp_path_factory) -> Path:
    """Two classes of 16 documents each, ~60 tokens, the class word after the 20th."""
    out = tmp_path_factory.mktemp("long_task")
    filler = "the of a to in is it that for on as with by this be are".split()
    rows = []
    for i in range(32):
        label = ("alpha", "beta")[i % 2]
        words = [filler[(i * 7 + j) % len(filler)] for j in range(60)]
        words[20:22] = [label, label]
        sentences = [" ".join(words[k : k + 10]).capitalize() + "." for k in range(0, 60, 10)]
        rows.append({"text": " ".join(sentences), "label": label})
    (out / "long.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = {"name": "long", "type": "classification", "train": "long.jsonl", "max_length": 16}
    (out / "tasks.json").write_text(json.dumps({"tasks": [task | {"dev_fraction": 0.2}]}))
    return out / "tasks.json"


@pytest.mark.parametrize("strategy", ["windows", "key_sentences"])
def test_the_option_end_to_end(tmp_path, strategy, long_task, tiny_bert):
    out = tmp_path / "eval"
    cmd = ["--models", f"tiny={tiny_bert}", "--tasks", str(long_task), "--out", str(out)]
    cmd += ["--seeds", "1", "--lrs", "1e-3", "--min_steps", "2", "--epochs", "0"]
    cmd += ["--dev_checks", "1", "--device", "cpu", "--long_documents", strategy]
    assert evaluate_main(cmd) == 0
    results = json.loads((out / "results.json").read_text())
    res = results["results"][0]
    assert res["recipe"]["long_documents"] == strategy
    task = results["tasks"][0]
    if strategy == "windows":  # every document in several windows; scores per document
        assert res["train_sequences"] > task["train"] and res["test_sequences"] > task["test"]
    else:
        assert (res["train_sequences"], res["test_sequences"]) == (task["train"], task["test"])
    assert 0.0 <= res["test"]["accuracy"]["median"] <= 1.0
    assert f"tiny/long: {strategy}" in (out / "results.md").read_text()


def test_a_bad_value_in_the_tasks_file_exits_2(tmp_path, long_task, tiny_bert):
    spec = json.loads(long_task.read_text())
    train = str(long_task.parent / "long.jsonl")
    spec["tasks"][0] |= {"recipe": {"long_documents": "all"}, "train": train}
    bad = tmp_path / "tasks.json"
    bad.write_text(json.dumps(spec))
    cmd = ["--models", str(tiny_bert), "--tasks", str(bad), "--out", str(tmp_path / "o")]
    assert evaluate_main(cmd + ["--device", "cpu"]) == 2
