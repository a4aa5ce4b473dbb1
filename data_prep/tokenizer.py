"""The build's tokenizer: train a BERT WordPiece vocabulary or load one, save it in HF form.

Build workers use the raw `tokenizers.Tokenizer` from `OUT/tokenizer/tokenizer.json` (fast to
load, no transformers import); transformers is used once, in the main process, so that the saved
folder is exactly what `AutoTokenizer.from_pretrained` expects.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from bertforge.errors import UserError
from bertforge.files import publish_dir
from bertforge.logs import get_logger

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
SPECIAL_KEYS = ("cls", "sep", "pad", "mask", "unk")


log = get_logger(__name__)


def plain_encoding(tok: Tokenizer) -> list[str]:
    """Turn off the truncation and padding a tokenizer file may carry (many published
    ``tokenizer.json`` files cut every text at 128 or 512 tokens and pad it with [PAD]); returns
    what was on, so the caller can say so once. Data preparation and the vocabulary checks need
    every token of the text and nothing else."""
    found = []
    if tok.truncation:
        found.append(f"truncation (max_length {tok.truncation.get('max_length')})")
        tok.no_truncation()
    if tok.padding:
        length = tok.padding.get("length")
        found.append(f"padding ({'to ' + str(length) if length else 'to the longest'})")
        tok.no_padding()
    return found


class TokenizerError(UserError, ValueError):
    """A tokenizer that cannot be used; the message names the path and what to do."""


@dataclass(frozen=True)
class TokenizerInfo:
    """What the manifest and the workers need to know about the saved tokenizer."""

    path: Path  # OUT/tokenizer
    fingerprint: str  # sha256 over vocabulary, normalizer, pre-tokenizer and model settings
    vocab_size: int
    lowercase: bool
    special_tokens: dict[str, int]  # cls, sep, pad, mask, unk -> id


def train_wordpiece(
    texts: Iterable[str] | Callable[[], Iterable[str]],
    vocab_size: int,
    lowercase: bool,
    out_dir: Path,
    min_frequency: int = 2,
    max_length: int | None = None,
) -> None:
    """Train BERT's WordPiece pipeline on `texts` and save it as a HF folder whose
    ``model_max_length`` is ``max_length`` (the build's --max_seq_len). The same texts and
    arguments give the same files, byte for byte (:func:`continuation_pieces`). `texts` is read
    twice: a list, or a function that returns a fresh iterable (a stream of the input files)."""
    passes = _rereadable(texts)
    pieces = continuation_pieces(passes(), lowercase)
    tok = _bert_wordpiece(lowercase)
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[*SPECIAL_TOKENS, *pieces],
        continuing_subword_prefix="##",
        show_progress=False,
    )
    tok.train_from_iterator(passes(), trainer=trainer)
    tok = _drop_added(tok, set(pieces))
    warn_if_smaller(tok.get_vocab_size(with_added_tokens=True), vocab_size, min_frequency)
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    with tempfile.TemporaryDirectory() as tmp:
        tok.save(str(Path(tmp) / "tokenizer.json"))
        # Lazy: transformers takes seconds to import; only this path needs it.
        from transformers import BertTokenizerFast

        hf = BertTokenizerFast(
            tokenizer_file=str(Path(tmp) / "tokenizer.json"),
            do_lower_case=lowercase,
            unk_token="[UNK]",
            sep_token="[SEP]",
            pad_token="[PAD]",
            cls_token="[CLS]",
            mask_token="[MASK]",
            tokenize_chinese_chars=True,
        )
        _save_hf(hf, out_dir, max_length)


def _bert_wordpiece(lowercase: bool) -> Tokenizer:
    """An untrained tokenizer with BERT's normalizer, pre-tokenizer and decoder."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
    # As BertWordPieceTokenizer: CJK characters become single-character words; accents are
    # stripped only when lowercasing (BERT uncased).
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def _rereadable(texts: Iterable[str] | Callable[[], Iterable[str]]) -> Callable[[], Iterable[str]]:
    if callable(texts):
        return texts
    if iter(texts) is texts:
        raise TypeError(
            "train_wordpiece reads the texts twice: pass a list, or a function that returns a "
            "fresh iterable, not a one-pass iterator"
        )
    return lambda: texts


def continuation_pieces(texts: Iterable[str], lowercase: bool) -> list[str]:
    """The ``##c`` piece of every character that follows another inside a word, sorted.

    Why (huggingface/tokenizers#1794, docs/data.md "What is reproducible"): the WordPiece
    trainer (its BPE trainer underneath) gives each ``##c`` piece its id in the order it meets
    the piece while iterating a hash map of the words, and that order changes from process to
    process. Merges of equal count are then ranked by those ids, so two trainings on the same
    text pick different merges. Passing these pieces, sorted, as special tokens puts them in
    the vocabulary first, in this order; the trainer then creates none itself. Finding them
    takes one pass of the trainer with no merges (the same normalizer and pre-tokenizer)."""
    probe = _bert_wordpiece(lowercase)
    trainer = trainers.WordPieceTrainer(
        vocab_size=0, special_tokens=[], continuing_subword_prefix="##", show_progress=False
    )
    probe.train_from_iterator(texts, trainer=trainer)
    # vocab_size 0: no merges, so every "##" entry is one character's piece (kept as a guard).
    return sorted(t for t in probe.get_vocab() if t.startswith("##") and len(t) == 3)


def _drop_added(tok: Tokenizer, contents: set[str]) -> Tokenizer:
    """``tok`` without the added (special) tokens in ``contents``; their vocabulary entries and
    ids stay. The ``##c`` pieces were special only to fix their ids: as special tokens they
    would be matched in text and dropped on decoding."""
    spec = json.loads(tok.to_str())
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] not in contents]
    return Tokenizer.from_str(json.dumps(spec))


