"""Random access to the sequences of a finished build (the trainer's view of the shards).

`ShardReader(root, split)[i]` is O(1) in the corpus size (a binary search over the shard table,
then two offset reads): token ids are a zero-copy view into a read-only `numpy.memmap`; the
word-start bits of just that sequence are unpacked. `get_batch(indices)` reads many sequences at
once into padded [B, T] arrays with a few numpy gathers per shard instead of a Python call per
sequence (what the training loader uses). Memory maps are opened lazily and kept in an LRU cache
sized to the file-descriptor limit, so a reader over thousands of shards stays within it and
pickles cheaply into DataLoader workers. The manifest's and files' checks are
:mod:`data_prep.shard_files`'.
"""

from __future__ import annotations

import bisect
import copy
import resource
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.data_prep.layout import MANIFEST, NSP_DTYPE, TOKENIZER_DIR
from bertforge.data_prep.object_store import is_url
from bertforge.data_prep.shard_files import (  # re-exported: the readers' one import
    ShardError,
    check_file,
    load_manifest,
    map_array,
    offsets_dtype_of,
)

_VERIFY_MODES = ("none", "size", "full")
# get_batch gathers per shard when a batch holds at least this many sequences per shard on average
# (a gather costs ~10 numpy calls); below, a lean per-sequence slicing loop is cheaper.
_MIN_GROUP = 8


@dataclass(frozen=True)
class Sample:
    """One sequence as stored, [CLS] and [SEP] included."""

    input_ids: np.ndarray  # uint16/uint32 view into the memory map (read-only, no copy)
    word_start: np.ndarray  # bool, one per token: True where a whole-word-masking unit starts
    segment_a_len: int | None = None  # nsp: tokens of [CLS] A [SEP]; token_type_ids are 1 after
    is_random_next: int | None = None  # nsp: 1 when segment B was drawn from another document


@dataclass(frozen=True)
class SampleBatch:
    """Several sequences read at once (`ShardReader.get_batch`), padded into [B, T] rectangles."""

    input_ids: np.ndarray  # [B, T] (int64 by default), the pad id past each sequence's length
    lengths: np.ndarray  # [B] int64: tokens of each sequence, [CLS] and [SEP] included
    word_start: np.ndarray | None  # [B, T] bool, False in the padding; None when not asked for
    segment_a_len: np.ndarray | None = None  # nsp: [B] int64
    is_random_next: np.ndarray | None = None  # nsp: [B] int64
    source: np.ndarray | None = None  # mixtures (pretrain.data.mixture): [B] int64 source number
    mask_prob: np.ndarray | None = None  # mixtures: [B] float64 per-source rate, NaN = default


