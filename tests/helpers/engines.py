"""A one-rank DeepSpeed engine built as a run builds it, for the checkpoint tests that save and
restore one without launching a job."""

from __future__ import annotations

from bertforge.data_prep.reader import ShardReader
from bertforge.pretrain.components.engine import build_encoder, build_engine, objective_for
from bertforge.pretrain.config.cli import parse_args
from bertforge.pretrain.config.ds_config import resolve_deepspeed_config
from helpers.commands import REPO


def tiny_config(shards, run, *extra: str):
    """The parsed flags of a `tiny` run on ``shards`` into ``run``: the CPU DeepSpeed config, a
    global and micro batch of 4, no progress bar, then ``extra``."""
    return parse_args(
        ["--ds_config", str(REPO / "ds_configs" / "cpu.json"), "--data", str(shards)]
        + ["--output_dir", str(run), "--model", "tiny", "--global_batch_size", "4"]
        + ["--micro_batch_size", "4", "--progress", "false", *extra]
    )


def one_rank_engine(cfg, *, load_universal: bool = False):
    """(engine, schedule, DeepSpeed setup, train reader) of ``cfg`` on one CPU rank: the model
    of the objective the shards and flags give, seeded with ``cfg.run.seed``."""
    setup = resolve_deepspeed_config(cfg, 1, "cpu", load_universal=load_universal)
    reader = ShardReader(cfg.run.data_sources[0], "train")
    model, _ = build_encoder(cfg, reader, setup, objective_for(cfg, reader))
    engine, schedule = build_engine(cfg, model, setup.config)
    return engine, schedule, setup, reader
