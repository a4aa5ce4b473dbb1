"""Training batches from the shards: global seeded order, per-rank slices, dynamic masking, padding.

The sampler's only state is `consumed_samples`, the number of samples taken globally. Position k of
the global stream is sample `perm(epoch)[k % N]` with `epoch = k // N`, where `perm(epoch)` is one
seeded permutation per epoch. Every optimizer step takes the next `micro * accum * world` positions;
within each block of `micro * world` positions rank r takes slots [r*micro, (r+1)*micro). So a run
resumes at the exact next sample on any world size, and the union of the ranks' slices is the
global order. Masking (pretrain.data.masking) depends only on (seed, epoch, sample index,
position), so
worker counts, world sizes and restarts never change a mask.

Each DataLoader item is a whole micro-batch: the GlobalSampler is the loader's batch_sampler and
the dataset's `__getitems__` takes its BatchPlan. A worker reads the plan's sequences in one
batched call (`ShardReader.get_batch`: numpy gathers over the memory maps, padded to the longest
length rounded up to a multiple of 8), masks the batch in one vectorised pass and returns tensors,
pinned by the loader when a GPU is present.

Mixtures (pretrain.data.mixture): a reader with a `sampler(...)` method supplies the training order
(build_loader uses it for train=True); its batches carry `source` (each row's source number, put
into the batch as the tensor `batch["source"]`, which the trainer pops like `masking_stats`) and
`mask_prob` (per-row rates handed to the Masker).

Document attention (``attention="document"``, ``--attention``): each batch also carries
`document_ids` and `position_ids` ([B, T] int64: which document of its packed sequence a token
belongs to, -1 in padding, and its position inside that document), computed from the batch's
[SEP]s in a few numpy passes (pretrain.model.document_attention.document_index); masking is
unchanged.
"""

from __future__ import annotations

import atexit
import copy
import multiprocessing.util  # noqa: F401 (its exit handler is registered before ours)
import signal
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from bertforge.cli import opt
from bertforge.data_prep.reader import SampleBatch
from bertforge.preemption import job_signals
from bertforge.pretrain.data.cached_plans import CachedPlans, Delivered
from bertforge.pretrain.data.masking import Masker, MaskingConfig
from bertforge.pretrain.data.sentence_order import order_pairs, require_pair_shards, swap_coins
from bertforge.pretrain.data.window_order import window_permutation
from bertforge.pretrain.model.document_attention import document_index


@dataclass
class DataConfig:
    """How batches are read, ordered and delivered."""

    num_workers: int = opt(
        2, "DataLoader worker processes per rank (0: build batches in the main process)"
    )
    prefetch_factor: int = opt(4, "batches each worker prepares ahead (ignored without workers)")
    pin_memory: bool = opt(
        True, "page-locked batches for faster host-to-GPU copies (only with CUDA)"
    )
    pad_to_multiple_of: int = opt(8, "pad each batch's length up to a multiple of this")
    shuffle: bool = opt(
        True, "reshuffle the training order every epoch (validation stays in order)"
    )
    seed: int = opt(1234, "seed of the per-epoch permutation of the training order")
    verify: str = opt("size", "shard check when opening: size (fast), full (sha256), none")
    data_order: str = opt(
        "global",
        "training order: global (one seeded permutation of all sequences per epoch) or window "
        "(shards shuffled, sequences shuffled within windows of --window_shards shards: reads "
        "stay local, for a --cache_limit smaller than the data); kept in the checkpoint",
    )
    window_shards: int = opt(
        0,
        "with --data_order window: shards per window (0: a window of each source in a third of "
        "--cache_limit, settled at the first launch and kept in the checkpoint)",
    )
    cache_dir: str = opt(
        "",
        "local folder for shards read from object storage (--data s3://...), a sub-folder per "
        "rank; empty: one per run folder under the system's temporary folder",
    )
    cache_limit: str = opt(
        "20GB",
        "most bytes of shards one rank's cache holds (500MB, 20GB, ...); shards already read "
        "are evicted to make room",
    )
    fetch_threads: int = opt(4, "parallel shard fetches from object storage per rank")
    fetch_retries: int = opt(
        5,
        "tries of a request to object storage (a 5xx, a timeout, a short read, a wrong "
        "checksum) before the run stops naming the object",
    )

    def __post_init__(self) -> None:
        if self.num_workers < 0:
            raise ValueError(f"DataConfig.num_workers={self.num_workers}: must be >= 0")
        if self.pad_to_multiple_of < 1:
            raise ValueError(
                f"DataConfig.pad_to_multiple_of={self.pad_to_multiple_of}: must be >= 1"
            )
        if self.verify not in ("size", "full", "none"):
            raise ValueError(f"DataConfig.verify={self.verify!r}: choose size, full or none")
        if self.data_order not in ("global", "window"):
            raise ValueError(f"--data_order {self.data_order!r}: choose global or window")
        if self.window_shards < 0 or self.fetch_threads < 1 or self.fetch_retries < 1:
            raise ValueError(
                "--window_shards must be >= 0, --fetch_threads and --fetch_retries >= 1"
            )

    @property
    def window(self) -> int:
        """Shards per window of the training order; 0 for the global order."""
        return self.window_shards if self.data_order == "window" else 0


