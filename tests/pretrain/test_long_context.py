"""Shards longer than the position table: a ModernBERT from scratch takes their length (rotary
positions, nothing to grow) and says so; a BERT is refused before any rendezvous, the message
naming the flags that fix it."""

from __future__ import annotations

import json

import pytest
from helpers.shards import build_shards

from bertforge.errors import USER_ERROR_EXIT
from bertforge.pretrain.main import main


@pytest.fixture(scope="module")
def shards_1024(english_shards, english_corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("shards_1024") / "shards"
    return build_shards(
        english_corpus, out, max_seq_len=1024, tokenizer=english_shards / "tokenizer"
    )


def test_modernbert_from_scratch_takes_the_shards_length(shards_1024, capsys):
    assert main(["--data", str(shards_1024), "--arch", "modernbert", "--dry-run", "--json"]) == 0
    out = capsys.readouterr().out
    assert "max_position_embeddings 512 -> 1024, the shards' max_seq_len" in out
    resolved = json.loads(out[out.index("{") :])
    assert resolved["config"]["model"]["max_position_embeddings"] == 1024


def test_bert_beyond_its_position_table_names_the_fix(shards_1024, capsys):
    assert main(["--data", str(shards_1024), "--dry-run"]) == USER_ERROR_EXIT
    err = capsys.readouterr().err
    assert "exceeds BERT's learned position table (--max_position_embeddings 512)" in err
    assert "--max_seq_len 512 or less" in err and "--arch modernbert" in err
    # the named fix works: a longer table from scratch
    assert main(["--data", str(shards_1024), "--dry-run", "--max_position_embeddings", "1024"]) == 0
