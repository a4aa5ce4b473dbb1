"""A published tokenizer file with truncation and padding switched on (as many are, e.g.
sentence-transformers' all-MiniLM-L6-v2 at 128): the build keeps every token of the text, stores
no [PAD], says once what it turned off, and saves the tokenizer without those settings."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
from helpers.commands import run_cli
from helpers.shards import build_shards, content_stream
from tokenizers import Tokenizer

from bertforge.data_prep.reader import ShardReader


def _with_truncation_and_padding(tokenizer_dir: Path, out: Path, length: int) -> Path:
    shutil.copytree(tokenizer_dir, out)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    tok.enable_truncation(max_length=length)
    tok.enable_padding(length=length, pad_id=tok.token_to_id("[PAD]"), pad_token="[PAD]")
    tok.save(str(out / "tokenizer.json"))
    return out


def test_build_keeps_every_token_and_stores_no_pad(chinese_shards, chinese_corpus, tmp_path):
    published = _with_truncation_and_padding(chinese_shards / "tokenizer", tmp_path / "tok", 16)
    out = tmp_path / "shards"
    proc = run_cli(
        "-m", "data_prep", "build", "--input", str(chinese_corpus), "--output", str(out),
        "--tokenizer", str(published), "--max_seq_len", "128", "--validation_fraction", "0.05",
        "--one_doc_per_line", "--workers", "1",
    )  # fmt: skip
    warning = [line for line in proc.stdout.splitlines() if "switched on" in line]
    assert len(warning) == 1 and warning[0].startswith("[data_prep] WARNING: --tokenizer")
    assert "truncation (max_length 16)" in warning[0] and "padding (to 16)" in warning[0]

    # The same text through the same vocabulary without those settings: the reference stream.
    reference = build_shards(
        chinese_corpus, tmp_path / "reference", tokenizer=str(chinese_shards / "tokenizer"),
        one_doc_per_line=True, workers=1,
    )  # fmt: skip
    for split in ("train", "validation"):
        got, want = ShardReader(out, split=split), ShardReader(reference, split=split)
        np.testing.assert_array_equal(content_stream(got), content_stream(want))
        pad = got.special_tokens["pad"]
        assert not any((got[i].input_ids == pad).any() for i in range(len(got)))
    saved = json.loads((out / "tokenizer" / "tokenizer.json").read_text(encoding="utf-8"))
    assert saved["truncation"] is None and saved["padding"] is None
