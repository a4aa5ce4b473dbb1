"""What a build is: its arguments (:class:`BuildConfig`, from which `bertforge prep build`'s
flags are generated), their checks, and the build key that a resumed build must match exactly."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bertforge.cli import checked, opt
from bertforge.data_prep.decontam import NUM_PERM, SHINGLE
from bertforge.data_prep.inputs import InputConfig
from bertforge.data_prep.key_sentences import METHOD as KEY_SENTENCES_METHOD
from bertforge.data_prep.layout import FORMAT_VERSION, TOKENIZER_DIR
from bertforge.data_prep.progress import normalize_mode
from bertforge.data_prep.sequences import SequenceConfig
from bertforge.data_prep.tokenizer import describe
from bertforge.errors import UserError


class BuildError(UserError, ValueError):
    """A build that cannot start or finish; the message says what to do."""


@dataclass(frozen=True)
class BuildConfig:
    """Arguments of one build (the CLI flags of `bertforge prep build`, generated from these
    fields by data_prep.__main__; each field's help is its flag's)."""

    inputs: tuple[str, ...] = opt(
        help="text/.jsonl/.parquet/.csv/.tsv files (optionally .gz/.zst), folders, globs, or "
        "a dataset saved with datasets' save_to_disk",
        flags=("--input",),
        metavar="PATH",
    )
    output: Path = opt(help="output folder")
    tokenizer: str | None = opt(
        None,
        "existing HF tokenizer folder or BERT vocab.txt",
        exclusive="tokenizer",
        default_text="none: train a WordPiece vocabulary",
    )  # None: train one
    vocab_size: int = opt(
        30522,
        "train a WordPiece vocabulary of this size (default %(default)s)",
        exclusive="tokenizer",
    )
    lowercase: bool | None = opt(
        None, "lowercase (default when training a vocabulary)", negatable=True
    )  # None: True when training, the tokenizer's own otherwise
    min_frequency: int = opt(2, "WordPiece trainer min frequency")
    sequences: SequenceConfig = field(default_factory=SequenceConfig)
    input: InputConfig = field(default_factory=InputConfig)
    validation_fraction: float = opt(
        0.01, "share of documents (by text hash) in the validation split"
    )
    max_invalid_utf8_share: float = opt(
        0.01,
        "fail when more than this share of a text or jsonl file's non-blank lines is not UTF-8 "
        "(the file is in another encoding: convert it with iconv); below it such lines are "
        "skipped with a warning; 1: never fail",
    )
    protected_terms: str | None = opt(
        None, "file of terms kept whole for whole-word masking, one per line"
    )
    workers: int = opt(
        1,
        "worker processes (the output does not depend on it)",
        cli_default=lambda: os.cpu_count() or 1,
        default_text="one per CPU core",
    )
    shard_docs: int = opt(10000, "documents per work unit / shard (resume granularity)")
    shard_bytes: int = opt(32 << 20, "characters of text per work unit / shard")
    seed: int = opt(12345, "seed of the nsp random choices")
    overwrite: bool = opt(
        False, "replace an existing build in --output (kept until the new one is complete)"
    )
    num_partitions: int = opt(
        1,
        "split the build into N parts (one per machine, same --output on a "
        "shared file system); run `prepare` with the same arguments first",
    )
    partition: int = opt(0, "the part this process builds, 0..N-1 (e.g. $SLURM_ARRAY_TASK_ID)")
    decontaminate: float | None = opt(
        None,
        "drop training documents whose estimated Jaccard similarity (MinHash "
        "over 5-word / 5-CJK-character shingles) to a validation document is at "
        "least JACCARD (0.8 when the flag is given without a value)",
        nargs="?",
        const=0.8,
        metavar="JACCARD",
        default_text="off",
    )
    key_sentences: float | None = opt(
        None,
        "documents longer than --max_seq_len tokens keep this share R of their sentences, "
        "the top ones by TextRank, in document order (0 < R <= 1)",
        metavar="R",
        default_text="off: every sentence kept",
    )
    progress: str = opt(
        "auto",
        "auto (a bar when stderr is a terminal, plain lines in a log), bar, lines or off",
        type=checked(normalize_mode),
    )
    progress_interval_s: float = opt(
        30.0, "lines: at most one line per this many seconds (0: one per shard)"
    )


def check_config(cfg: BuildConfig) -> None:
    s = cfg.sequences
    problems = []
    if s.format not in ("packed", "nsp"):
        problems.append(f"--format must be packed or nsp, got {s.format!r}")
    if not 8 <= s.max_seq_len <= 65535:
        problems.append(f"--max_seq_len must be in [8, 65535], got {s.max_seq_len}")
    if s.stride is not None and not 1 <= s.stride <= s.max_seq_len - 2:
        problems.append(f"--stride must be in [1, max_seq_len - 2], got {s.stride}")
    if s.stride is not None and s.format != "packed":
        problems.append("--stride applies to --format packed only")
    if not 0.0 <= s.random_next_prob <= 1.0:
        problems.append(f"--random_next_prob must be in [0, 1], got {s.random_next_prob}")
    if not 0.0 <= cfg.validation_fraction < 1.0:
        problems.append(f"--validation_fraction must be in [0, 1), got {cfg.validation_fraction}")
    if not 0.0 <= cfg.max_invalid_utf8_share <= 1.0:
        problems.append(
            f"--max_invalid_utf8_share must be in [0, 1], got {cfg.max_invalid_utf8_share}"
        )
    if cfg.tokenizer is None and cfg.vocab_size < 100:
        problems.append(f"--vocab_size must be at least 100, got {cfg.vocab_size}")
    if cfg.workers < 1 or cfg.shard_docs < 1 or cfg.shard_bytes < 1:
        problems.append("--workers, --shard_docs and --shard_bytes must be positive")
    if cfg.num_partitions < 1 or not 0 <= cfg.partition < cfg.num_partitions:
        problems.append(
            f"--partition must be in [0, --num_partitions), got {cfg.partition} of "
            f"{cfg.num_partitions}"
        )
    if cfg.num_partitions > 1 and cfg.overwrite:
        problems.append(
            "--overwrite cannot be given to a part (it would delete the other parts' "
            "shards); pass it to `bertforge prep prepare` instead"
        )
    if cfg.decontaminate is not None and not 0.0 < cfg.decontaminate <= 1.0:
        problems.append(f"--decontaminate must be in (0, 1], got {cfg.decontaminate}")
    if cfg.decontaminate is not None and cfg.validation_fraction <= 0:
        problems.append("--decontaminate needs a validation split (--validation_fraction > 0)")
    if cfg.key_sentences is not None and not 0.0 < cfg.key_sentences <= 1.0:
        problems.append(
            f"--key_sentences must be in (0, 1] (the share of sentences kept), got "
            f"{cfg.key_sentences}"
        )
    if problems:
        raise BuildError("; ".join(problems))


def _sample_hash(path: Path, size: int, window: int = 1 << 20) -> str:
    """sha256 of the first, middle and last MiB: cheap, and it changes when the content does."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for start in sorted({0, max(0, size // 2 - window // 2), max(0, size - window)}):
            f.seek(start)
            h.update(f.read(window))
    return h.hexdigest()