@dataclass
class BatchPlan:
    """The samples of one micro-batch: global stream positions, their epochs and dataset indices."""

    positions: np.ndarray  # int64 [B] global stream positions (consumed_samples numbering)
    epochs: np.ndarray  # int64 [B]
    indices: np.ndarray  # int64 [B] indices into the reader


class GlobalSampler:
    """One seeded global order per epoch; each rank iterates over its slice of every block.

    train=True: an endless stream over epochs starting at `consumed_samples`.
    train=False: one pass over the samples in index order; the last, partial block is split as
    evenly as possible (a rank with nothing left yields one batch fewer).
    window > 0 (with `shard_counts`, the sequences of each shard): each epoch's order is
    :func:`pretrain.data.window_order.window_permutation` instead of a global permutation.
    """

    def __init__(
        self,
        num_samples: int,
        micro_batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        consumed_samples: int = 0,
        seed: int = 1234,
        shuffle: bool = True,
        train: bool = True,
        window: int = 0,
        shard_counts=None,
    ):
        if num_samples <= 0:
            raise ValueError(
                "the split has no sequences: nothing to sample (rebuild the shards "
                "with more text or a smaller --validation_fraction)"
            )
        if micro_batch_size <= 0 or world_size <= 0 or not 0 <= rank < world_size:
            raise ValueError(
                f"bad sampler layout: micro_batch_size={micro_batch_size}, "
                f"rank={rank}, world_size={world_size}"
            )
        if consumed_samples < 0:
            raise ValueError(f"consumed_samples={consumed_samples} must be >= 0")
        self.num_samples = int(num_samples)
        self.micro_batch_size = int(micro_batch_size)
        self.rank, self.world_size = int(rank), int(world_size)
        self.consumed_samples = int(consumed_samples)
        self.seed, self.shuffle, self.train = int(seed), bool(shuffle) and train, bool(train)
        self.window = int(window) if self.shuffle else 0
        self.shard_counts = shard_counts
        if self.window and (shard_counts is None or int(np.sum(shard_counts)) != num_samples):
            raise ValueError("the window order needs the sequences of each shard (shard_counts)")
        self._perm_cache: dict[int, np.ndarray] = {}

    def clone(self) -> GlobalSampler:
        """An independent copy at the same position (own caches: another thread walks it)."""
        twin = copy.copy(self)
        twin._perm_cache = {}
        return twin

    def permutation(self, n: int, key: list[int], counts=None) -> np.ndarray:
        """One seeded order of ``n`` indices: a global permutation, or the window order over
        shards of ``counts`` sequences."""
        if self.window:
            return window_permutation(counts, self.window, key)
        rng = np.random.Generator(np.random.PCG64(key))
        return rng.permutation(n).astype(np.int32 if n < 2**31 else np.int64)

    def order(self, epoch: int) -> np.ndarray:
        """The global order of `epoch`: a permutation of the dataset indices (identity when
        not shuffled)."""
        if not self.shuffle:
            return np.arange(self.num_samples, dtype=np.int64)
        perm = self._perm_cache.get(epoch)
        if perm is None:
            perm = self.permutation(self.num_samples, [self.seed, epoch], self.shard_counts)
            if len(self._perm_cache) >= 2:  # a block straddles at most two epochs
                self._perm_cache.pop(min(self._perm_cache))
            self._perm_cache[epoch] = perm
        return perm

    def plan(self, positions: np.ndarray) -> BatchPlan:
        """Epochs and dataset indices of global stream positions."""
        positions = np.asarray(positions, dtype=np.int64)
        epochs = positions // self.num_samples
        indices = np.empty_like(positions)
        for e in np.unique(epochs):
            sel = epochs == e
            indices[sel] = self.order(int(e))[positions[sel] % self.num_samples]
        return BatchPlan(positions, epochs, indices)

    def rank_positions(self, block_start: int, block_size: int) -> np.ndarray:
        """This rank's global positions in the block [block_start, block_start + block_size)."""
        parts = np.array_split(
            np.arange(block_start, block_start + block_size, dtype=np.int64), self.world_size
        )
        return parts[self.rank]

    def __iter__(self) -> Iterator[BatchPlan]:
        block = self.micro_batch_size * self.world_size
        pos = self.consumed_samples
        while True:
            if self.train:
                size = block
            else:
                if pos >= self.num_samples:
                    return
                size = min(block, self.num_samples - pos)
            mine = self.rank_positions(pos, size)
            pos += size
            if len(mine):
                yield self.plan(mine)

    def __len__(self) -> int:
        """Batches of this rank in one pass (validation); the training stream is endless."""
        if self.train:
            raise TypeError("the training sampler is endless: it has no length")
        block = self.micro_batch_size * self.world_size
        remaining = max(self.num_samples - self.consumed_samples, 0)
        full, rest = divmod(remaining, block)
        return full + int(rest > self.rank)


