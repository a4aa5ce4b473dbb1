"""A tiny BERT (or ModernBERT) Hugging Face folder built with transformers itself, for
evaluation, attention and --init_from tests.

The WordPiece vocabulary is trained on text that ships with CPython (pydoc topics) and with the
project (the 《红楼梦》 sample), so English and Chinese sentences both tokenize to real pieces.
"""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data"


def tiny_tokenizer(folder: Path, extra_texts: tuple[Path, ...] = ()):
    """Train a WordPiece vocabulary into ``folder`` and return its BertTokenizerFast (saved)."""
    from pydoc_data.topics import topics

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
    return tok


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
    import torch
    import transformers

    tok = tiny_tokenizer(folder, extra_texts)
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


def build_tiny_modernbert(folder: Path, seed: int = 0, tokenizer_dir: Path | None = None) -> Path:
    """Write a randomly initialised ModernBertForMaskedLM (3 layers: global, local, local with
    an 8-token window) + a tokenizer into ``folder``: the tokenizer of ``tokenizer_dir`` when
    given, else a new one as :func:`build_tiny_bert` trains it."""
    import torch
    import transformers

    if tokenizer_dir is None:
        tok = tiny_tokenizer(folder)
    else:
        tok = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
        tok.save_pretrained(str(folder))
    conf = transformers.ModernBertConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=2,
        max_position_embeddings=256,
        local_attention=8,
        global_attn_every_n_layers=3,
        pad_token_id=tok.pad_token_id,
        cls_token_id=tok.cls_token_id,
        sep_token_id=tok.sep_token_id,
        bos_token_id=tok.cls_token_id,
        eos_token_id=tok.sep_token_id,
    )
    torch.manual_seed(seed)
    transformers.ModernBertForMaskedLM(conf).save_pretrained(str(folder))
    return folder
