"""The key-sentence benchmark (`python -m benchmarks.data.key_sentences`) on the built-in corpora
(a few pydoc topics, the Chinese sample), one run an arm: both arms timed, the ratio printed."""

from __future__ import annotations

import json

from helpers.commands import DATA

from benchmarks.data import key_sentences
from bertforge.data_prep.sample_corpus import write_english_corpus


def test_the_benchmark_times_both_arms_on_the_sample_corpora(tmp_path, capsys):
    english = write_english_corpus(tmp_path / "en.txt", max_docs=6)
    out = tmp_path / "key_sentences.json"
    argv = ["--english", str(english), "--chinese", str(DATA / "zh_hongloumeng_sample.txt")]
    argv += ["--runs", "1", "--workers", "1", "--vocab_size", "500", "--json", str(out)]
    assert key_sentences.main(argv) == 0
    res = json.loads(out.read_text())
    assert [r["corpus"] for r in res["results"]] == ["en.txt", "zh_hongloumeng_sample.txt"]
    for r in res["results"]:
        assert r["input_tokens"] > 1000
        for arm in ("plain", "key"):
            a = r[arm]
            assert 0 < a["min_seconds"] <= a["median_seconds"] <= a["max_seconds"]
        assert r["tokens_per_s_ratio"] > 0
        assert r["key_sentences_kept"]["documents_shortened"] > 0
    printed = capsys.readouterr().out
    assert printed.count("key / plain: tokens/s x") == 2
