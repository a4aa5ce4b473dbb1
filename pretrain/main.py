#!/usr/bin/env python
"""Pretrain a BERT-style masked LM on DeepSpeed (ZeRO-2/3, fp16/bf16/fp32, exact resume).

    deepspeed pretrain/main.py --ds_config ds_configs/zero2.json --data SHARDS --model base \
        --output_dir RUN [--max_steps N --save_interval N --eval_interval N --resume auto ...]

Also runs under ``torchrun`` and as a plain ``python pretrain/main.py`` (one process).
``python pretrain/main.py --help`` lists every flag.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `pretrain`, `kernels`, `data_prep` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pretrain.config import ConfigError, TrainConfig, load_ds_config, parse_args, save_json_atomic

EXIT_MIN_LOSS_SCALE = 4  # fp16 kept overflowing at the minimum loss scale


def prepare(cfg: TrainConfig, world_size: int):
    """Every check that needs no process group: batch sizes, precision, optimizer, data."""
    from deepspeed.accelerator import get_accelerator

    from data_prep.reader import ShardReader
    from pretrain.batching import apply_batch, resolve_batch
    from pretrain.optim import configure_optimizer
    from pretrain.precision import resolve_precision

    src = cfg.run.ds_config
    ds = load_ds_config(src)
    plan = resolve_batch(ds, world_size, global_batch=cfg.batch.global_batch_size,
                         micro_batch=cfg.batch.micro_batch_size, grad_accum=cfg.batch.grad_accum,
                         source=src)
    ds = apply_batch(ds, plan)
    ds, precision, note = resolve_precision(ds, cfg.precision, source=src)
    ds = configure_optimizer(ds, cfg.optim, get_accelerator().device_name(), source=src)
    ds["steps_per_print"] = ds.get("steps_per_print", 10**9)
    if ds.get("tensorboard", {}).get("enabled"):
        ds["tensorboard"] = {**ds["tensorboard"], "output_path": str(Path(cfg.run.output_dir,
                                                                         "tensorboard"))}
    verify = cfg.data_cfg.verify
    train = ShardReader(cfg.run.data, split="train", verify=verify)
    try:
        val = ShardReader(cfg.run.data, split="validation", verify=verify)
    except ValueError:  # a build without a validation split: validation is skipped
        val = None
    return ds, plan, precision, note, train, val


def _copy_tokenizer(src, dst: Path) -> None:
    """Keep the tokenizer with the run, so export does not need the shard folder."""
    import shutil

    if dst.is_dir():
        return
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    os.replace(tmp, dst)


def _sum_across_ranks(values: list[float], device) -> list[float]:
    """One all-reduce (sum) of a few numbers; the identity on one rank."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return t.tolist()


def _iterate(loader):
    """``iter(loader)`` without touching the global RNG (DataLoader draws a base seed from it,
    which would shift dropout after a resume relative to the uninterrupted run)."""
    import torch

    with torch.random.fork_rng(devices=[]):
        return iter(loader)


