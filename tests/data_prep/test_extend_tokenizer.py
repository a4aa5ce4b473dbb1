"""`python -m data_prep extend-tokenizer`: new tokens fill [unused*] first, each encodes as one
token, old ids stay, and the folder survives `data_prep build --tokenizer` with its word starts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers.commands import DATA
from helpers.vocab import vocab_with_unused
from transformers import AutoTokenizer

from bertforge.data_prep.__main__ import main as data_prep_main
from bertforge.data_prep.extend_tokenizer import REPORT_FILE
from bertforge.data_prep.reader import ShardReader
from bertforge.data_prep.sample_corpus import pydoc_documents
from bertforge.data_prep.tokenizer import train_wordpiece

TERMS = ["hypertension", "Heart Failure", "COVID-19", "高血压", "心力衰竭"]
SENTENCES = [
    "Patients with heart failure and hypertension were treated; COVID-19 made it worse.",
    "患有高血压的病人常常也有心力衰竭。高血压和心力衰竭都需要长期治疗。",
]


@pytest.fixture(scope="module")
def domain(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(base vocab.txt with 8 [unused*] slots, domain text file, terms file)."""
    root = tmp_path_factory.mktemp("extend")
    zh = (DATA / "zh_hongloumeng_sample.txt").read_text(encoding="utf-8").splitlines()
    train_wordpiece(pydoc_documents() + zh, 3000, True, root / "trained")
    vocab = vocab_with_unused(root / "trained", root / "vocab.txt")
    text = root / "domain.txt"
    docs = zh[:60] + pydoc_documents()[40:50] + SENTENCES * 3
    text.write_text("\n\n".join(d.strip() for d in docs) + "\n", encoding="utf-8")
    terms = root / "terms.txt"
    terms.write_text("\n".join(TERMS) + "\n", encoding="utf-8")
    return vocab, text, terms


@pytest.fixture(scope="module")
def extended(domain, tmp_path_factory) -> Path:
    vocab, text, terms = domain
    out = tmp_path_factory.mktemp("ext") / "tok"
    argv = [
        "extend-tokenizer",
        "--tokenizer",
        str(vocab),
        "--input",
        str(text),
        "--terms",
        str(terms),
        "--max_new",
        "30",
        "--min_frequency",
        "3",
        "--output",
        str(out),
    ]
    assert data_prep_main(argv) == 0
    return out


def test_new_tokens_fill_unused_first_and_encode_as_one_token(domain, extended, capsys):
    vocab_file, _, _ = domain
    base_vocab = vocab_file.read_text(encoding="utf-8").splitlines()
    tok = AutoTokenizer.from_pretrained(str(extended))
    report = json.loads((extended / REPORT_FILE).read_text(encoding="utf-8"))
    new = report["new_tokens"]
    assert len(new) == 30 and len(tok) == len(base_vocab) + 30 - 8
    assert [t["id"] for t in new[:8]] == list(range(1, 9))  # the [unused0..7] slots, in order
    assert all(t["slot"] == "appended" for t in new[8:])
    assert [t["source"] for t in new[:5]] == ["terms"] * 5  # terms come first
    for i, old in enumerate(base_vocab):  # every other old token keeps its id
        if not old.startswith("[unused"):
            assert tok.convert_ids_to_tokens(i) == old
    for t in new:
        assert tok(t["token"], add_special_tokens=False)["input_ids"] == [t["id"]], t
    ids = {t["token"]: t["id"] for t in new}
    enc = tok(SENTENCES[0] + SENTENCES[1], add_special_tokens=False)["input_ids"]
    for term in ("hypertension", "heart failure", "covid-19", "高血压", "心力衰竭"):
        assert ids[term] in enc, term  # cased text matches the lowercased entries
    # Words of the text were proposed too (Chinese words from rjieba, English words).
    mined = [t for t in new if t["source"] == "text"]
    assert any(t["kind"] == "added" for t in mined) and any(t["kind"] == "vocab" for t in mined)
    assert all(t["pieces"] >= 2 for t in new)
    assert report["after"]["tokens_per_char"] < report["before"]["tokens_per_char"]


def test_cli_prints_the_before_and_after_numbers(domain, tmp_path, capsys):
    vocab, text, terms = domain
    argv = [
        "extend-tokenizer",
        "--tokenizer",
        str(vocab),
        "--input",
        str(text),
        "--terms",
        str(terms),
        "--max_new",
        "10",
        "--output",
        str(tmp_path / "tok"),
    ]
    assert data_prep_main(argv) == 0
    out = capsys.readouterr().out
    assert "added 10 tokens (8 in [unused*] slots, 2 appended)" in out
    assert "tokens per character:" in out and "[UNK] rate" in out


def test_extended_tokenizer_survives_data_prep_build(domain, extended, tmp_path):
    _, text, terms = domain
    shards = tmp_path / "shards"
    argv = [
        "build",
        "--input",
        str(text),
        "--output",
        str(shards),
        "--tokenizer",
        str(extended),
        "--protected_terms",
        str(terms),
        "--max_seq_len",
        "64",
        "--validation_fraction",
        "0.0",
        "--workers",
        "1",
    ]
    assert data_prep_main(argv) == 0
    tok = AutoTokenizer.from_pretrained(str(shards / "tokenizer"))
    report = json.loads((extended / REPORT_FILE).read_text(encoding="utf-8"))
    term_ids = {t["id"] for t in report["new_tokens"] if t["source"] == "terms"}
    for t in report["new_tokens"]:
        assert tok(t["token"], add_special_tokens=False)["input_ids"] == [t["id"]]
    reader = ShardReader(shards, split="train")
    assert reader.vocab_size == len(tok)
    seen = set()
    for sample in reader:
        ids = np.asarray(sample.input_ids)
        at = np.isin(ids, list(term_ids))
        assert sample.word_start[at].all()  # each term is one whole-word masking unit
        seen |= set(ids[at].tolist())
    assert seen == term_ids  # every term occurs in the shards as its one token


def test_bad_requests_are_refused(domain, extended, tmp_path, capsys):
    vocab, text, terms = domain
    argv = [
        "extend-tokenizer",
        "--tokenizer",
        str(vocab),
        "--input",
        str(text),
        "--terms",
        str(terms),
        "--max_new",
        "3",
        "--output",
        str(tmp_path / "x"),
    ]
    assert data_prep_main(argv) == 2
    assert "--terms gives 5 new tokens, more than --max_new 3" in capsys.readouterr().err
    argv[-1] = str(extended)
    assert data_prep_main(argv) == 2
    assert "already exists" in capsys.readouterr().err
