"""An exported folder works in transformers as a published BERT does: its tokenizer knows the
trained length (``truncation=True`` and the fill-mask pipeline take a text of any length), BERT
classes with a pooler load without MISSING weights (the masked-LM run's pooler is initialised and
marked untrained), and its model card names no absolute path of the training machine."""

from __future__ import annotations

import json
import re

import pytest
import transformers
from helpers.commands import train_cli

from bertforge.pretrain.export.hf_export import export

pytestmark = pytest.mark.slow
TRAINED = 128  # the english_shards fixture's --max_seq_len


def _long_text(mask: str) -> str:
    from pydoc_data.topics import topics

    return f"The function returns a {mask} of values. " + " ".join(topics.values())[:8000]


@pytest.fixture(scope="module", params=["bert", "modernbert"])
def exported(request, english_shards, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"usable_{request.param}")
    sizes = ("--global_batch_size", "2", "--micro_batch_size", "2", "--eval_batches", "1")
    train_cli(
        folder / "run", "--data", str(english_shards), "--arch", request.param, *sizes,
        "--max_steps", "1",
    )  # fmt: skip
    export(folder / "run", folder / "hf")
    return request.param, folder / "hf"


def test_the_tokenizer_knows_the_trained_length(exported):
    _, hf = exported
    config = json.loads((hf / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["model_max_length"] == TRAINED
    tok = transformers.AutoTokenizer.from_pretrained(str(hf))
    text = _long_text(tok.mask_token)
    assert len(tok(text)["input_ids"]) > 647
    assert len(tok(text, truncation=True)["input_ids"]) == TRAINED
    fill = transformers.pipeline("fill-mask", model=str(hf), device="cpu")
    preds = fill(text, top_k=3, tokenizer_kwargs={"truncation": True})
    assert len(preds) == 3 and all(0 <= p["score"] <= 1 for p in preds)


def test_classes_with_a_pooler_load_without_missing_weights(exported):
    arch, hf = exported
    seq_cls = transformers.AutoModelForSequenceClassification
    _, info = seq_cls.from_pretrained(str(hf), num_labels=2, output_loading_info=True)
    assert info["missing_keys"] == {"classifier.weight", "classifier.bias"}  # the task head only
    _, info = transformers.AutoModel.from_pretrained(str(hf), output_loading_info=True)
    assert not info["missing_keys"]
    config = json.loads((hf / "config.json").read_text(encoding="utf-8"))
    card = (hf / "README.md").read_text(encoding="utf-8")
    if arch == "bert":  # the untrained pooler is said to be so
        assert "untrained" in config["bertforge_pooler"]
        assert "- pooler: initialised at export, untrained" in card
    else:
        assert "bertforge_pooler" not in config and "pooler" not in card


def test_the_model_card_names_no_absolute_path(exported):
    _, hf = exported
    card = (hf / "README.md").read_text(encoding="utf-8")
    root = str(hf.parent)
    assert root not in card and "/tmp/" not in card, card
    assert "python pretrain/main.py --ds_config ds_configs/cpu.json --output_dir . " in card
    assert re.search(r"--data \.\./\.\./shards_en\d*/shards ", card), card  # beside the run
    assert f"model_max_length {TRAINED}" in card
