"""Random access to the sequences of a finished build (the trainer's view of the shards).

`ShardReader(root, split)[i]` is O(1) in the corpus size (a binary search over the shard table,
then two offset reads): token ids are a zero-copy view into a read-only `numpy.memmap`; the
word-start bits of just that sequence are unpacked. Memory maps are opened lazily and kept in a
small LRU cache, so a reader over thousands of shards stays within file-descriptor limits and
pickles cheaply into DataLoader workers.
"""
from __future__ import annotations

import bisect
import json
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from data_prep.layout import (
    FORMAT_VERSION,
    MANIFEST,
    NSP_DTYPE,
    OFFSETS_DTYPE,
    TOKENIZER_DIR,
    sha256_file,
)

_VERIFY_MODES = ("none", "size", "full")


class ShardError(ValueError):
    """A shard folder that cannot be read as it is; the message names the file and the fix."""


@dataclass(frozen=True)
class Sample:
    """One sequence as stored, [CLS] and [SEP] included."""

    input_ids: np.ndarray  # uint16/uint32 view into the memory map (read-only, no copy)
    word_start: np.ndarray  # bool, one per token: True where a whole-word-masking unit starts
    segment_a_len: int | None = None  # nsp: tokens of [CLS] A [SEP]; token_type_ids are 1 after
    is_random_next: int | None = None  # nsp: 1 when segment B was drawn from another document


def load_manifest(root: Path) -> dict[str, Any]:
    """Read and sanity-check `root/manifest.json`; raises ShardError naming what is wrong."""
    path = Path(root) / MANIFEST
    if not path.is_file():
        raise ShardError(
            f"{path} not found: {root} is not a finished data_prep build (the manifest is "
            "written last). Rerun `python -m data_prep build` with the same arguments to "
            "finish it.")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ShardError(f"{path} is not valid JSON ({e}); rebuild the shards.") from e
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise ShardError(
            f"{path}: format_version {version!r} is not supported by this reader (expects "
            f"{FORMAT_VERSION}); rebuild the shards with this version of data_prep.")
    for key in ("format", "max_seq_len", "tokenizer", "special_tokens", "token_dtype", "splits"):
        if key not in manifest:
            raise ShardError(f"{path}: key {key!r} missing; rebuild the shards.")
    return manifest


def check_file(path: Path, expected: dict[str, Any], verify: str) -> None:
    """Check one shard file's presence, byte size and (verify="full") sha256."""
    if verify == "none":
        return
    if not path.is_file():
        raise ShardError(f"{path} is missing; the shard folder is incomplete. Rebuild it or "
                         "restore the file.")
    size = path.stat().st_size
    if size != expected["bytes"]:
        raise ShardError(f"{path}: {size} bytes, manifest says {expected['bytes']}; the file is "
                         "truncated or was replaced. Rebuild the shards or restore the file.")
    if verify == "full" and sha256_file(path) != expected["sha256"]:
        raise ShardError(f"{path}: sha256 differs from the manifest; the file is corrupt. "
                         "Rebuild the shards or restore the file.")


