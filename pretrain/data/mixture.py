"""Weighted mixtures of shard folders: one reader and one deterministic sample order over them.

Syntax (the trainer's `--data`, one value per source): `name=DIR:weight` or
`name=DIR:weight:mask_prob`, e.g. `--data wiki=/d/wiki:0.5 books=/d/books:0.2 law=/d/law:0.3:0.2`.
Weights are relative (normalised to sum 1); `mask_prob` is that source's masking rate (it replaces
the --mask_prob schedule for its samples). A plain `DIR` stays a single source (a ShardReader).
The values are parsed by `bertforge.data_prep.sources.parse_mixture`.
Every source must share the tokenizer fingerprint, max_seq_len and format.

Epoch of a mixture: E = the sum of the sources' training sequences. Each mixture epoch gives
source s exactly n_s = round(w_s * E) positions (largest remainder, so they sum to E), spread
evenly over the epoch (slot j of source s sits at key (j + 0.5) / n_s; positions follow the keys'
order, ties by source number), so every stretch of the stream holds each source close to its
weight. Source s reads its own endless stream: position q of it is sample perm_s(q // len_s)[q %
len_s], one seeded permutation per source epoch; mixture epoch m takes source positions
[m * n_s, (m + 1) * n_s). A source with n_s > len_s is repeated within a mixture epoch; one with
n_s < len_s is subsampled and continues where it stopped in the next mixture epoch, so all of its
data is used over several. Everything is a function of the global position, so the stream is the
same for any world size and resumes exactly from the one consumed-samples number; a sample's
masking key is (its source epoch, its index in the concatenation of the sources).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from bertforge.data_prep.reader import Sample, SampleBatch, ShardReader
from bertforge.data_prep.sources import MixtureError, Source
from bertforge.logs import get_logger
from bertforge.pretrain.data.loader import BatchPlan, GlobalSampler

log = get_logger(__name__)

COMPARED = ("tokenizer fingerprint", "max_seq_len", "format")


def _signature(reader: ShardReader) -> dict[str, Any]:
    return {
        "tokenizer fingerprint": reader.manifest["tokenizer"]["fingerprint"],
        "max_seq_len": reader.max_seq_len,
        "format": reader.format,
    }


def check_compatible(sources: list[Source], readers: list[ShardReader]) -> None:
    """Raise MixtureError listing every source's value of each property that differs."""
    sigs = [_signature(r) for r in readers]
    lines = []
    for key in COMPARED:
        if len({str(s[key]) for s in sigs}) > 1:
            values = ", ".join(
                f"{src.name} ({src.path}): {sig[key]}" for src, sig in zip(sources, sigs)
            )
            lines.append(f"{key} differs: {values}")
    if lines:
        raise MixtureError(
            "the sources of --data cannot be mixed (every source must be built "
            "with the same tokenizer, --max_seq_len and --format; rebuild the odd "
            "one out with `bertforge prep build --tokenizer ...`): " + "; ".join(lines)
        )


def quotas(weights: list[float], epoch_size: int) -> np.ndarray:
    """Positions per source in a mixture epoch: round(w * E) by largest remainder (sum = E)."""
    w = np.asarray(weights, dtype=np.float64)
    exact = w / w.sum() * epoch_size
    n = np.floor(exact).astype(np.int64)
    short = epoch_size - int(n.sum())
    n[np.argsort(-(exact - n), kind="stable")[:short]] += 1
    return n