def warn_if_smaller(trained: int, asked: int, min_frequency: int) -> None:
    """Say so when the trained vocabulary is smaller than ``--vocab_size``: WordPiece adds a
    merged piece only while some pair of adjacent pieces occurs ``min_frequency`` times or more,
    so a corpus with few distinct words runs out of pieces before the size asked for."""
    if trained >= asked:
        return
    log.warning(
        f"the trained vocabulary has {trained} entries, fewer than --vocab_size {asked}: the "
        "training documents have too few distinct words and word pieces (WordPiece adds a "
        "piece only while a pair of adjacent pieces occurs at least --min_frequency "
        f"{min_frequency} times, and no such pair was left). The build goes on with {trained} "
        "entries; a larger corpus or a lower --min_frequency gives more."
    )


def import_tokenizer(
    source: Path,
    lowercase: bool | None,
    out_dir: Path,
    *,
    quiet: bool = False,
    max_length: int | None = None,
) -> None:
    """Copy an existing tokenizer (HF folder or BERT vocab.txt) into `out_dir` in HF form,
    truncation and padding off (said unless ``quiet``: a caller that imported it before);
    ``max_length`` (the build's --max_seq_len) replaces its ``model_max_length``."""
    # Lazy: transformers takes seconds to import; only this path needs it.
    from transformers import AutoTokenizer, BertTokenizerFast

    if not source.exists():
        raise TokenizerError(f"--tokenizer {source} does not exist.")
    if source.is_file():
        # transformers 5: BertTokenizerFast(vocab_file=...) ignores the file; load a folder.
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(source, Path(tmp) / "vocab.txt")
            hf = BertTokenizerFast.from_pretrained(
                tmp, do_lower_case=True if lowercase is None else lowercase
            )
    else:
        try:
            hf = AutoTokenizer.from_pretrained(str(source))
        except Exception as e:  # transformers raises many types for a bad folder
            raise TokenizerError(
                f"--tokenizer {source}: not a loadable HF tokenizer folder "
                f"({type(e).__name__}: {e})."
            ) from e
    if not getattr(hf, "is_fast", False):
        raise TokenizerError(f"--tokenizer {source}: needs a fast (tokenizers) tokenizer.")
    model_type = json.loads(hf.backend_tokenizer.to_str())["model"]["type"]
    if model_type != "WordPiece":
        raise TokenizerError(
            f"--tokenizer {source}: a {model_type} tokenizer; data_prep needs a "
            "BERT WordPiece one (whole-word units come from its ## pieces). "
            "Train one with --vocab_size instead."
        )
    missing = [k for k in SPECIAL_KEYS if getattr(hf, f"{k}_token", None) is None]
    if missing:
        raise TokenizerError(
            f"--tokenizer {source}: lacks the special tokens {missing} a BERT masked-LM needs."
        )
    switched_off = plain_encoding(hf.backend_tokenizer)
    if switched_off and not quiet:
        log.warning(
            f"--tokenizer {source}: its tokenizer file has {' and '.join(switched_off)} "
            "switched on; data_prep turns them off (every document is kept whole and no [PAD] "
            "is stored) and saves the tokenizer without them"
        )
    _save_hf(hf, out_dir, max_length)