class _Shard:
    """Read-only memory maps of one shard (opened on first use)."""

    def __init__(
        self,
        folder: Path,
        info: dict[str, Any],
        token_dtype: np.dtype,
        offsets_dtype: np.dtype,
        nsp: bool,
    ):
        name = info["name"]
        n, t = int(info["sequences"]), int(info["tokens"])
        self.tokens = map_array(folder / f"{name}.tokens", token_dtype, t)
        self.offsets = map_array(folder / f"{name}.offsets", offsets_dtype, n + 1)
        self.wordstart = map_array(folder / f"{name}.wordstart", np.uint8, (t + 7) // 8)
        self.nsp = map_array(folder / f"{name}.nsp", NSP_DTYPE, n) if nsp else None
        if int(self.offsets[0]) != 0 or int(self.offsets[-1]) != t:
            raise ShardError(
                f"{folder / name}.offsets: offsets run from {int(self.offsets[0])} to "
                f"{int(self.offsets[-1])}, expected 0 to {t}; the shard is corrupt."
            )


class ShardReader:
    """Sequences of one split of a finished build, indexable in O(1).

    verify: "size" checks every shard file's byte size against the manifest (fast, default),
    "full" also recomputes every sha256 (reads everything), "none" trusts the folder.
    max_open_shards: shards kept mapped at once (least recently used closed first); default 2048,
    or the file-descriptor limit / 16 when that is lower.

    ``root`` may be a URL (``s3://bucket/shards``, any fsspec URL): the manifest and tokenizer are
    fetched into this process's shard cache (:mod:`data_prep.shard_cache`) and a shard when it is
    first needed (a training loader fetches ahead); ``root`` is then the local mirror and
    ``location`` the URL. verify "size" and "full" compare the objects' sizes with the manifest
    (one listing per split); every shard's sha256 is checked as it arrives. After each batch only
    its own shards stay mapped, so that an evicted file frees its space.
    """

    def __init__(
        self,
        root: str | Path,
        split: str = "train",
        verify: str = "size",
        max_open_shards: int | None = None,
    ):
        if verify not in _VERIFY_MODES:
            raise ValueError(f"verify must be one of {_VERIFY_MODES}, got {verify!r}")
        self._remote = None
        self.location = str(Path(root)) if not is_url(root) else str(root)  # folder or URL
        if is_url(root):
            from bertforge.data_prep.shard_cache import process_cache  # lazy: fsspec

            self._remote = process_cache().open_folder(str(root))
            self.location = self._remote.store.url_of()
            root = self._remote.local_root
        self.root = Path(root)
        self.split = split
        self.manifest = load_manifest(self.root)
        splits = self.manifest["splits"]
        if split not in splits:
            raise ShardError(
                f"{self.root / MANIFEST}: split {split!r} not present (has "
                f"{sorted(splits)}); pick one of those."
            )
        self.format: str = self.manifest["format"]
        self.max_seq_len: int = int(self.manifest["max_seq_len"])
        self.vocab_size: int = int(self.manifest["tokenizer"]["vocab_size"])
        self.special_tokens: dict[str, int] = dict(self.manifest["special_tokens"])
        self.tokenizer_path: Path = self.root / TOKENIZER_DIR
        self.token_dtype = np.dtype(self.manifest["token_dtype"]).newbyteorder("<")
        self._folder = self.root / split
        self._shards = [s for s in splits[split]["shards"] if int(s["sequences"]) > 0]
        self._offsets_dtypes = [
            offsets_dtype_of(self.manifest, s, self.root / MANIFEST) for s in self._shards
        ]
        if self._remote is not None:
            if verify != "none":
                self._remote.check_objects(split, self._shards)
            self._units = [self._remote.unit(split, s) for s in self._shards]
        else:
            for info in self._shards:
                for fname, expected in info["files"].items():
                    check_file(self._folder / fname, expected, verify)
            self._units = [None] * len(self._shards)
        self._has_remote = self._remote is not None
        counts = np.array([int(s["sequences"]) for s in self._shards], dtype=np.int64)
        # _starts[k] is the global index of shard k's first sequence.
        self._starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._starts_list: list[int] = self._starts.tolist()
        self._len = int(self._starts[-1])
        self.num_tokens = int(sum(int(s["tokens"]) for s in self._shards))
        self._max_open = max(1, int(max_open_shards or _default_open_shards()))
        self._open: OrderedDict[int, _Shard] = OrderedDict()
        self._folders = [self._folder] * len(self._shards)  # per shard (see `concatenate`)

    @classmethod
    def concatenate(cls, readers: list[ShardReader]) -> ShardReader:
        """One reader over the sequences of several readers, back to back (reader 0's first).

        The callers check that they share the tokenizer and format (pretrain.data.mixture does);
        metadata (manifest, root, special tokens) are reader 0's. `get_batch` then gathers rows
        of several builds in one call, as fast as from one build."""
        joined = copy.copy(readers[0])
        joined._shards = [s for r in readers for s in r._shards]
        joined._offsets_dtypes = [d for r in readers for d in r._offsets_dtypes]
        joined._folders = [f for r in readers for f in r._folders]
        joined._units = [u for r in readers for u in r._units]
        joined._has_remote = any(r._has_remote for r in readers)
        counts = np.array([int(s["sequences"]) for s in joined._shards], dtype=np.int64)
        joined._starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        joined._starts_list = joined._starts.tolist()
        joined._len = int(joined._starts[-1])
        joined.num_tokens = sum(r.num_tokens for r in readers)
        joined._open = OrderedDict()
        return joined

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        return (
            f"ShardReader({str(self.root)!r}, split={self.split!r}, sequences={self._len}, "
            f"tokens={self.num_tokens}, format={self.format!r})"
        )

    # Memory maps are not pickled: each DataLoader worker reopens what it touches.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_open"] = OrderedDict()
        return state

    @property
    def remote(self) -> bool:
        """Whether any shard comes from object storage (through the shard cache)."""
        return self._has_remote

    def shard_sequence_counts(self) -> np.ndarray:
        """Sequences of each shard, in index order (the window order groups them)."""
        return np.diff(self._starts)

    def shard_ids(self, indices) -> np.ndarray:
        """The shard number of each sequence index (non-negative indices)."""
        return np.searchsorted(self._starts, np.asarray(indices, dtype=np.int64), "right") - 1

    def units_of(self, shard_ids) -> list:
        """The cache units (:class:`data_prep.shard_cache.Unit`) of these shards' remote ones."""
        units = self._units
        return [units[k] for k in dict.fromkeys(np.asarray(shard_ids).tolist()) if units[k]]

    def _ensure_local(self, k: int) -> None:
        """A remote shard's files into the cache (validation's are kept there)."""
        unit = self._units[k]
        cache = unit.folder.cache
        if cache is not None:
            cache.ensure([unit], keep=self.split == "validation")
        elif not unit.present():
            raise ShardError(f"{unit} is not in the shard cache (a worker cannot fetch it)")

    def _shard(self, k: int) -> _Shard:
        shard = self._open.get(k)
        if shard is None:
            if self._units[k] is not None:
                self._ensure_local(k)
            if len(self._open) >= self._max_open:
                self._open.popitem(last=False)
            shard = _Shard(
                self._folders[k],
                self._shards[k],
                self.token_dtype,
                self._offsets_dtypes[k],
                self.format == "nsp",
            )
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
        start, end = shard.offsets[j : j + 2].tolist()
        ids = shard.tokens[start:end]
        lo, hi = start >> 3, (end + 7) >> 3
        bits = np.unpackbits(shard.wordstart[lo:hi], bitorder="little")
        word_start = bits[start - (lo << 3) : end - (lo << 3)].view(np.bool_)
        if shard.nsp is not None:
            rec = shard.nsp[j]
            return Sample(ids, word_start, int(rec["segment_a_len"]), int(rec["is_random_next"]))
        return Sample(ids, word_start)

    def get_batch(
        self,
        indices,
        *,
        pad_to_multiple_of: int = 1,
        word_start: bool = True,
        dtype: np.dtype | type = np.int64,
    ) -> SampleBatch:
        """Sequences `indices` (any order, repeats and negative indices allowed) as padded [B, T]
        arrays, T = the longest length rounded up to `pad_to_multiple_of`; the pad id (the
        manifest's special_tokens["pad"]) fills each row past its length. The same tokens and bits
        as `self[i]` for each index, in a few numpy gathers per shard touched instead of a Python
        call per sequence. word_start=False skips the bits (token-level masking needs none);
        `dtype` is the dtype of input_ids."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        B, n = len(idx), self._len
        if B and (idx.min() < -n or idx.max() >= n):
            bad = int(idx[(idx < -n) | (idx >= n)][0])
            raise IndexError(f"sequence {bad} out of range for {n} sequences")
        idx = np.where(idx < 0, idx + n, idx)
        try:
            return self._get_batch(idx, pad_to_multiple_of, word_start, dtype)
        finally:
            if self._has_remote:  # only this batch's shards stay mapped: an evicted shard's
                used = set(self.shard_ids(idx).tolist())  # space is freed once unmapped
                for k in [k for k in self._open if k not in used]:
                    del self._open[k]

    def _get_batch(self, idx: np.ndarray, pad_to_multiple_of: int, word_start: bool, dtype):
        B = len(idx)
        k = np.searchsorted(self._starts, idx, side="right") - 1
        local = idx - self._starts[k]
        if B == 0 or (k[0] == k[-1] and (k == k[0]).all()):  # one shard: no regrouping
            groups = [(int(k[0]), None)] if B else []
            return self._gather_grouped(groups, local, B, pad_to_multiple_of, word_start, dtype)
        order = np.argsort(k, kind="stable")
        ks = k[order]
        cuts = (np.flatnonzero(ks[1:] != ks[:-1]) + 1).tolist()
        if (len(cuts) + 1) * _MIN_GROUP > B:  # mostly one or two sequences per shard
            return self._gather_each(k, local, pad_to_multiple_of, word_start, dtype)
        bounds = [0, *cuts, B]
        groups = [(int(ks[a]), order[a:b]) for a, b in pairwise(bounds)]
        return self._gather_grouped(groups, local, B, pad_to_multiple_of, word_start, dtype)

    def _batch_of(
        self,
        buf: np.ndarray,
        lengths: np.ndarray,
        bits: np.ndarray | None,
        T: int,
        dtype,
        nsp: np.ndarray | None,
    ) -> SampleBatch:
        """Pad and package the gathered rows (buf and bits hold garbage past each length);
        nsp: [B, 2] int64 (segment_a_len, is_random_next) for the nsp format."""
        in_seq = np.arange(T)[None, :] < lengths[:, None]
        ids = np.where(in_seq, buf, np.asarray(self.special_tokens["pad"], dtype=dtype))
        ws = None if bits is None else (bits.view(np.bool_) & in_seq)
        ids = ids.astype(dtype, copy=False)
        if nsp is None:
            return SampleBatch(ids, lengths, ws)
        return SampleBatch(ids, lengths, ws, nsp[:, 0].copy(), nsp[:, 1].copy())

    def _gather_grouped(
        self, groups, local: np.ndarray, B: int, multiple: int, word_start: bool, dtype
    ) -> SampleBatch:
        """Few shards per batch: per shard, fancy-index the offsets, then gather each row's
        window of T tokens (and the bytes holding its bits) with one `take` each."""
        lengths = np.empty(B, dtype=np.int64)
        nsp = np.empty((B, 2), dtype=np.int64) if self.format == "nsp" else None
        parts = []
        for k, rows in groups:
            shard = self._shard(k)
            j = local if rows is None else local[rows]
            s = shard.offsets[j].astype(np.int64)
            e = shard.offsets[j + 1].astype(np.int64)
            rows_ = slice(None) if rows is None else rows
            lengths[rows_] = e - s
            if nsp is not None:
                rec = shard.nsp[j]
                nsp[rows_, 0], nsp[rows_, 1] = rec["segment_a_len"], rec["is_random_next"]
            parts.append((rows, shard, j, s))
        T = _padded_width(lengths, multiple)
        buf = np.empty((B, T), dtype=self.token_dtype)
        bits = np.empty((B, T), dtype=np.uint8) if word_start else None
        col = np.arange(T, dtype=np.int64)[None, :]
        nb = (T + 7) // 8 + 1  # bytes covering T bits from any bit offset
        for rows, shard, _j, s in parts:
            # Windows may run past the sequence (masked in _batch_of) or the shard (clipped).
            got = shard.tokens.take(s[:, None] + col, mode="clip")
            if word_start:
                raw = shard.wordstart.take((s >> 3)[:, None] + np.arange(nb), mode="clip")
                unpacked = np.unpackbits(raw, axis=1, bitorder="little")
                got_bits = np.take_along_axis(unpacked, (s & 7)[:, None] + col, axis=1)
            if rows is None:
                buf[:] = got
                if word_start:
                    bits[:] = got_bits
            else:
                buf[rows] = got
                if word_start:
                    bits[rows] = got_bits
        return self._batch_of(buf, lengths, bits, T, dtype, nsp)

    def _gather_each(
        self, k: np.ndarray, local: np.ndarray, multiple: int, word_start: bool, dtype
    ) -> SampleBatch:
        """Many shards per batch (each holds one or two of its sequences): slice each sequence
        (two offsets, its tokens, the bytes of its bits), then pad everything in one pass."""
        B = len(k)
        shards = {kk: self._shard(kk) for kk in np.unique(k).tolist()}
        toks, wbytes, lens, recs = [], [], [], []
        bases = []  # where row r's first bit is in the joined bytes
        nbytes = 0
        with_nsp = self.format == "nsp"
        for kk, j in zip(k.tolist(), local.tolist()):
            shard = shards[kk]
            s, e = shard.offsets[j : j + 2].tolist()
            lens.append(e - s)
            toks.append(shard.tokens[s:e])
            if with_nsp:
                recs.append(shard.nsp[j].item())
            if word_start:
                lo, hi = s >> 3, (e + 7) >> 3
                wbytes.append(shard.wordstart[lo:hi])
                bases.append(nbytes * 8 + s - (lo << 3))
                nbytes += hi - lo
        lengths = np.array(lens, dtype=np.int64)
        bit_base = np.array(bases, dtype=np.int64)
        T = _padded_width(lengths, multiple)
        in_seq = np.arange(T)[None, :] < lengths[:, None]
        buf = np.empty((B, T), dtype=self.token_dtype)  # padding masked in _batch_of
        buf[in_seq] = np.concatenate(toks)  # row-major: each row's tokens in order
        bits = None
        if word_start:
            unpacked = np.unpackbits(np.concatenate(wbytes), bitorder="little")
            bits = unpacked.take(bit_base[:, None] + np.arange(T), mode="clip")
        nsp = np.array(recs, dtype=np.int64).reshape(B, 2) if with_nsp else None
        return self._batch_of(buf, lengths, bits, T, dtype, nsp)

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
        parts = [
            np.diff(np.asarray(self._shard(k).offsets, dtype=np.int64))
            for k in range(len(self._shards))
        ]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _default_open_shards() -> int:
    """How many shards to keep mapped: 2048, or fewer when the file-descriptor limit is low (each
    map holds a descriptor, up to 4 a shard). A random batch of a large corpus touches hundreds of
    shards, and reopening one costs ~30 us, so the cache should hold them all where it can."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 2048
    return int(min(2048, max(16, soft // 16)))


def _padded_width(lengths: np.ndarray, multiple: int) -> int:
    """The longest length rounded up to a multiple of `multiple` (0 for an empty batch)."""
    if multiple < 1:
        raise ValueError(f"pad_to_multiple_of={multiple}: must be >= 1")
    longest = int(lengths.max()) if len(lengths) else 0
    return -(-longest // multiple) * multiple


__all__ = [
    "Sample",
    "SampleBatch",
    "ShardError",
    "ShardReader",
    "check_file",
    "load_manifest",
    "offsets_dtype_of",
]
