"""The data's part of a run, for :mod:`pretrain.build`: --data's shards opened (one folder or a
weighted mixture), their sha256 checked once per run folder across the ranks, and the training
loader at the step the run starts from."""

from __future__ import annotations

from pathlib import Path

from bertforge.data_prep.object_store import is_url
from bertforge.data_prep.sources import parse_mixture
from bertforge.pretrain.components.data_order import configure_cache
from bertforge.pretrain.components.run_parts import StepSetup, TrainData
from bertforge.pretrain.config.train_config import TrainConfig
from bertforge.pretrain.data.cached_plans import keep_validation_shards
from bertforge.pretrain.data.loader import build_loader
from bertforge.pretrain.data.mixture import open_training, validation_readers
from bertforge.pretrain.data.shard_check import verify_once
from bertforge.pretrain.distributed.startup import sum_across_ranks
from bertforge.pretrain.model.registry import resolve_attention
from bertforge.pretrain.model.specs import ObjectiveSpec
from bertforge.pretrain.schedule.phases import PhaseTracker


def open_shards(cfg: TrainConfig):
    """(training reader, [(source name, validation reader)]) of --data: one shard folder or a
    weighted mixture (pretrain.data.mixture); a source without validation data is warned about.
    The shard cache is configured first: a folder in object storage opens through it."""
    configure_cache(cfg)
    sources = parse_mixture(cfg.run.data_sources)
    verify = cfg.data_cfg.verify
    return open_training(sources, verify=verify), validation_readers(sources, verify=verify)


def verify_shards_once(
    cfg: TrainConfig, rank: int, world: int, device, phases: PhaseTracker | None = None
) -> None:
    """With verify "size" (the default), every shard file's sha256 is checked once per shard
    folder and run folder, split across the ranks after the rendezvous (pretrain.data.shard_check);
    "full" checks them at every launch on every rank, "none" not at all. The folders are --data's
    and those of every phase's own data."""
    if cfg.data_cfg.verify != "size":
        return
    folders = [s.path for s in parse_mixture(cfg.run.data_sources)]
    if phases is not None:
        folders += [s.path for s in phases.phase_sources() if s.path not in folders]
    folders = [f for f in folders if not is_url(f)]  # fetched shards: checked on arrival
    verify_once(
        folders,
        Path(cfg.run.output_dir),
        rank,
        world,
        agree=lambda failed: sum_across_ranks([float(failed)], device)[0],
    )


def training_data(
    cfg: TrainConfig,
    place: StepSetup,
    train_reader,
    val_readers: list,
    phases: PhaseTracker | None,
    objective: ObjectiveSpec,
    schedule,
    start: tuple[int, int],
) -> TrainData:
    """The loader at ``start`` (step, consumed samples) over the data and masking the schedule
    gives that step (a phase's own), the validation readers (their shards fetched now) and every
    reader a phase may switch to."""
    start_step, consumed = start
    keep_validation_shards(val_readers, cfg.log.eval_batches * schedule.global_batch)
    readers = {None: train_reader, **(phases.readers if phases else {})}
    data, stream_start = schedule.data_at(start_step)  # the step's phase's data and masking
    loader = build_loader(
        readers[data],
        cfg.data_cfg,
        schedule.masking_at(start_step, cfg.masking),
        rank=place.rank,
        world_size=place.world,
        micro_batch_size=place.plan.micro_batch,
        consumed_samples=consumed - stream_start,
        train=True,
        attention=resolve_attention(cfg.model_cfg.attention, cfg.model_cfg.arch),
        sentence_order=objective.sentence_order,
    )
    return TrainData(loader, val_readers, readers)