def even_layout(n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(source, slot within that source) of each position of a mixture epoch: slot j of source s
    at key (j + 0.5) / n_s, positions in key order, ties by source."""
    keys = np.concatenate([(np.arange(k) + 0.5) / k for k in n.tolist() if k])
    src = np.repeat(np.arange(len(n)), n)
    slot = np.concatenate([np.arange(k) for k in n.tolist()])
    order = np.argsort(keys, kind="stable")
    dtype = np.uint8 if len(n) <= 256 else np.int32
    return src[order].astype(dtype), slot[order]


class MixtureSampler(GlobalSampler):
    """GlobalSampler over a mixture's stream (the module doc's epoch); only `plan` differs."""

    def __init__(
        self,
        lengths: list[int],
        weights: list[float],
        micro_batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        consumed_samples: int = 0,
        seed: int = 1234,
        shuffle: bool = True,
        window: int = 0,
        shard_counts: list | None = None,
    ):
        """window > 0: each source's epoch order is the window order over its shards
        (``shard_counts``: each source's sequences per shard)."""
        self.lengths = np.asarray(lengths, dtype=np.int64)
        super().__init__(
            int(self.lengths.sum()),
            micro_batch_size,
            rank,
            world_size,
            consumed_samples,
            seed=seed,
            shuffle=shuffle,
            train=True,
        )
        self.window = int(window) if self.shuffle else 0
        self.source_shards = shard_counts
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)
        self.quota = quotas(weights, self.num_samples)
        self.layout_source, self.layout_slot = even_layout(self.quota)
        self._source_perms: dict[tuple[int, int], np.ndarray] = {}

    def clone(self) -> MixtureSampler:
        twin = super().clone()
        twin._source_perms = {}
        return twin

    def source_order(self, source: int, epoch: int) -> np.ndarray:
        """Source `source`'s order in its own epoch `epoch` (identity unshuffled)."""
        n = int(self.lengths[source])
        if not self.shuffle:
            return np.arange(n, dtype=np.int64)
        perm = self._source_perms.get((source, epoch))
        if perm is None:
            counts = self.source_shards[source] if self.window else None
            perm = self.permutation(n, [self.seed, source, epoch], counts)
            stale = [k for k in self._source_perms if k[0] == source]
            if len(stale) >= 2:  # a block straddles at most two epochs of a source
                self._source_perms.pop(min(stale))
            self._source_perms[(source, epoch)] = perm
        return perm

    def plan(self, positions: np.ndarray) -> BatchPlan:
        """Source epochs and concatenated indices of global stream positions."""
        positions = np.asarray(positions, dtype=np.int64)
        mix_epoch, offset = np.divmod(positions, self.num_samples)
        src = self.layout_source[offset].astype(np.int64)
        src_pos = mix_epoch * self.quota[src] + self.layout_slot[offset]
        epochs, indices = np.divmod(src_pos, self.lengths[src])
        for s in range(len(self.lengths)):
            sel = src == s
            if not sel.any():
                continue
            first, last = int(epochs[sel].min()), int(epochs[sel].max())
            for e in range(first, last + 1):  # one epoch, or two where the batch straddles
                rows = sel if first == last else sel & (epochs == e)
                indices[rows] = self.source_order(s, e)[indices[rows]] + self.offsets[s]
        return BatchPlan(positions, epochs, indices)