class MaskedBatches(Dataset):
    """Builds a whole masked, padded batch from a BatchPlan (see module doc)."""

    def __init__(
        self,
        reader,
        masking_cfg: MaskingConfig,
        pad_to_multiple_of: int = 8,
        schedule_position: int | None = None,
        attention: str = "full",
        sentence_order: bool = False,
    ):
        """schedule_position: evaluate the mask_prob schedule there for every sample (validation
        masks at one fixed rate) instead of at each sample's stream position. attention
        "document": the batches also carry document_ids and position_ids (see the module doc).
        sentence_order (NSP shards): swap half the consecutive pairs and label their order
        (``sentence_order_label``, :mod:`.sentence_order`) instead of ``next_sentence_label``."""
        if attention not in ("full", "document"):
            raise ValueError(f"attention {attention!r}: choose full or document (resolve auto)")
        if sentence_order:
            require_pair_shards(reader)
        self.attention = attention
        self.sentence_order = sentence_order
        self.sep_id = int(reader.special_tokens["sep"])
        self.reader = reader
        self.schedule_position = schedule_position
        self.nsp = reader.format == "nsp"
        self.vocab_size = int(reader.vocab_size)
        self.pad_id = int(reader.special_tokens["pad"])
        self.masker = Masker(masking_cfg, self.vocab_size, reader.special_tokens)
        self.multiple = int(pad_to_multiple_of)

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, i: int) -> dict:
        """A one-sample batch of dataset index i (epoch 0, stream position i)."""
        one = np.array([i], dtype=np.int64)
        return self.__getitems__(BatchPlan(one, np.zeros(1, dtype=np.int64), one))

    def _where(self, index: int) -> str:
        return (
            f"sequence {index} of {getattr(self.reader, 'root', '?')} "
            f"(split {getattr(self.reader, 'split', '?')!r})"
        )

    def read(self, plan: BatchPlan) -> SampleBatch:
        """The plan's sequences, padded to [B, T] int64 (T: a multiple of pad_to_multiple_of), in
        one batched read (`ShardReader.get_batch`: a few numpy gathers per shard touched)."""
        return self.reader.get_batch(
            plan.indices, pad_to_multiple_of=self.multiple, word_start=self.masker.cfg.whole_word
        )

    def __getitems__(self, plan: BatchPlan) -> dict:
        got = self.read(plan)
        ids, lengths = got.input_ids, got.lengths
        B, T = ids.shape
        if B == 0 or lengths.min() == 0:
            bad = int(plan.indices[int(np.argmin(lengths))]) if B else -1
            raise ValueError(
                f"{self._where(bad)} is empty; the shard is corrupt: rebuild it "
                "(`bertforge prep build`) or check it (`bertforge prep verify`)"
            )
        if ids.max() >= self.vocab_size:  # padding is a special id, always < vocab_size
            row = int(np.argmax(ids.max(axis=1)))
            raise ValueError(
                f"{self._where(int(plan.indices[row]))} holds token id {int(ids[row].max())} >= "
                f"the manifest's vocab_size {self.vocab_size}: the shard is corrupt or was built "
                "with another tokenizer. Run `bertforge prep verify` and rebuild the shards."
            )
        in_seq = np.arange(T)[None, :] < lengths[:, None]
        positions = (
            plan.positions
            if self.schedule_position is None
            else np.full(B, self.schedule_position, dtype=np.int64)
        )
        word_start, a_len = got.word_start, got.segment_a_len
        if self.sentence_order:  # before masking: the swapped sequence is what gets masked
            swap = swap_coins(self.masker.cfg.seed, plan.epochs, plan.indices)
            ids, word_start, a_len, order = order_pairs(
                ids, word_start, lengths, a_len, got.is_random_next, swap
            )
        masked, labels, stats = self.masker(
            ids, lengths, word_start, plan.indices, plan.epochs, positions, got.mask_prob
        )
        batch = {
            "input_ids": torch.from_numpy(masked),
            "attention_mask": torch.from_numpy(in_seq.astype(np.int64)),
            "token_type_ids": torch.zeros((B, T), dtype=torch.int64),
            "labels": torch.from_numpy(labels),
        }
        if self.nsp:
            types = (np.arange(T)[None, :] >= a_len[:, None]) & in_seq
            batch["token_type_ids"] = torch.from_numpy(types.astype(np.int64))
            if self.sentence_order:
                batch["sentence_order_label"] = torch.from_numpy(order)
            else:
                batch["next_sentence_label"] = torch.from_numpy(got.is_random_next.astype(np.int64))
        if self.attention == "document":  # from the unmasked ids: masking never touches [SEP]
            docs, pos = document_index(ids, lengths, self.sep_id, nsp=self.nsp)
            batch["document_ids"] = torch.from_numpy(docs)
            batch["position_ids"] = torch.from_numpy(pos)
        if got.source is not None:  # a mixture: which source each row came from (pop it too)
            batch["source"] = torch.from_numpy(got.source)
        batch["masking_stats"] = stats
        return batch