class Trainer:
    """The optimizer-step loop with validation, metrics, checkpoints and preemption."""

    def __init__(self, cfg, engine, plan, loader, val_reader, device, metrics, ckpts, *,
                 base_state, precision, rank, world):
        self.cfg, self.engine, self.plan, self.device = cfg, engine, plan, device
        self.loader, self.val_reader = loader, val_reader
        self.metrics, self.ckpts, self.base_state = metrics, ckpts, base_state
        self.precision, self.rank, self.world = precision, rank, world

    def _batch(self, batch):
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def train_step(self, it, timer) -> dict:
        """Gradient accumulation over one global batch; returns the step's (global) numbers."""
        import torch

        eng, accum = self.engine, self.plan.grad_accum
        t0 = time.perf_counter()
        micro = [next(it) for _ in range(accum)]  # the whole window, to count its masked tokens
        timer.waited(time.perf_counter() - t0)
        mstats = [mb.pop("masking_stats", {}) or {} for mb in micro]
        local = [float(sum(int((mb["labels"] != -100).sum()) for mb in micro)),
                 float(sum(int(mb["attention_mask"].sum()) for mb in micro))]
        n_masked, n_tokens = _sum_across_ranks(local, self.device)
        # Each masked token of the global batch weighs 1/n_masked. DeepSpeed divides by the
        # accumulation steps (backward) and the world size (gradient averaging): undo both.
        scale = float(accum * self.world)
        sums = torch.zeros(5, dtype=torch.float64, device=self.device)
        for mb in micro:
            out = eng(**self._batch(mb), mlm_normalizer=max(n_masked, 1.0))
            loss = out["mlm_loss"] * scale
            if out.get("nsp_loss") is not None:
                loss = loss + out["nsp_loss"]
                sums[2] += out["nsp_loss"].detach().double() / accum
                sums[3] += out["nsp_correct"].double()
                sums[4] += out["nsp_count"].double()
            eng.backward(loss)
            eng.step()
            sums[0] += out["mlm_loss"].detach().double()
            sums[1] += out["num_correct"].double()
        if self.world > 1:
            import torch.distributed as dist
            dist.all_reduce(sums)
        rec = {"step": eng.global_steps, "loss": float(sums[0]),
               "mlm_loss": float(sums[0]), "mlm_accuracy": float(sums[1]) / max(n_masked, 1.0),
               "tokens": n_tokens, "masked": n_masked, "samples": self.plan.global_batch}
        if sums[4] > 0:
            rec["nsp_loss"] = float(sums[2]) / self.world
            rec["nsp_accuracy"] = float(sums[3]) / float(sums[4])
            rec["loss"] += rec["nsp_loss"]
        # Realised masking of this rank's micro-batches: counts add up, rates are averaged.
        for k in sorted({k for s in mstats for k in s}):
            vals = [s[k] for s in mstats if isinstance(s.get(k), (int, float))]
            if vals:
                is_count = k.endswith(("tokens", "sequences", "units"))
                rec[f"mask_{k}"] = sum(vals) if is_count else sum(vals) / len(vals)
        return rec

    def evaluate(self, step: int) -> dict | None:
        """MLM loss, accuracy and perplexity on the validation split (all ranks take part)."""
        import math

        import torch

        from pretrain.data import build_loader

        if self.val_reader is None or len(self.val_reader) == 0:
            return None
        loader = build_loader(self.val_reader, self.cfg.data_cfg, self.cfg.masking, rank=self.rank,
                              world_size=self.world, micro_batch_size=self.plan.micro_batch,
                              consumed_samples=0, train=False)
        it = _iterate(loader)
        totals = [0.0, 0.0, 0.0]  # summed token loss, correct, masked
        self.engine.eval()
        with torch.no_grad():
            for _ in range(self.cfg.log.eval_batches):
                mb = next(it, None)
                # ZeRO-3 gathers weights collectively: stop when any rank runs out of batches.
                if _sum_across_ranks([0.0 if mb is not None else 1.0], self.device)[0] > 0:
                    break
                mb.pop("masking_stats", None)
                out = self.engine(**self._batch(mb), mlm_normalizer=1.0)  # normaliser 1: sums
                totals[0] += float(out["mlm_loss"])
                totals[1] += float(out["num_correct"])
                totals[2] += float(out["num_masked"])
        self.engine.train()
        loss_sum, correct, masked = _sum_across_ranks(totals, self.device)
        loss = loss_sum / max(masked, 1.0)
        rec = {"step": step, "split": "validation", "val_loss": loss,
               "val_accuracy": correct / max(masked, 1.0),
               "val_perplexity": math.exp(min(loss, 50.0)), "val_masked_tokens": masked}
        self.metrics.eval(rec, self.engine.global_samples)
        return rec

    def save(self, step: int, consumed: int, reason: str) -> None:
        path = self.ckpts.save(self.engine, step, {**self.base_state, "consumed_samples": consumed,
                                                   "reason": reason})
        self.metrics.print(f"checkpoint ({reason}) step {step}: {path}")

    def run(self, start_step: int, consumed: int) -> int:
        """Train from ``start_step`` to ``max_steps``; returns the exit status."""
        import deepspeed  # noqa: F401 - engine methods below

        from pretrain.checkpoint import PreemptionHandler
        from pretrain.metrics import StepTimer
        from pretrain.optim import current_lr

        cfg, eng = self.cfg, self.engine
        preempt, timer, it = PreemptionHandler(), StepTimer(), _iterate(self.loader)
        step = start_step
        try:
            while step < cfg.run.max_steps:
                timer.restart()
                try:
                    rec = self.train_step(it, timer)
                except Exception as e:  # DeepSpeed raises a bare Exception at the minimum scale
                    if "loss scale already at minimum" not in str(e):
                        raise
                    self.metrics.print(
                        f"[pretrain] ERROR: fp16 gradients kept overflowing at the minimum loss "
                        f"scale ({eng.optimizer.cur_scale}) at step {step + 1}; training stopped and "
                        "nothing was saved after the last checkpoint. Lower the learning rate, use "
                        "bf16, or raise min_loss_scale.")
                    return EXIT_MIN_LOSS_SCALE
                step, consumed = step + 1, consumed + self.plan.global_batch
                seconds = timer.elapsed()
                norm = eng.get_global_grad_norm()
                rec.update({"lr": current_lr(eng.optimizer), "skipped": not eng.was_step_applied(),
                            "skipped_total": int(eng.skipped_steps),
                            "loss_scale": float(getattr(eng.optimizer, "cur_scale", 1.0)),
                            "grad_norm": float(norm) if norm is not None else None,
                            "data_wait_s": timer.data_wait, "consumed_samples": consumed})
                self.metrics.step(rec, seconds, eng.global_samples)
                if cfg.log.eval_interval and step % cfg.log.eval_interval == 0 and \
                        step < cfg.run.max_steps:
                    self.evaluate(step)
                time_due = self.ckpts.due(step, 0, cfg.checkpoint.save_interval_minutes)
                flags = _sum_across_ranks([1.0 if preempt.signal is not None else 0.0,
                                           1.0 if (time_due and self.rank == 0) else 0.0],
                                          self.device)
                if flags[0] > 0:
                    self.save(step, consumed, "signal")
                    self.metrics.print(f"[pretrain] stopped by a signal after step {step}; "
                                       "continue with --resume auto")
                    return 0
                reason = self.ckpts.due(step, cfg.checkpoint.save_interval, 0.0) or \
                    ("time" if flags[1] > 0 else None)
                if reason:
                    self.save(step, consumed, reason)
            self.evaluate(step)
            if cfg.checkpoint.save_final and self.ckpts.last_saved_step != step:
                self.save(step, consumed, "final")
            return 0
        finally:
            preempt.restore()