class MixtureReader:
    """The sequences of several compatible builds' `split`, back to back, with the interface
    the loader uses from ShardReader; batches carry each row's source number and mask rate."""

    def __init__(
        self,
        sources: list[Source],
        split: str = "train",
        verify: str = "size",
        source_ids: list[int] | None = None,
    ):
        if not sources:
            raise MixtureError("a mixture needs at least one source")
        self.sources = list(sources)
        self.split = split
        self.readers = [ShardReader(s.path, split, verify=verify) for s in sources]
        check_compatible(self.sources, self.readers)
        self.source_ids = np.asarray(source_ids or range(len(sources)), dtype=np.int64)
        first = self.readers[0]
        self.manifest = first.manifest
        self.root, self.roots = first.root, [r.root for r in self.readers]
        self.format, self.max_seq_len = first.format, first.max_seq_len
        self.vocab_size, self.special_tokens = first.vocab_size, first.special_tokens
        self.tokenizer_path, self.token_dtype = first.tokenizer_path, first.token_dtype
        self.lengths = [len(r) for r in self.readers]
        self.num_tokens = sum(r.num_tokens for r in self.readers)
        self._offsets = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)
        self._mask_prob = np.array(
            [np.nan if s.mask_prob is None else s.mask_prob for s in sources], dtype=np.float64
        )
        self._all_default = bool(np.isnan(self._mask_prob).all())  # no per-source rate
        self._joined = ShardReader.concatenate(self.readers)  # same index space as _offsets

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def __repr__(self) -> str:
        parts = ", ".join(f"{s.name}={s.path}:{s.weight:g}" for s in self.sources)
        return f"MixtureReader({parts}, split={self.split!r}, sequences={len(self)})"

    def sampler(
        self,
        micro_batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        consumed_samples: int = 0,
        seed: int = 1234,
        shuffle: bool = True,
        window: int = 0,
    ) -> MixtureSampler:
        """The training order (used by pretrain.data.loader.build_loader for train=True);
        ``window`` > 0: the window order within each source (pretrain.data.window_order)."""
        empty = [s.name for s, n in zip(self.sources, self.lengths) if n == 0]
        if empty:
            raise MixtureError(
                f"source(s) {empty} have no {self.split!r} sequences; rebuild "
                "them with more text or drop them from --data"
            )
        return MixtureSampler(
            self.lengths,
            [s.weight for s in self.sources],
            micro_batch_size,
            rank,
            world_size,
            consumed_samples,
            seed,
            shuffle,
            window,
            [r.shard_sequence_counts() for r in self.readers] if window else None,
        )

    @property
    def remote(self) -> bool:
        """Whether a source is in object storage."""
        return self._joined.remote

    def shard_sequence_counts(self):
        """Sequences of each shard of every source, back to back."""
        return self._joined.shard_sequence_counts()

    def locate(self, indices) -> tuple[np.ndarray, np.ndarray]:
        """(source number, index within that source) of concatenated indices."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(idx) and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"sequence {int(idx.max())} out of range for {len(self)} sequences")
        src = np.searchsorted(self._offsets, idx, side="right") - 1
        return src, idx - self._offsets[src]

    def __getitem__(self, i: int) -> Sample:
        return self._joined[i]

    def get_batch(
        self,
        indices,
        *,
        pad_to_multiple_of: int = 1,
        word_start: bool = True,
        dtype: np.dtype | type = np.int64,
    ) -> SampleBatch:
        """As ShardReader.get_batch (one gather over the shards of all sources), plus `source`
        (and, where a source has its own rate, `mask_prob`) per row."""
        got = self._joined.get_batch(
            indices, pad_to_multiple_of=pad_to_multiple_of, word_start=word_start, dtype=dtype
        )
        src, _ = self.locate(indices)
        mask_prob = None if self._all_default else self._mask_prob[src]
        return replace(got, source=self.source_ids[src], mask_prob=mask_prob)

    def describe(self) -> list[dict[str, Any]]:
        """Per source: name, path, weight, mask_prob, sequences and, for training, positions per
        mixture epoch and how often the source is read in one (for logs and checkpoints)."""
        n = quotas([s.weight for s in self.sources], len(self)) if len(self) else None
        out = []
        for k, (s, length) in enumerate(zip(self.sources, self.lengths)):
            row = {
                "name": s.name,
                "path": str(s.path),  # a URL as given (credentials are refused in it)
                "weight": s.weight / sum(x.weight for x in self.sources),
                "mask_prob": s.mask_prob,
                "sequences": length,
            }
            if n is not None:
                row["per_mixture_epoch"] = int(n[k])
                row["passes_per_mixture_epoch"] = round(int(n[k]) / max(length, 1), 4)
            out.append(row)
        return out


def open_training(sources: list[Source], verify: str = "size") -> ShardReader | MixtureReader:
    """The training reader: a ShardReader for one source without a mask rate of its own, else a
    MixtureReader (whose batches carry `source`)."""
    if len(sources) == 1 and sources[0].mask_prob is None:
        return ShardReader(sources[0].path, "train", verify=verify)
    return MixtureReader(sources, "train", verify=verify)


def validation_readers(
    sources: list[Source], verify: str = "size"
) -> list[tuple[str, MixtureReader]]:
    """(name, reader) of each source's validation split, at that source's mask rate; sources
    without validation sequences are left out with a warning."""
    out = []
    for k, s in enumerate(sources):
        try:
            reader = MixtureReader([s], "validation", verify=verify, source_ids=[k])
        except ValueError as e:  # no validation split in that build
            log.warning(
                f"source {s.name} ({s.path}) has no validation split ({e}); it gets "
                "no validation records"
            )
            continue
        if len(reader) == 0:
            log.warning(
                f"source {s.name} ({s.path}) has no validation sequences; it gets no "
                "validation records"
            )
            continue
        out.append((s.name, reader))
    return out


def describe_data(reader) -> list[dict]:
    """The training data's sources (name, path, weight, mask rate, sequences), for checkpoints."""
    if hasattr(reader, "describe"):
        return reader.describe()
    where = str(getattr(reader, "location", reader.root))  # a URL for object storage
    return [
        {
            "name": where.rstrip("/").rsplit("/", 1)[-1],
            "path": where,
            "weight": 1.0,
            "mask_prob": None,
            "sequences": len(reader),
        }
    ]


def warn_if_data_changed(point, reader) -> None:
    """The data position is one number of consumed samples: under other sources or weights it
    points into another stream. Say so (the run goes on: changing a mixture is allowed).
    ``point``: a resume point, with the checkpoint's ``state``."""
    keys = ("name", "path", "weight", "mask_prob")
    saved = [{k: s.get(k) for k in keys} for s in point.state.get("data_mixture") or []]
    now = [{k: s.get(k) for k in keys} for s in describe_data(reader)]
    if saved and saved != now:
        log.warning(
            f"--data differs from the checkpoint's ({saved} -> {now}); the resumed run continues "
            "at the same sample count of the new stream"
        )