def input_signature(files: list[Path]) -> list[dict]:
    """Path, size and sampled content hash of each input: a resumed build must see the same
    files (a file rewritten with the same content still matches)."""
    sig = []
    for p in files:
        if p.is_dir():  # a saved dataset: its files' names and sizes
            parts = sorted(
                (str(f.relative_to(p)), f.stat().st_size) for f in p.rglob("*") if f.is_file()
            )
            sig.append(
                {
                    "path": str(p),
                    "bytes": sum(n for _, n in parts),
                    "sha256_sample": hashlib.sha256(repr(parts).encode()).hexdigest(),
                }
            )
        else:
            size = p.stat().st_size
            sig.append({"path": str(p), "bytes": size, "sha256_sample": _sample_hash(p, size)})
    return sig


def build_key(
    cfg: BuildConfig, files: list[Path], terms: list[str] | None, tokenizer_fingerprint: str | None
) -> dict[str, Any]:
    """The arguments that determine the output; a resumed build must match them exactly."""
    return {
        "format_version": FORMAT_VERSION,
        "inputs": input_signature(files),
        "tokenizer": (
            {"fingerprint": tokenizer_fingerprint}
            if cfg.tokenizer
            else {
                "train_vocab_size": cfg.vocab_size,
                "min_frequency": cfg.min_frequency,
                "lowercase": cfg.lowercase is not False,
            }
        ),
        "sequences": asdict(cfg.sequences),
        "input": asdict(cfg.input),
        "validation_fraction": cfg.validation_fraction,
        "protected_terms": (
            hashlib.sha256("\n".join(terms).encode()).hexdigest() if terms else None
        ),
        "shard_docs": cfg.shard_docs,
        "shard_bytes": cfg.shard_bytes,
        "seed": cfg.seed,
        # Only when asked for, so that builds from before the option keep their key.
        **(
            {
                "decontaminate": {
                    "threshold": cfg.decontaminate,
                    "num_perm": NUM_PERM,
                    "shingle": SHINGLE,
                }
            }
            if cfg.decontaminate is not None
            else {}
        ),
        **(
            {"key_sentences": {"share": cfg.key_sentences, "method": KEY_SENTENCES_METHOD}}
            if cfg.key_sentences is not None
            else {}
        ),
    }


def _differences(old: dict, new: dict) -> list[str]:
    return [
        f"{k}: {json.dumps(old.get(k))[:120]} -> {json.dumps(new.get(k))[:120]}"
        for k in sorted(set(old) | set(new))
        if old.get(k) != new.get(k)
    ]


def refuse_mismatch(out: Path, old: dict, new: dict, what: str) -> None:
    diffs = _differences(old, new)
    if not diffs:
        return
    old_fp = (old.get("tokenizer") or {}).get("fingerprint")
    new_fp = (new.get("tokenizer") or {}).get("fingerprint")
    if old_fp is None and (out / TOKENIZER_DIR / "tokenizer.json").is_file():
        old_fp = describe(out / TOKENIZER_DIR).fingerprint  # a vocabulary trained by that build
    if old_fp and new_fp and old_fp != new_fp:
        raise BuildError(
            f"{out} holds shards of another tokenizer (fingerprint {old_fp[:12]}, "
            f"yours {new_fp[:12]}). Use a new --output folder or pass --overwrite."
        )
    raise BuildError(
        f"{out} holds {what} made with different arguments ("
        + "; ".join(diffs)
        + "). Use a new --output folder, rerun with the same "
        "arguments, or pass --overwrite."
    )
