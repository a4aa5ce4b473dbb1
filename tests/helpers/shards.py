"""Shard folders for the tests: the one `data_prep build` they use, and a split's token stream."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bertforge.pretrain.config import command_line
from helpers.commands import run_cli


def content_stream(reader) -> np.ndarray:
    """All tokens of a split of a `data_prep.ShardReader`, in order, every [CLS]/[SEP] removed."""
    special = {reader.special_tokens["cls"], reader.special_tokens["sep"]}
    if not len(reader):
        return np.zeros(0, dtype=np.int64)
    ids = np.concatenate([reader[i].input_ids for i in range(len(reader))]).astype(np.int64)
    return ids[~np.isin(ids, list(special))]


def build_shards(corpus: Path, out: Path, **options) -> Path:
    """`python -m data_prep build` of `corpus` into `out`, as the shard fixtures build theirs:
    a 2000-entry WordPiece vocabulary, sequences of 128, 5% validation, 2 workers; `options`
    (flag names as keywords) add to or override them."""
    options = {
        "vocab_size": 2000,
        "max_seq_len": 128,
        "validation_fraction": 0.05,
        "workers": 2,
        **options,
    }
    if options.get("tokenizer"):
        options.pop("vocab_size")
    run_cli(*command_line.data_prep_build(corpus, out, **options)[1:])
    return out


def validation_batch(shards: Path, micro_batch_size: int, **loader_options) -> dict:
    """The first masked batch of `shards`' validation split, as the trainer builds it (one rank,
    fixed masks; `loader_options` such as sentence_order go to `build_loader`), without its
    masking statistics."""
    from bertforge.data_prep.reader import ShardReader
    from bertforge.pretrain.data.loader import DataConfig, build_loader
    from bertforge.pretrain.data.masking import MaskingConfig

    reader = ShardReader(shards, "validation")
    loader = build_loader(
        reader,
        DataConfig(),
        MaskingConfig(),
        micro_batch_size=micro_batch_size,
        train=False,
        **loader_options,
    )
    batch = next(iter(loader))
    batch.pop("masking_stats")
    return batch