class _Shard:
    """Memory maps of one shard (opened on first use)."""

    def __init__(self, folder: Path, info: dict[str, Any], token_dtype: np.dtype, nsp: bool):
        name = info["name"]
        n, t = int(info["sequences"]), int(info["tokens"])
        self.tokens = np.memmap(folder / f"{name}.tokens", dtype=token_dtype, mode="r", shape=(t,))
        self.offsets = np.memmap(folder / f"{name}.offsets", dtype=OFFSETS_DTYPE, mode="r",
                                 shape=(n + 1,))
        self.wordstart = np.memmap(folder / f"{name}.wordstart", dtype=np.uint8, mode="r",
                                   shape=((t + 7) // 8,))
        self.nsp = (np.memmap(folder / f"{name}.nsp", dtype=NSP_DTYPE, mode="r", shape=(n,))
                    if nsp else None)
        # Plain ndarray views of the maps (no copy): slicing them is several times cheaper.
        self.tokens, self.offsets, self.wordstart = (
            np.asarray(self.tokens), np.asarray(self.offsets), np.asarray(self.wordstart))
        if self.nsp is not None:
            self.nsp = np.asarray(self.nsp)
        if int(self.offsets[0]) != 0 or int(self.offsets[-1]) != t:
            raise ShardError(f"{folder / name}.offsets: offsets run from {int(self.offsets[0])} to "
                             f"{int(self.offsets[-1])}, expected 0 to {t}; the shard is corrupt.")


class ShardReader:
    """Sequences of one split of a finished build, indexable in O(1).

    verify: "size" checks every shard file's byte size against the manifest (fast, default),
    "full" also recomputes every sha256 (reads everything), "none" trusts the folder.
    """

    def __init__(self, root: str | Path, split: str = "train", verify: str = "size",
                 max_open_shards: int = 128):
        if verify not in _VERIFY_MODES:
            raise ValueError(f"verify must be one of {_VERIFY_MODES}, got {verify!r}")
        self.root = Path(root)
        self.split = split
        self.manifest = load_manifest(self.root)
        splits = self.manifest["splits"]
        if split not in splits:
            raise ShardError(f"{self.root / MANIFEST}: split {split!r} not present (has "
                             f"{sorted(splits)}); pick one of those.")
        self.format: str = self.manifest["format"]
        self.max_seq_len: int = int(self.manifest["max_seq_len"])
        self.vocab_size: int = int(self.manifest["tokenizer"]["vocab_size"])
        self.special_tokens: dict[str, int] = dict(self.manifest["special_tokens"])
        self.tokenizer_path: Path = self.root / TOKENIZER_DIR
        self.token_dtype = np.dtype(self.manifest["token_dtype"]).newbyteorder("<")
        self._folder = self.root / split
        self._shards = [s for s in splits[split]["shards"] if int(s["sequences"]) > 0]
        for info in self._shards:
            for fname, expected in info["files"].items():
                check_file(self._folder / fname, expected, verify)
        counts = np.array([int(s["sequences"]) for s in self._shards], dtype=np.int64)
        # _starts[k] is the global index of shard k's first sequence.
        self._starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._starts_list: list[int] = self._starts.tolist()
        self._len = int(self._starts[-1])
        self.num_tokens = int(sum(int(s["tokens"]) for s in self._shards))
        self._max_open = max(1, int(max_open_shards))
        self._open: OrderedDict[int, _Shard] = OrderedDict()

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        return (f"ShardReader({str(self.root)!r}, split={self.split!r}, sequences={self._len}, "
                f"tokens={self.num_tokens}, format={self.format!r})")

    # Memory maps are not pickled: each DataLoader worker reopens what it touches.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_open"] = OrderedDict()
        return state

    def _shard(self, k: int) -> _Shard:
        shard = self._open.get(k)
        if shard is None:
            if len(self._open) >= self._max_open:
                self._open.popitem(last=False)
            shard = _Shard(self._folder, self._shards[k], self.token_dtype, self.format == "nsp")
            self._open[k] = shard
        else:
            self._open.move_to_end(k)
        return shard

    def _locate(self, i: int) -> tuple[int, int]:
        i = int(i)
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError(f"sequence {i} out of range for {self._len} sequences")
        k = bisect.bisect_right(self._starts_list, i) - 1
        return k, i - self._starts_list[k]

    def __getitem__(self, i: int) -> Sample:
        k, j = self._locate(i)
        shard = self._shard(k)
        start, end = shard.offsets[j:j + 2].tolist()
        ids = shard.tokens[start:end]
        lo, hi = start >> 3, (end + 7) >> 3
        bits = np.unpackbits(shard.wordstart[lo:hi], bitorder="little")
        word_start = bits[start - (lo << 3): end - (lo << 3)].view(np.bool_)
        if shard.nsp is not None:
            rec = shard.nsp[j]
            return Sample(ids, word_start, int(rec["segment_a_len"]), int(rec["is_random_next"]))
        return Sample(ids, word_start)

    def __iter__(self) -> Iterator[Sample]:
        for i in range(self._len):
            yield self[i]

    def nsp_labels(self) -> np.ndarray | None:
        """is_random_next of every sequence in index order (uint8), or None for packed."""
        if self.format != "nsp":
            return None
        parts = [np.asarray(self._shard(k).nsp["is_random_next"]) for k in range(len(self._shards))]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint8)

    def sequence_lengths(self) -> np.ndarray:
        """Token count of every sequence, in index order (int64; reads only the offsets files)."""
        parts = [np.diff(np.asarray(self._shard(k).offsets, dtype=np.int64))
                 for k in range(len(self._shards))]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