def train(cfg: TrainConfig) -> int:
    """Build data, model and engine; run the loop; returns the process exit status."""
    import deepspeed
    import torch
    from deepspeed.accelerator import get_accelerator

    from pretrain import checkpoint as ck
    from pretrain.data import build_loader
    from pretrain.distributed import init_distributed
    from pretrain.metrics import MetricsWriter, device_peak_tflops
    from pretrain.model import build_model
    from pretrain.optim import build_schedule, lr_scheduler_factory, param_groups

    world_env = int(os.environ.get("WORLD_SIZE", "1"))
    ds, plan, precision, note, train_reader, val_reader = prepare(cfg, world_env)
    dist_info = init_distributed(cfg.run.dist_timeout_s)
    rank, world, local_rank = dist_info.rank, dist_info.world_size, dist_info.local_rank
    main_rank = rank == 0
    if note and main_rank:
        print(f"[pretrain] WARNING: {note}", flush=True)

    ckpts = ck.CheckpointManager(cfg.run.output_dir, cfg.checkpoint.keep_last, rank, world)
    resume = ck.resolve_resume(cfg.run.resume, cfg.run.output_dir)
    state = None
    fingerprint = train_reader.manifest["tokenizer"]["fingerprint"]
    model_dict = dataclasses.asdict(cfg.model_cfg)
    if resume is not None:
        state = ck.read_state(resume)
        ck.check_compatible(state, vocab_size=train_reader.vocab_size,
                            tokenizer_fingerprint=fingerprint, model_config=model_dict, path=resume)
        if state["world_size"] != world:
            resume = ckpts.to_universal(resume)  # rank 0 converts; all ranks load from it
            ds["checkpoint"] = {**ds.get("checkpoint", {}), "load_universal": True}

    torch.manual_seed(cfg.run.seed)  # identical initial weights on every rank
    model = build_model(cfg.model_cfg, vocab_size=train_reader.vocab_size,
                        nsp=train_reader.format == "nsp", max_seq_len=train_reader.max_seq_len)
    ac_mode = cfg.memory.activation_checkpointing or (
        "deepspeed" if ds.get("activation_checkpointing", {}).get("enabled") else "none")
    if ac_mode == "deepspeed":
        deepspeed.checkpointing.configure(None, deepspeed_config=ds)
    model.set_activation_checkpointing(ac_mode)

    schedule = None if "scheduler" in ds else build_schedule(cfg.optim, cfg.run.max_steps)
    wd = float(ds["optimizer"]["params"].get("weight_decay", 0.0))
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=param_groups(model, wd), config=ds,
        lr_scheduler=lr_scheduler_factory(schedule) if schedule else None)

    start_step, consumed = 0, 0
    if resume is not None:
        ckpts.load(engine, resume)
        engine._config.load_universal_checkpoint = False  # later saves are ordinary ones
        sched = engine.lr_scheduler
        if schedule is not None and getattr(sched, "lr_lambdas", None):
            if sched.lr_lambdas[0] != schedule and main_rank:
                print(f"[pretrain] learning-rate schedule changed since the checkpoint: "
                      f"{sched.lr_lambdas[0]} -> {schedule}", flush=True)
            sched.lr_lambdas = [schedule] * len(sched.lr_lambdas)  # the flags of this run decide
        start_step, consumed = int(state["step"]), int(state["consumed_samples"])
        ckpts.last_saved_step = start_step
        engine.global_steps, engine.global_samples = start_step, consumed
        if state["world_size"] != world:  # per-rank RNG cannot carry over: derive it
            torch.manual_seed(cfg.run.seed + 1000003 * start_step + rank)
        if main_rank:
            print(f"[pretrain] resumed from {resume} at step {start_step} "
                  f"({consumed} samples consumed; saved on {state['world_size']} ranks, "
                  f"now {world})", flush=True)
    elif main_rank and cfg.run.resume == "auto":
        print(f"[pretrain] no complete checkpoint in {cfg.run.output_dir}: starting fresh",
              flush=True)

    if main_rank:
        _copy_tokenizer(train_reader.tokenizer_path, Path(cfg.run.output_dir) / "tokenizer")
        save_json_atomic(Path(cfg.run.output_dir) / "config.json",
                         {**cfg.to_dict(), "deepspeed": ds, "batch_plan": plan.as_dict(),
                          "precision_resolved": precision, "activation_checkpointing": ac_mode,
                          "world_size": world, "tokenizer_fingerprint": fingerprint,
                          "precision_note": note})

    device = torch.device(get_accelerator().device_name(), local_rank) \
        if get_accelerator().device_name() != "cpu" else torch.device("cpu")
    loader = build_loader(train_reader, cfg.data_cfg, cfg.masking, rank=rank, world_size=world,
                          micro_batch_size=plan.micro_batch, consumed_samples=consumed, train=True)
    seq_len = train_reader.max_seq_len
    metrics = MetricsWriter(cfg.run.output_dir, rank=rank, max_steps=cfg.run.max_steps,
                            start_step=start_step, log_interval=cfg.log.log_interval,
                            flops_per_token=model.flops_per_token(seq_len),
                            peak_tflops=device_peak_tflops(precision), world_size=world,
                            monitor=engine.monitor if main_rank else None,
                            progress=cfg.log.progress)
    trainer = Trainer(cfg, engine, plan, loader, val_reader, device, metrics, ckpts,
                      base_state={"config": cfg.to_dict(), "vocab_size": train_reader.vocab_size,
                                  "tokenizer_fingerprint": fingerprint, "precision": precision,
                                  "nsp": train_reader.format == "nsp"},
                      precision=precision, rank=rank, world=world)
    try:
        return trainer.run(start_step, consumed)
    finally:
        metrics.close()


def _shutdown() -> None:
    """Leave the process group together (otherwise ranks linger in teardown for seconds)."""
    import torch.distributed as dist

    if dist.is_initialized():
        if dist.get_world_size() > 1:
            dist.barrier()
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``python pretrain/main.py`` and the launchers."""
    cfg = parse_args(argv)
    from data_prep.reader import ShardError
    from pretrain.batching import BatchSizeError
    from pretrain.checkpoint import CheckpointError
    from pretrain.optim import OptimizerConfigError
    from pretrain.precision import PrecisionError
    if cfg.run.dry_run:
        from pretrain.dry_run import main as dry_run_main
        return dry_run_main(cfg)
    try:
        status = train(cfg)
        _shutdown()
        return status
    except (ConfigError, BatchSizeError, PrecisionError, OptimizerConfigError, CheckpointError, ShardError) as e:
        print(f"[pretrain] ERROR: {e}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    code = main()
    # Everything is written and closed by now. Skip the interpreter's native teardown: with a
    # multi-rank gloo group it takes ~7 s per run on CPU (measured, no Python frame running).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
