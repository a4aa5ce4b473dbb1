"""A tiny BERT Hugging Face folder built with transformers itself, for evaluation/attention tests.

The WordPiece vocabulary is trained on text that ships with CPython (pydoc topics) and with the
project (the 《红楼梦》 sample), so English and Chinese sentences both tokenize to real pieces.
"""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data"


def build_tiny_bert(
    folder: Path,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 2,
    seed: int = 0,
    extra_texts: tuple[Path, ...] = (),
) -> Path:
    """Write a randomly initialised BertForMaskedLM + its tokenizer into ``folder``; the
    vocabulary also covers the ``extra_texts`` files (a task's own text, say)."""
    from pydoc_data.topics import topics

    import torch
    import transformers
    from tokenizers import BertWordPieceTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    files = (DATA / "zh_hongloumeng_sample.txt", *extra_texts)
    text = list(topics.values()) + [line for f in files for line in f.read_text("utf-8").split()]
    wp = BertWordPieceTokenizer(lowercase=True)
    wp.train_from_iterator(text, vocab_size=3000, min_frequency=2)
    wp.save_model(str(folder))
    tok = transformers.BertTokenizerFast.from_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    conf = transformers.BertConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=2 * hidden,
        max_position_embeddings=256,
    )
    torch.manual_seed(seed)
    transformers.BertForMaskedLM(conf).save_pretrained(str(folder))
    return folder