def _whole_batch(batch: dict) -> dict:
    """collate_fn: the dataset already returns a finished batch."""
    return batch


DEFAULT_JOB_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def ignore_job_signals(_worker_id: int, signals: tuple[int, ...] = DEFAULT_JOB_SIGNALS) -> None:
    """worker_init_fn: a worker ignores the job's stop signals (SIGTERM and SIGINT by default,
    all of --preemption_signals: :func:`bertforge.preemption.job_signals`).

    Schedulers (SLURM on scancel, preemption or ``--signal=USR1@120``) and a terminal's Ctrl-C
    signal every process of the job, workers included. A worker killed by it makes its rank fail
    ("DataLoader worker (pid N) is killed by signal") before the rank can save at the step
    boundary. Ignoring them leaves the decision to the rank's main process, which saves, exits
    and shuts its workers down (a worker whose rank died exits by itself: torch's worker loop
    watches its parent; at a normal exit :class:`ShardLoader` stops them through their queues).
    """
    for sig in signals:
        signal.signal(sig, signal.SIG_IGN)
    # started with them blocked (ShardLoader.__iter__): one that came meanwhile is now dropped
    signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)


# Iterators whose workers are alive; shut down at interpreter exit (see ShardLoader).
_live_iterators: weakref.WeakSet = weakref.WeakSet()


def _shut_down_workers() -> None:
    """atexit: stop every live iterator's workers before multiprocessing's exit handler runs.

    That handler terminates (SIGTERM) and then joins every child. Our workers ignore SIGTERM
    (ignore_job_signals), so a program still holding an iterator at exit would wait forever.
    torch's own shutdown asks them to stop through their queues instead; a worker still alive
    after it (a batch that takes longer than torch's join timeout) is killed: the program is
    leaving and nothing reads its batches any more.
    """
    for it in list(_live_iterators):
        it._shutdown_workers()
        for w in it._workers:
            if w.is_alive():
                w.kill()
                w.join()


