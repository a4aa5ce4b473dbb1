"""Attention maps: PNGs and per-head statistics for an English and a Chinese sentence."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from helpers.tiny_bert import build_tiny_bert

from bertforge.pretrain.attention import attention_maps, cjk_font, head_stats, main


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("tiny_att") / "bert", layers=2, heads=2)


def test_head_stats_of_known_patterns():
    ids = [101, 7, 8, 9, 102]
    ident = head_stats(np.eye(5), ids, cls_id=101, sep_id=102)
    assert ident["to_self"] == 1.0 and ident["entropy"] == 0.0 and ident["to_prev"] == 0.0
    assert ident["to_cls"] == pytest.approx(1 / 5)  # only [CLS] itself attends to [CLS]
    shifted = np.eye(5, k=-1)  # every token attends to the previous one, [CLS] to itself
    shifted[0, 0] = 1.0
    prev = head_stats(shifted, ids, 101, 102)
    assert prev["to_prev"] == 1.0 and prev["to_next"] == 0.0 and prev["to_self"] == 0.2
    uniform = head_stats(np.full((5, 5), 0.2), ids, 101, 102)
    assert uniform["entropy"] == pytest.approx(math.log(5)) == uniform["entropy_max"]
    assert uniform["to_cls"] == pytest.approx(0.2) and uniform["to_sep"] == pytest.approx(0.2)


def test_english_sentence(tiny, tmp_path):
    res = attention_maps(str(tiny), "The function returns a list of values.", tmp_path)
    assert res["labels"] == res["tokens"] and res["tokens"][0] == "[CLS]"
    assert len(res["heads"]) == 4  # 2 layers x 2 heads
    for h in res["heads"]:
        assert (tmp_path / h["png"]).stat().st_size > 1000
        assert 0.0 <= h["entropy"] <= h["entropy_max"] + 1e-9
        assert 0.0 <= h["to_cls"] <= 1.0 and 0.0 <= h["to_prev"] <= 1.0
    saved = json.loads((tmp_path / "attention_stats.json").read_text(encoding="utf-8"))
    assert saved["heads"] == res["heads"]


def test_chinese_sentence_font_or_clear_fallback(tiny, tmp_path, capsys):
    text = "宝玉笑道：林妹妹来了"
    if cjk_font() is None:
        res = attention_maps(str(tiny), text, tmp_path, layers="1", heads="0")
        assert "[pretrain] WARNING: no font with Chinese glyphs" in capsys.readouterr().out
        chinese = [lab for lab in res["labels"] if "\\u" in lab]
        assert chinese and all(lab.split(":")[0].isdigit() for lab in chinese)
    else:
        res = attention_maps(str(tiny), text, tmp_path, layers="1", heads="0")
        assert res["labels"] == res["tokens"] and res["font"] == cjk_font()
    assert "林" in res["tokens"]
    assert [(h["layer"], h["head"]) for h in res["heads"]] == [(1, 0)]
    assert (tmp_path / "layer01_head00.png").is_file()


def test_bad_layer_is_an_error(tiny, tmp_path, capsys):
    assert main([str(tiny), "--text", "a b", "--out", str(tmp_path), "--layers", "0,7"]) == 2
    assert "the model has 2 layers" in capsys.readouterr().err


def test_modernbert_folder_shows_its_sliding_window(tmp_path):
    """A ModernBERT folder (transformers' own, 3 layers: global, then two with an 8-token
    window): its local layers put no attention outside |q - k| <= 4, its global layer does."""
    from helpers.tiny_bert import build_tiny_modernbert

    from bertforge.pretrain.attention import attention_weights, load_model

    folder = build_tiny_modernbert(tmp_path / "mb")
    text = "The function returns a list of values, then raises an error when the list is empty."
    res = attention_maps(str(folder), text, tmp_path / "out", heads="0")
    assert res["layer_kinds"] == ["full", "window 8", "window 8"]
    assert [h["kind"] for h in res["heads"]] == res["layer_kinds"]
    model, tok, _ = load_model(str(folder), tmp_path / "model")
    ids, att = attention_weights(model, tok, text)
    n = len(ids)
    assert n > 12 and att.shape == (3, 2, n, n)
    far = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :]) > 4
    np.testing.assert_allclose(att.sum(-1), 1.0, rtol=1e-6)
    assert att[1:, :, far].max() == 0.0 and att[0, :, far].min() > 0.0
    local, full = res["heads"][1]["reach"], res["heads"][0]["reach"]
    assert local <= 4.0 < full
