"""What ``python -m pretrain.export`` says of its check (issue 55): each fill-mask line with its
sentence; for an RTD export (``ElectraForPreTraining``, no masked LM) the discriminator's
replaced-token detection on a sentence, and fill-mask said to be the generator's."""

from __future__ import annotations

import torch
from transformers import AutoTokenizer

from bertforge.pretrain.export.probe import FALLBACK_TEXT as DETECTION_SENTENCE
from bertforge.pretrain.export.verify import check_lines, detect_replaced


class _Discriminator:
    """Stands in for a discriminator: logit +3 ("replaced") at ``hot``, -3 elsewhere."""

    def __init__(self, hot: int) -> None:
        self.hot = hot

    def eval(self):
        return self

    def __call__(self, input_ids, **_):
        logits = torch.full(input_ids.shape, -3.0)
        logits[0, self.hot] = 3.0
        return type("Out", (), {"logits": logits})()


def test_a_fill_mask_line_names_its_sentence():
    preds = [{"token_str": "list", "score": 0.5}, {"token_str": "tuple", "score": 0.25}]
    sentence = "The function returns a [MASK] of values."
    res = {"fill_mask": [{"sentence": sentence, "answer": "list", "predictions": preds}]}
    assert check_lines(res) == [
        f"  fill-mask on {sentence!r} (the word: 'list'): 'list' 0.500, 'tuple' 0.250"
    ]


def test_an_rtd_export_shows_the_detection_and_the_generators_fill_mask(english_shards):
    tok = AutoTokenizer.from_pretrained(str(english_shards / "tokenizer"))
    ids = tok(DETECTION_SENTENCE)["input_ids"]
    real = len(ids) - 2  # [CLS] ... [SEP]
    middle = 1 + real // 2  # the piece detect_replaced replaces
    det = detect_replaced(_Discriminator(hot=middle), tok, DETECTION_SENTENCE)
    assert len(det["pieces"]) == real and det["replaced"]["position"] == real // 2
    assert det["replaced"]["original"] == tok.convert_ids_to_tokens(ids[middle])
    assert det["replaced"]["by"] == tok.convert_ids_to_tokens(ids[1])  # the first piece
    assert det["sentence"] != tok.decode(ids, skip_special_tokens=True)
    preds = [{"token_str": "x", "score": 0.125}]
    fill = {"sentence": "a [MASK] b", "answer": "y", "predictions": preds}
    lines = check_lines({"detection": det, "fill_mask": [fill], "generator": "OUT/generator"})
    assert lines[0].startswith(f"  replaced-token detection on {det['sentence']!r} (")
    assert f"P(replaced) of that token 0.95, rank 1 of the {real} pieces" in lines[0]
    assert lines[0].endswith(f"called replaced (P > 0.5): {det['replaced']['by']!r} 0.95")
    assert lines[1] == (
        "  fill-mask (the generator, OUT/generator) on 'a [MASK] b' (the word: 'y'): 'x' 0.125"
    )
    # ModernBERT's RTD exports no generator: no masked LM to fill with, and it says so
    (line,) = check_lines({"detection": det, "fill_mask": []})[1:]
    assert line.startswith("  fill-mask: none (a discriminator is no masked LM")
