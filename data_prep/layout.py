"""On-disk layout of a shard folder (docs/design.md section 1): names, dtypes, shard arrays
written atomically."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.files import write_bytes_atomic

# 2: offsets uint32 when the shard's token count fits (each shard names its `offsets_dtype` in the
# manifest). 1: offsets always uint64, no `offsets_dtype` key. The reader reads both.
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
MANIFEST = "manifest.json"
TOKENIZER_DIR = "tokenizer"
WORK_DIR = ".work"  # per-build state (arguments, per-unit done records); removed once complete
SPLITS = ("train", "validation")
OFFSETS_DTYPE_V1 = np.dtype("<u8")  # format_version 1: every shard
OFFSETS_DTYPES = {"uint32": np.dtype("<u4"), "uint64": np.dtype("<u8")}  # manifest name -> dtype
# One record per nsp sequence: length of segment A including [CLS] and the first [SEP], and the
# is-random-next label. Unaligned structured dtype, 3 bytes per sequence.
NSP_DTYPE = np.dtype([("segment_a_len", "<u2"), ("is_random_next", "u1")])
SUFFIXES = ("tokens", "offsets", "wordstart", "nsp")


def token_dtype_for(vocab_size: int) -> np.dtype:
    """uint16 when every id fits in 16 bits, else uint32 (little-endian)."""
    return np.dtype("<u2") if vocab_size <= 65536 else np.dtype("<u4")


def offsets_dtype_for(num_tokens: int) -> np.dtype:
    """uint32 when every offset (0..num_tokens) fits in 32 bits, else uint64 (little-endian).

    4 bytes instead of 8 per sequence: 0.03 bytes per token at 128 tokens a sequence."""
    return OFFSETS_DTYPES["uint32"] if num_tokens < 2**32 else OFFSETS_DTYPES["uint64"]


def shard_name(unit: int) -> str:
    """Name of the shard written by work unit `unit` (same number in both splits)."""
    return f"shard-{unit:05d}"


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file, read in 4 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def write_array_atomic(path: Path, array: np.ndarray) -> dict[str, Any]:
    """Write a numpy array's raw bytes (C order) atomically; return {bytes, sha256}."""
    return write_bytes_atomic(path, memoryview(np.ascontiguousarray(array)).cast("B"))


def remove_stale_temporaries(folder: Path) -> int:
    """Delete `*.tmp-*` files left by an interrupted build; returns how many."""
    n = 0
    if folder.is_dir():
        for p in folder.glob("*.tmp-*"):
            p.unlink(missing_ok=True)
            n += 1
    return n