# atexit runs handlers last-registered first: registered after multiprocessing's exit handler
# (imported above) and torch's exit flag (torch.utils.data), ours runs before both.
atexit.register(_shut_down_workers)


class ShardLoader(DataLoader):
    """A DataLoader whose worker processes end when the program ends, whatever iterators are
    still referenced then (a script's ``it = iter(loader)``)."""

    def __iter__(self):
        # Workers start with the job's signals blocked, until ignore_job_signals ignores them: a
        # signal sent to the whole job while a worker starts (a validation pass's new workers)
        # killed it before its worker_init_fn ran, and its rank failed. Held here meanwhile, the
        # rank's own handler takes the signal once the workers are up.
        blocked = job_signals() if self.num_workers > 0 else ()
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
        try:
            it = super().__iter__()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        if isinstance(it, _MultiProcessingDataLoaderIter):
            _live_iterators.add(it)
        if isinstance(self.batch_sampler, CachedPlans) and self.batch_sampler.ahead:
            return Delivered(it, self.batch_sampler.cache)  # shards from object storage
        return it


def build_loader(
    reader,
    data_cfg: DataConfig,
    masking_cfg: MaskingConfig,
    *,
    rank: int = 0,
    world_size: int = 1,
    micro_batch_size: int = 32,
    consumed_samples: int = 0,
    train: bool = True,
    attention: str = "full",
    sentence_order: bool = False,
) -> DataLoader:
    """DataLoader of masked micro-batches for one rank (see module doc and docs/design.md s.3).

    train=True yields forever, starting at global position `consumed_samples`; train=False makes
    one pass in index order with fixed masks (epoch 0, mask_prob at the schedule's end).
    attention: "full" or "document" (batches carry document_ids and position_ids; resolve the
    flag's "auto" with pretrain.model.registry.resolve_attention first). sentence_order: the
    objective's (``ObjectiveSpec.sentence_order``), see :class:`MaskedBatches`.
    `loader.batch_sampler` is the GlobalSampler. The loader prefetches,
    so the caller tracks consumed_samples itself (+= global batch per optimizer step).
    """
    if reader.max_seq_len <= 0 or len(reader) == 0:
        raise ValueError(f"{getattr(reader, 'root', reader)}: the split has no sequences")
    window = data_cfg.window if train else 0
    if train and hasattr(reader, "sampler"):  # a mixture (pretrain.data.mixture) orders its sources
        sampler = reader.sampler(
            micro_batch_size,
            rank,
            world_size,
            consumed_samples,
            seed=data_cfg.seed,
            shuffle=data_cfg.shuffle,
            window=window,
        )
    else:
        sampler = GlobalSampler(
            len(reader),
            micro_batch_size,
            rank,
            world_size,
            consumed_samples,
            seed=data_cfg.seed,
            shuffle=data_cfg.shuffle,
            train=train,
            window=window,
            shard_counts=reader.shard_sequence_counts() if window else None,
        )
    if getattr(reader, "remote", False):  # object storage: fetched ahead of (or as) it is read
        sampler = CachedPlans(sampler, reader, ahead=train)
    # Validation masks every sample at the schedule's final rate, so evaluations stay comparable.
    final = masking_cfg.schedule_samples if masking_cfg.mask_prob_end is not None else 0
    dataset = MaskedBatches(
        reader,
        masking_cfg,
        data_cfg.pad_to_multiple_of,
        schedule_position=None if train else final,
        attention=attention,
        sentence_order=sentence_order,
    )
    workers = data_cfg.num_workers
    return ShardLoader(
        dataset,
        batch_sampler=sampler,
        collate_fn=_whole_batch,
        num_workers=workers,
        pin_memory=data_cfg.pin_memory and torch.cuda.is_available(),
        prefetch_factor=data_cfg.prefetch_factor if workers > 0 else None,
        persistent_workers=False,
        # The signals are read here, in the rank: a worker started by spawn inherits nothing.
        worker_init_fn=partial(ignore_job_signals, signals=job_signals()) if workers > 0 else None,
    )
