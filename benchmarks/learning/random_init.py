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
    import torch
    import transformers

    from bertforge.files import publish_dir
    from pretrain.model.model_config import PRESETS

    if (out / "config.json").is_file():
        return out
    shape = PRESETS[preset]
    tok = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
    conf = transformers.BertConfig(
        vocab_size=len(tok),
        hidden_size=shape.hidden_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        intermediate_size=shape.intermediate_size,
        max_position_embeddings=shape.max_position_embeddings,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    model = transformers.BertForMaskedLM(conf)
    with publish_dir(out) as tmp:  # all or nothing: a killed benchmark leaves no half folder
        model.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
    return out
