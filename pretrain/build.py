"""What a training run is made of, built in order for :mod:`pretrain.main`.

:func:`resolve_run` checks everything that can fail on the user's input, before any rendezvous
(the dry run calls it too): the shards, the resume point, the DeepSpeed config for this world
size. :func:`build_training` then joins the process group and builds the model, the engine, the
resume position, the loader and the outputs into the grouped parts of a
:class:`~pretrain.trainer.Trainer`. Each concept's part is assembled in its own home (the data's
in ``components/run_data.py``, the model's and the engine's in ``components/engine.py``, the
schedule's in ``schedule/assembly.py``, the resume point in ``checkpoints/assembly.py``, the
outputs in ``components/run_outputs.py``); this module puts them together in order.

DeepSpeed is imported inside the functions that use it: ``import deepspeed`` costs about half a
second and prints an accelerator line, which ``--help`` and ``--dry-run`` need neither of.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from bertforge.logs import get_logger
from bertforge.preemption import PreemptionHandler
from bertforge.pretrain.checkpoints.assembly import check_resume, resume_point
from bertforge.pretrain.components import engine as model_engine
from bertforge.pretrain.components.data_order import resolve_order
from bertforge.pretrain.components.downstream_jobs import DownstreamJobs
from bertforge.pretrain.components.guarded_step import GuardedStep
from bertforge.pretrain.components.run_data import open_shards, training_data, verify_shards_once
from bertforge.pretrain.components.run_outputs import (
    open_checkpoints,
    open_outputs,
    write_run_files,
)
from bertforge.pretrain.components.run_parts import Resolved, RunClock, join_ranks
from bertforge.pretrain.config.ds_config import resolve_deepspeed_config, with_derived_batch
from bertforge.pretrain.config.train_config import TrainConfig
from bertforge.pretrain.schedule import assembly as schedule_parts
from bertforge.pretrain.trainer import Trainer

log = get_logger(__name__)


def resolve_run(cfg: TrainConfig) -> Resolved:
    """Everything that can fail on the user's input fails here, before any rendezvous (the dry
    run calls this too, so it fails the same way). ``cfg`` is not edited: the config as it will
    run (architecture from --init_from, length from --phases or --anneal_from) is ``.cfg``."""
    from deepspeed.accelerator import get_accelerator  # lazy: see the module docstring

    world, accel = int(os.environ.get("WORLD_SIZE", "1")), get_accelerator().device_name()
    train_reader, val_readers = open_shards(cfg)
    model_cfg = model_engine.model_for_shards(cfg, train_reader.max_seq_len)
    cfg = dataclasses.replace(cfg, model_cfg=model_cfg)
    # what the arch cannot train (the shards' objective, a flag), before any rendezvous
    objective = model_engine.objective_for(cfg, train_reader)
    point = resume_point(cfg, train_reader)
    cfg = resolve_order(cfg, train_reader, point)  # the checkpoint's order, the window's size
    if point is not None:
        cfg = check_resume(cfg, point, objective)
    changed = point is not None and point.world_size_changed(world)
    setup = resolve_deepspeed_config(cfg, world, accel, load_universal=changed)
    cfg = with_derived_batch(cfg, setup.batch)  # a recipe's accumulation for another world size
    model_engine.check_engine_fits(cfg, setup)
    cfg, setup, val_readers, phases = schedule_parts.resolve_phases(
        cfg, setup, train_reader, point, val_readers
    )
    cfg, plan = schedule_parts.resolve_anneal(cfg, train_reader, point, setup)
    return Resolved(train_reader, val_readers, point, setup, accel, plan, phases, cfg, objective)


@dataclass
class Training:
    """A built run: the trainer and where it starts (step, consumed samples)."""

    trainer: Trainer
    start_step: int
    consumed: int


def build_training(
    cfg: TrainConfig, run: Resolved, launched: float, preempt: PreemptionHandler | None = None
) -> Training:
    """Join the ranks, build model, engine, resume position, loader and outputs into a Trainer.
    ``launched``: budget.launch_clock of this launch (a time budget counts start-up too);
    ``preempt``: main's stop-signal flag, installed before the rendezvous (the trainer acts on a
    signal that arrived during this start-up before its first step)."""
    schedule_parts.check_batch_ramp(cfg, run.setup)  # before the rendezvous
    place = join_ranks(cfg, run)
    if run.setup.precision_note:
        log.warning(run.setup.precision_note)
    if run.setup.batch.note:
        log.info(run.setup.batch.note)
    verify_shards_once(cfg, place.rank, place.world, place.device, run.phases)
    init_from = cfg.run.init_from if run.point is None else None  # a resume wins over it
    longest = run.phases.max_seq_len if run.phases else None
    model, init = model_engine.build_encoder(
        cfg, run.train_reader, run.setup, run.objective, init_from=init_from, max_seq_len=longest
    )
    init_report = model_engine.announce_init(cfg, init, run.point)
    place.engine, schedule = model_engine.build_engine(
        cfg, model, run.setup.config, run.anneal, run.phases
    )
    ckpts = open_checkpoints(cfg, place)
    start = schedule_parts.start_position(
        cfg, run.point, run.anneal, run.train_reader, place.engine, ckpts, schedule
    )
    if place.rank == 0:
        write_run_files(cfg, run, place.world, init_report)
    clock = RunClock(
        *schedule_parts.run_clock(cfg, run.point, launched, schedule, run.setup.config)
    )
    data = training_data(
        cfg, place, run.train_reader, run.val_readers, run.phases, run.objective, schedule, start
    )
    outputs = open_outputs(
        cfg, run, place, model, ckpts, start[0], clock.budget.elapsed_before_s, init_report
    )
    guard_state = run.point.state.get("guard") if run.point else None
    trainer = Trainer(
        cfg,
        place,
        data,
        outputs,
        clock,
        downstream=DownstreamJobs.for_run(cfg, place.rank, outputs.metrics),
        guard=GuardedStep.for_run(cfg, place, outputs, clock, guard_state),
        preempt=preempt,
        schedule=schedule,
    )
    return Training(trainer, *start)
