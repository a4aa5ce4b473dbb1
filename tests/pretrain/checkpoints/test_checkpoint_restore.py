"""CheckpointManager.restore in-process on one rank: what a resume puts back into the engine.

The launcher tests (tests/e2e/test_two_rank_training.py) prove resume end to end; these check each
thing restore() is responsible for directly, against the engine that saved the checkpoint.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from helpers.engines import one_rank_engine, tiny_config

pytestmark = pytest.mark.slow


def _config(shards, run, *extra: str):
    return tiny_config(shards, run, "--lr", "1e-3", "--warmup_steps", "1", *extra)


def _engine(cfg, seed: int, *, load_universal: bool = False):
    """A fresh engine for ``cfg`` whose initial weights come from ``seed``."""
    seeded = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, seed=seed))
    return one_rank_engine(seeded, load_universal=load_universal)


def _train_two_steps(cfg):
    """Two optimizer steps through the Trainer, saved as step 2; returns the engine."""
    from bertforge.pretrain.checkpoints.checkpoint import CheckpointManager
    from bertforge.pretrain.components.metrics import MetricsWriter
    from bertforge.pretrain.components.run_parts import RunOutputs, StepSetup, TrainData
    from bertforge.pretrain.data.loader import build_loader
    from bertforge.pretrain.trainer import Trainer

    engine, _, setup, reader = _engine(cfg, cfg.run.seed)
    loader = build_loader(reader, cfg.data_cfg, cfg.masking, micro_batch_size=4, train=True)
    metrics = MetricsWriter(
        cfg.run.output_dir,
        rank=0,
        max_steps=2,
        start_step=0,
        log_interval=1,
        flops_per_token=None,
        peak_tflops=None,
        world_size=1,
        progress=False,
    )
    ckpts = CheckpointManager(cfg.run.output_dir, cfg.checkpoint, 0, 1)
    state = {
        "config": cfg.to_dict(),
        "vocab_size": reader.vocab_size,
        "nsp": False,
        "tokenizer_fingerprint": reader.manifest["tokenizer"]["fingerprint"],
    }
    trainer = Trainer(
        cfg,
        StepSetup(engine, setup.batch, torch.device("cpu")),
        TrainData(loader),
        RunOutputs(metrics, ckpts, state),
    )
    assert trainer.run(0, 0) == 0
    metrics.close()
    return engine, reader


def _resume_point(cfg, reader):
    from bertforge.pretrain.checkpoints.resume import find_resume

    return find_resume(
        "auto",
        cfg.run.output_dir,
        vocab_size=reader.vocab_size,
        tokenizer_fingerprint=reader.manifest["tokenizer"]["fingerprint"],
        model_config=dataclasses.asdict(cfg.model_cfg),
    )


def _weights(engine) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in engine.module.state_dict().items()}


def test_restore_puts_back_weights_counters_and_the_schedule(
    english_shards, tmp_path, one_rank_group, capsys
):
    from bertforge.pretrain.checkpoints.checkpoint import CheckpointManager

    cfg = _config(english_shards, tmp_path / "run", "--max_steps", "2")
    saved, reader = _train_two_steps(cfg)
    point = _resume_point(cfg, reader)
    assert point is not None and point.path.name == "step_00000002"

    # A longer run continues from it: new max_steps, hence a new schedule object.
    cfg10 = _config(english_shards, tmp_path / "run", "--max_steps", "10", "--resume", "auto")
    engine, schedule, _, _ = _engine(cfg10, seed=999)  # other initial weights
    assert any(
        not torch.equal(a, b) for a, b in zip(_weights(engine).values(), _weights(saved).values())
    )
    ckpts = CheckpointManager(cfg10.run.output_dir, cfg10.checkpoint, 0, 1)
    step, consumed = ckpts.restore(engine, point, schedule=schedule, seed=cfg10.run.seed)

    assert (step, consumed) == (2, 8)
    assert (engine.global_steps, engine.global_samples) == (2, 8)
    assert ckpts.last_saved_step == 2  # a final save at step 2 would not be repeated
    for name, w in _weights(saved).items():
        assert torch.equal(_weights(engine)[name], w), name
    sched = engine.lr_scheduler
    assert sched.last_epoch == saved.lr_scheduler.last_epoch == 2
    # The schedule continues as saved, and the launch is told that its --max_steps 10 ends the run
    # but does not stretch the lr (before: "--max_steps is ignored", then it was honoured).
    assert [f.total_steps for f in sched.lr_lambdas] == [2] * len(sched.lr_lambdas)
    assert sched.get_last_lr() == saved.lr_scheduler.get_last_lr()
    out = capsys.readouterr().out
    assert "schedule continues as saved" in out and "--max_steps is ignored" not in out
    assert "--max_steps 10 still ends this run at step 10" in out
    assert "(total steps 2 -> 10)" in out and "Pass --override_lr_schedule" in out
    assert engine._config.load_universal_checkpoint is False


def test_restore_with_override_puts_the_flags_schedule_in_effect_even_after_a_rollback(
    english_shards, tmp_path, one_rank_group, capsys
):
    from bertforge.pretrain.checkpoints.checkpoint import CheckpointManager

    cfg = _config(english_shards, tmp_path / "run", "--max_steps", "2")
    _train_two_steps(cfg)
    flags = "--max_steps 6 --lr 2e-3 --schedule wsd --decay_steps 2 --resume auto"
    cfg6 = _config(english_shards, tmp_path / "run", *flags.split(), "--override_lr_schedule")
    engine, schedule, _, reader = _engine(cfg6, seed=999)
    ckpts = CheckpointManager(cfg6.run.output_dir, cfg6.checkpoint, 0, 1)
    point = _resume_point(cfg, reader)
    ckpts.restore(engine, point, schedule=schedule, seed=cfg6.run.seed, override_lr=True)

    def in_effect():
        sched = engine.lr_scheduler
        lrs = [g["lr"] for g in engine.optimizer.param_groups]
        return sched.lr_lambdas, sched.base_lrs, sched.last_epoch, lrs

    # At the checkpoint's position (2 scheduler steps), the flags' schedule and peak lr.
    new = ([schedule, schedule], [2e-3, 2e-3], 2, [2e-3 * schedule(2)] * 2)
    assert in_effect() == new
    out = capsys.readouterr().out
    assert "--override_lr_schedule: the learning-rate schedule comes from this launch's" in out
    for change in ("schedule warmup_decay -> wsd", "peak lr 0.001 -> 0.002", "total steps 2 -> 6"):
        assert change in out
    # The guard's rollback loads the same (older) checkpoint again: the override stays.
    ckpts.load(engine, point.path)
    assert in_effect() == new


def test_restore_onto_another_world_size_loads_universal_and_derives_the_rng(
    english_shards, tmp_path, one_rank_group
):
    from bertforge.pretrain.checkpoints.checkpoint import CheckpointManager
    from bertforge.pretrain.checkpoints.resume import ResumePoint

    cfg = _config(english_shards, tmp_path / "run", "--max_steps", "2")
    saved, reader = _train_two_steps(cfg)
    point = _resume_point(cfg, reader)
    # As if the checkpoint had been written by 2 ranks: restore must take the universal path.
    moved = ResumePoint(point.path, {**point.state, "world_size": 2})
    assert moved.world_size_changed(1)
    engine, schedule, setup, _ = _engine(cfg, seed=999, load_universal=True)
    assert setup.config["checkpoint"]["load_universal"] is True
    ckpts = CheckpointManager(cfg.run.output_dir, cfg.checkpoint, 0, 1)
    assert ckpts.restore(engine, moved, schedule=schedule, seed=cfg.run.seed) == (2, 8)

    universal = tmp_path / "run" / "checkpoints" / "universal" / "step_00000002"
    assert (universal / "COMPLETE").is_file()
    assert json.loads((universal / "trainer_state.json").read_text())["step"] == 2
    for name, w in _weights(saved).items():
        torch.testing.assert_close(_weights(engine)[name], w, rtol=0, atol=0, msg=name)
    assert torch.initial_seed() == cfg.run.seed + 1000003 * 2 + 0  # derived, not the saved RNG
    assert engine._config.load_universal_checkpoint is False  # later saves are ordinary
