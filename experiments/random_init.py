"""A Hugging Face BERT folder with random weights: the "no pretraining" arm of the learning
benchmarks, the same shape as one of our presets and the same tokenizer as the pretrained arm.

transformers' own ``BertForMaskedLM`` initialisation (normal(0, 0.02), as ours) under a fixed
seed, saved with the tokenizer files beside it, so ``pretrain.evaluate`` loads it like any export.
"""

from __future__ import annotations

from pathlib import Path


def random_init_folder(tokenizer_dir: Path, preset: str, out: Path, seed: int = 0) -> Path:
    """Write a random-init ``BertForMaskedLM`` of ``preset``'s shape with the tokenizer of
    ``tokenizer_dir`` (a folder transformers' ``AutoTokenizer`` reads) into ``out``; a finished
    folder is kept as it is."""
    import transformers

    from benchmarks.common import random_bert_mlm
    from bertforge.files import publish_dir

    if (out / "config.json").is_file():
        return out
    tok = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
    model = random_bert_mlm(preset, len(tok), seed, pad_token_id=tok.pad_token_id)
    with publish_dir(out) as tmp:  # all or nothing: a killed benchmark leaves no half folder
        model.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
    return out
