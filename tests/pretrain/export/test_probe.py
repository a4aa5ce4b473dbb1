"""The export's check probes a passage of the run's own held-out data (issue 55's second pass: a
Chinese model was checked on an English sentence about functions): the text, the masked word."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from bertforge.data_prep.reader import ShardReader
from bertforge.pretrain.export.probe import (
    FALLBACK_TEXT,
    PROBE_PIECES,
    held_out_text,
    mask_one_word,
)


def _state(data) -> dict:
    return {"config": {"run": {"data_sources": [str(data)]}}}


@pytest.mark.parametrize("shards", ["english_shards", "chinese_shards"])
def test_the_probe_is_held_out_text_of_the_runs_data_with_one_word_masked(shards, request):
    data = request.getfixturevalue(shards)
    tok = AutoTokenizer.from_pretrained(str(data / "tokenizer"))
    probe = held_out_text(_state(data), tok)
    assert probe.source == f"validation text of {data}"
    assert probe.text != FALLBACK_TEXT and "[SEP]" not in probe.text and "[CLS]" not in probe.text
    pieces = tok.tokenize(probe.text)
    assert 0 < len(pieces) <= PROBE_PIECES + 2  # re-tokenising may split a piece differently
    # the passage is one of the held-out sequences, as the tokenizer writes it back
    held_out = ShardReader(data, "validation", verify="none")
    n = min(len(held_out), 16)
    stored = [tok.convert_ids_to_tokens(held_out[i].input_ids.tolist()) for i in range(n)]
    assert any(" ".join(pieces) in " ".join(s) for s in stored)
    if shards == "chinese_shards":
        assert " " not in probe.text  # the decoder's spaces between characters are gone
    masked, word = mask_one_word(tok, probe.text)
    assert masked.count(tok.mask_token) == 1 and word.strip() and word in probe.text
    assert masked.replace(tok.mask_token, word) == probe.text
    assert tok.tokenize(word) == [tok.tokenize(word)[0]]  # one piece: fill-mask can name it


def test_a_run_whose_data_is_gone_is_probed_on_the_fixed_sentence_and_says_why(
    english_shards, tmp_path
):
    tok = AutoTokenizer.from_pretrained(str(english_shards / "tokenizer"))
    probe = held_out_text(_state(tmp_path / "moved"), tok)
    assert probe.text == FALLBACK_TEXT and "is not readable here" in probe.source
    masked, word = mask_one_word(tok, FALLBACK_TEXT)
    assert masked.replace(tok.mask_token, word) == FALLBACK_TEXT and word.isalpha()
