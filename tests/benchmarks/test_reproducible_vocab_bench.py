"""The reproducible-vocabulary benchmark (`python -m benchmarks.data.reproducible_vocab`) on the
built-in corpora, two runs an arm: both arms timed, the reproducible arm wrote one tokenizer and
one shard set, the ratios printed."""

from __future__ import annotations

import json

from helpers.commands import DATA

from benchmarks.data import reproducible_vocab
from bertforge.data_prep.sample_corpus import write_english_corpus


def test_the_benchmark_times_both_arms_and_the_workaround_repeats_itself(tmp_path, capsys):
    english = write_english_corpus(tmp_path / "en.txt", max_docs=20)
    out = tmp_path / "reproducible_vocab.json"
    argv = ["--english", str(english), "--chinese", str(DATA / "zh_hongloumeng_sample.txt")]
    argv += ["--runs", "2", "--workers", "1", "--vocab_size", "1000", "--json", str(out)]
    assert reproducible_vocab.main(argv) == 0
    res = json.loads(out.read_text())
    assert [r["corpus"] for r in res["results"]] == ["en.txt", "zh_hongloumeng_sample.txt"]
    for r in res["results"]:
        for arm in reproducible_vocab.ARMS:
            a = r[arm]
            assert 0 < a["min_seconds"] <= a["median_seconds"] <= a["max_seconds"]
            assert 0 < a["median_training_seconds"] < a["median_seconds"]
        assert r["reproducible"]["different_tokenizers"] == 1
        assert r["reproducible"]["different_shards"] == 1
        assert r["ratio_median_seconds"] > 0
    assert capsys.readouterr().out.count("reproducible / upstream: build x") == 2