def _write_hf(hf, folder: Path) -> None:
    """save_pretrained into ``folder``; raises TokenizerError when no tokenizer.json came out."""
    hf.save_pretrained(str(folder))
    if not (folder / "tokenizer.json").is_file():
        raise TokenizerError(f"saving the tokenizer produced no tokenizer.json in {folder}.")


def _save_hf(hf, out_dir: Path, max_length: int | None = None) -> None:
    """Save as ``out_dir``, published only once it holds a tokenizer.json. ``max_length``: the
    ``model_max_length`` it says (transformers' default, 1e30, makes ``truncation=True`` cut
    nothing, so a long text overruns the model's positions)."""
    if max_length is not None:
        hf.model_max_length = int(max_length)
    with publish_dir(out_dir) as tmp:
        _write_hf(hf, tmp)


def _special_ids(tok_dir: Path, tok: Tokenizer) -> dict[str, int]:
    cfg_path = tok_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8")) if cfg_path.is_file() else {}
    ids = {}
    for key, default in zip(SPECIAL_KEYS, ("[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]")):
        name = cfg.get(f"{key}_token", default)
        if isinstance(name, dict):  # older configs store AddedToken dicts
            name = name.get("content", default)
        tid = tok.token_to_id(name)
        if tid is None:
            raise TokenizerError(
                f"{tok_dir}: special token {name!r} ({key}) is not in the vocabulary."
            )
        ids[key] = tid
    return ids


def describe(tok_dir: Path) -> TokenizerInfo:
    """Fingerprint, vocabulary size, lowercasing and special ids of a saved tokenizer folder."""
    path = tok_dir / "tokenizer.json"
    if not path.is_file():
        raise TokenizerError(f"{path} not found; the tokenizer folder is incomplete.")
    tok = Tokenizer.from_file(str(path))
    spec = json.loads(tok.to_str())
    model = spec.get("model", {})
    vocab = sorted(tok.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
    keyed = {
        "vocab": vocab,
        "normalizer": spec.get("normalizer"),
        "pre_tokenizer": spec.get("pre_tokenizer"),
        "model": {k: v for k, v in model.items() if k != "vocab"},
    }
    fingerprint = hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()
    lowercase = _lowercases(spec.get("normalizer"))
    return TokenizerInfo(
        tok_dir,
        fingerprint,
        tok.get_vocab_size(with_added_tokens=True),
        lowercase,
        _special_ids(tok_dir, tok),
    )


def _lowercases(normalizer: dict | None) -> bool:
    if not normalizer:
        return False
    if normalizer.get("type") == "Lowercase" or normalizer.get("lowercase") is True:
        return True
    return any(_lowercases(n) for n in normalizer.get("normalizers", []) or [])


def continuation_flags(tok: Tokenizer, prefix: str = "##"):
    """Boolean array over ids: True for WordPiece continuation pieces (`##...`)."""
    flags = np.zeros(tok.get_vocab_size(with_added_tokens=True), dtype=bool)
    for token, tid in tok.get_vocab(with_added_tokens=True).items():
        if token.startswith(prefix) and len(token) > len(prefix):
            flags[tid] = True
    return flags
