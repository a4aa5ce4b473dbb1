"""Decontamination: edited copies of validation documents planted in the training input are found
and dropped, other documents kept (English by words, Chinese by characters); check-overlap."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import numpy as np
import pytest
from helpers.commands import DATA

from bertforge.data_prep.__main__ import main
from bertforge.data_prep.decontam import Signer, shingle_hashes
from bertforge.data_prep.sample_corpus import pydoc_documents
from bertforge.data_prep.worker import is_validation

VAL = 0.05


def edited_copy(doc: str, rng: random.Random, every: int, tokens: list[str]) -> str:
    """A near-duplicate that lands in training: another header, one token in `every` replaced."""
    english = " " in doc
    parts = doc.split(" ") if english else list(doc)
    headers = ["Mirror:", "Copy:", "Reposted:", "Archived:"] if english else list("转载摘录")
    for attempt in range(50):
        edited = list(parts)
        for _ in range(len(parts) // every):
            edited[rng.randrange(len(parts))] = rng.choice(tokens)
        header = headers[attempt % len(headers)]
        copy = f"{header} " + " ".join(edited) if english else f"{header}：" + "".join(edited)
        if not is_validation(copy, VAL):
            return copy
    raise AssertionError("no edited copy landed in the training split")


def plant(docs: list[str], every: int, tokens: list[str]) -> tuple[list[str], int, int]:
    """docs + an edited copy of each validation document; (all, planted, original train docs)."""
    rng = random.Random(0)
    val = [d for d in docs if is_validation(d, VAL)]
    assert val, "the corpus needs validation documents"
    planted = [edited_copy(d, rng, every, tokens) for d in val]
    return docs + planted, len(planted), len(docs) - len(val)


@pytest.fixture(scope="module")
def english_planted(tmp_path_factory) -> tuple[Path, int, int]:
    docs = ["\n".join(ln for ln in d.splitlines() if ln.strip()) for d in pydoc_documents()]
    all_docs, n_planted, n_train = plant(docs, every=100, tokens=["alpha", "beta", "gamma"])
    path = tmp_path_factory.mktemp("planted") / "planted.txt"
    path.write_text("".join(d + "\n\n" for d in all_docs), encoding="utf-8")
    return path, n_planted, n_train


def build(corpus: Path, tokenizer: Path, out: Path, *extra: str) -> dict:
    args = [
        "build",
        "--input",
        str(corpus),
        "--output",
        str(out),
        "--tokenizer",
        str(tokenizer),
        "--validation_fraction",
        str(VAL),
        "--workers",
        "1",
        *extra,
    ]
    assert main(args) == 0
    return json.loads((out / "manifest.json").read_text())


def test_signatures_are_datasketch_minhash_and_estimate_jaccard():
    from datasketch import MinHash

    docs = pydoc_documents()[:6]
    signer = Signer()
    for d in docs[:2]:
        ref = MinHash(num_perm=128, seed=1, hashfunc=lambda x: x)
        ref.update_batch(shingle_hashes(d).tolist())
        np.testing.assert_array_equal(signer.signature(d), ref.hashvalues)
    a = docs[2]
    words = a.split(" ")
    b = " ".join(words[: len(words) * 2 // 3])  # a prefix: true Jaccard = |B| / |A|
    sa, sb = set(shingle_hashes(a).tolist()), set(shingle_hashes(b).tolist())
    exact = len(sa & sb) / len(sa | sb)
    est = float((signer.signature(a) == signer.signature(b)).mean())
    assert abs(est - exact) < 0.15, (est, exact)
    assert len(shingle_hashes("红楼梦第一回甄士隐梦幻识通灵")) == 14 - 5 + 1  # characters


def test_planted_english_near_duplicates_dropped_others_kept(
    english_planted, english_shards, tmp_path, capsys
):
    corpus, n_planted, n_train = english_planted
    tok = english_shards / "tokenizer"
    m = build(corpus, tok, tmp_path / "clean", "--decontaminate")
    d = m["decontamination"]
    assert d["train_documents_dropped"] == n_planted > 0
    assert d["train_documents_checked"] == n_train + n_planted
    assert m["splits"]["train"]["documents"] == n_train  # every true non-duplicate kept
    assert all(
        e["train"].split()[0] in ("Mirror:", "Copy:", "Reposted:", "Archived:")
        and e["jaccard"] >= 0.8
        for e in d["examples"]
    )
    assert main(["inspect", str(tmp_path / "clean"), "--samples", "0"]) == 0
    assert f"{n_planted} of {n_train + n_planted} training documents" in capsys.readouterr().out

    # check-overlap on the builds: the planted copies are found against an undecontaminated
    # build, and none remain in the decontaminated one.
    dirty = build(corpus, tok, tmp_path / "dirty")
    assert "decontamination" not in dirty
    for target, expected in (("dirty", n_planted), ("clean", 0)):
        capsys.readouterr()
        assert (
            main(
                [
                    "check-overlap",
                    str(english_shards),
                    str(tmp_path / target),
                    "--splits_a",
                    "validation",
                    "--splits_b",
                    "train",
                    "--json",
                ]
            )
            == 0
        )
        report = json.loads(capsys.readouterr().out)
        assert report["b_units_near_duplicate"] == expected, report
        assert report["a_units"] > 0 and report["mb_per_s"] > 0


def test_planted_chinese_near_duplicates_dropped(tmp_path, chinese_shards):
    lines = [
        ln.strip()
        for ln in (DATA / "zh_hongloumeng_sample.txt").read_text(encoding="utf-8").splitlines()
        if ln.strip()
    ]
    all_docs, n_planted, n_train = plant(lines, every=60, tokens=list("甲乙丙丁"))
    corpus = tmp_path / "zh.txt"
    corpus.write_text("\n".join(all_docs) + "\n", encoding="utf-8")
    m = build(
        corpus,
        chinese_shards / "tokenizer",
        tmp_path / "out",
        "--one_doc_per_line",
        "--decontaminate",
        "0.7",
    )
    assert m["decontamination"]["train_documents_dropped"] == n_planted > 0
    assert m["splits"]["train"]["documents"] == n_train
    assert all(re.match(r"[转载摘录]：", e["train"]) for e in m["decontamination"]["examples"])
