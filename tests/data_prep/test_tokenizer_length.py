"""A shard folder's tokenizer knows the build's sequence length: ``model_max_length`` is
--max_seq_len, so ``truncation=True`` cuts a long text to what the shards (and a model trained on
them) hold, whether the build trained the vocabulary or imported one that said 1e30 or 512."""

from __future__ import annotations

import json
import shutil

from helpers.shards import build_shards
from transformers import AutoTokenizer


def _long_text() -> str:
    from pydoc_data.topics import topics

    return " ".join(topics.values())[:20000]  # thousands of tokens


def _saved_length(tokenizer_dir) -> int:
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    return config["model_max_length"]


def test_a_trained_vocabulary_says_the_builds_length(english_shards):
    assert _saved_length(english_shards / "tokenizer") == 128  # build_shards' --max_seq_len
    tok = AutoTokenizer.from_pretrained(str(english_shards / "tokenizer"))
    assert len(tok(_long_text())["input_ids"]) > 1000
    assert len(tok(_long_text(), truncation=True)["input_ids"]) == 128


def test_an_imported_tokenizer_takes_the_builds_length(english_shards, tmp_path):
    source = tmp_path / "published"
    shutil.copytree(english_shards / "tokenizer", source)
    config = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["model_max_length"] = 512  # what bert-base says; 1e30 where none was set
    (source / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(_long_text()[:6000], encoding="utf-8")
    out = build_shards(
        corpus, tmp_path / "shards", tokenizer=str(source), max_seq_len=64, workers=1
    )
    assert _saved_length(out / "tokenizer") == 64
    tok = AutoTokenizer.from_pretrained(str(out / "tokenizer"))
    assert len(tok(_long_text(), truncation=True)["input_ids"]) == 64
