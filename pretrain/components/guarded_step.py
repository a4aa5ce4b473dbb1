"""The stability guard at work in the loop: the boundary optimizer step it may veto, its final word
after the update, and the rollback to the newest complete checkpoint.

:class:`~pretrain.stability.guard.StabilityGuard` decides; :class:`GuardedStep` acts on the
engine, the checkpoints, the lr and the metrics. The trainer calls :meth:`GuardedStep.step` in
place of the window's last ``engine.step()`` and :meth:`GuardedStep.judge` once the step is
recorded.
"""

from __future__ import annotations

from typing import Any

from bertforge.pretrain.components.run_parts import RunClock, RunOutputs, StepSetup
from bertforge.pretrain.config.ds_config import ConfigError
from bertforge.pretrain.config.train_config import TrainConfig
from bertforge.pretrain.run_folder.run_checkpoints import find_latest, read_state
from bertforge.pretrain.stability.guard import StabilityGuard, Verdict, can_discard, discard_update


class GuardedStep:
    """The guard's optimizer step, verdicts and rollbacks for one run."""

    def __init__(
        self,
        guard: StabilityGuard,
        place: StepSetup,
        outputs: RunOutputs,
        clock: RunClock,
        anchor_step: int = 0,
    ):
        self.guard, self.place, self.outputs, self.clock = guard, place, outputs, clock
        self.anchor_step = anchor_step  # 0: no anchor checkpoint (--guard_anchor_checkpoint)
        self.phase: str | None = None  # the --phases plan's phase of the last step judged

    @classmethod
    def for_run(
        cls,
        cfg: TrainConfig,
        place: StepSetup,
        outputs: RunOutputs,
        clock: RunClock,
        state: dict[str, Any] | None,
    ) -> GuardedStep | None:
        """The guard of a run with a resumed run's ``state`` (None without --stability_guard);
        its lr factor is already in the restored schedule's base lrs, or is applied here to a
        time clock's peak."""
        run_cfg, cfg = cfg, cfg.guard
        if not cfg.stability_guard:
            return None
        engine = place.engine
        if not can_discard(engine.optimizer):
            raise ConfigError(
                f"the stability guard needs a ZeRO optimizer (stage 1-3) to skip an update; "
                f"this one is {type(engine.optimizer).__name__}. Use ZeRO or "
                "--no_stability_guard."
            )
        if cfg.guard_lr_factor != 1.0 and clock.lr_clock is None:
            if not hasattr(engine.lr_scheduler, "base_lrs"):
                raise ConfigError(
                    "--guard_lr_factor needs the trainer's own lr schedule; the DeepSpeed config "
                    "brings a scheduler block. Remove it, or keep --guard_lr_factor 1.0."
                )
        clipping = engine.gradient_clipping() or 0.0
        guard = StabilityGuard(cfg, state, fp16=engine.fp16_enabled(), clipping=clipping)
        if clock.lr_clock is not None:
            clock.lr_clock.peak_lr *= guard.lr_factor
        return cls(guard, place, outputs, clock, anchor_step(run_cfg, engine, clock))

    def anchor_due(self, step: int) -> bool:
        """True once, at ``anchor_step`` or the first calm step after it, when the run has no
        checkpoint yet (the same on every rank): the trainer then saves one, so that a rollback
        has a target. Calm: no rollback in place within ``guard_window`` steps (a diverging run's
        weights make a poor target)."""
        if not self.anchor_step or step < self.anchor_step:
            return False
        if self.outputs.ckpts.last_saved_step is not None:
            self.anchor_step = 0  # a checkpoint exists: no anchor needed
            return False
        if step - self.guard.last_in_place < self.guard.cfg.guard_window:
            return False
        self.anchor_step = 0  # once (a failed save warns, as a periodic one does)
        return True

    def state_dict(self) -> dict[str, Any]:
        """The guard's state for a checkpoint (:meth:`StabilityGuard.state_dict`)."""
        return self.guard.state_dict()

    def step(self, rec: dict[str, Any]) -> Verdict:
        """The window's optimizer step, or (when the guard rejects the step's loss) a skipped
        one that drops the gradients; returns the guard's verdict on the loss."""
        verdict = self.guard.check_loss(rec["step"], rec["loss"])
        engine = self.place.engine
        if verdict.action != "ok":
            with discard_update(engine.optimizer):
                engine.step()  # counted as a skipped step, like an fp16 overflow
        else:
            engine.step()
        return verdict

    def judge(
        self, verdict: Verdict, rec: dict[str, Any], step: int, consumed: int
    ) -> tuple[str, int]:
        """The guard's final word on the step just taken, acted on and logged: (action, step to
        continue from); action is "ok", "skip", "rollback" or "give_up"."""
        guard = self.guard
        phase = rec.get("phase")
        if phase != self.phase and self.phase is not None:
            guard.new_phase()
        self.phase = phase
        if verdict.action == "ok" and verdict.event is None:  # a fine loss: judge the update
            verdict = guard.check_grad_norm(rec["step"], rec["grad_norm"])
        event, action = verdict.event, verdict.action
        if event is None:
            return action, step
        event.update(loss=rec["loss"], grad_norm=rec["grad_norm"])
        first = consumed - self.place.plan.global_batch
        if action == "skip":
            guard.skipped(event, first, consumed)
        elif action == "rollback":
            to_step = self.rollback(event, consumed)
            if to_step is not None:
                step = to_step
            else:  # nothing to go back to: skipped in place, lr cut, counted as a rollback
                action, old_factor = "skip", guard.lr_factor
                self._rescale_lr(guard.in_place(event, first, consumed), old_factor, old_factor)
        self.outputs.metrics.guard(event)
        if action == "give_up":
            self.outputs.metrics.error(self.give_up_message(event))
        return action, step

    def rollback(self, event: dict[str, Any], consumed: int) -> int | None:
        """Load the newest complete checkpoint into the engine (all ranks) and keep the data
        position, so the samples consumed since it are skipped; returns its step, or None when
        there is none (the caller skips or gives up). A checkpoint written on another number of
        ranks (a run resumed on more or fewer) is loaded through its universal conversion, as
        ``--resume`` loads it."""
        engine, ckpts = self.place.engine, self.outputs.ckpts
        path = find_latest(ckpts.root)
        state = read_state(path) if path is not None else None
        if state is None:
            event["reason"] = "no complete checkpoint to roll back to"
            return None
        seed = int(self.outputs.base_state.get("config", {}).get("run", {}).get("seed", 0))
        ckpts.load_any(engine, path, seed=seed)
        if int(state["world_size"]) != self.place.world:
            event["converted_from_world_size"] = int(state["world_size"])
        to_step = int(state["step"])
        engine.global_steps, engine.global_samples = to_step, consumed
        ckpts.last_saved_step = to_step
        saved_factor = float(state.get("guard", {}).get("lr_factor", 1.0))
        old_factor = self.guard.lr_factor
        self.guard.restore_windows(state.get("guard", {}))
        factor = self.guard.rolled_back(event, to_step, int(state["consumed_samples"]), consumed)
        event["checkpoint"] = str(path)
        self._rescale_lr(factor, old_factor, saved_factor)
        return to_step

    def _rescale_lr(self, factor: float, old_factor: float, saved_factor: float) -> None:
        """Apply the guard's new lr ``factor`` after a rollback: to a time clock's peak (ours,
        not in the checkpoint), or to the loaded schedule (it carries ``saved_factor``)."""
        engine, lr_clock = self.place.engine, self.clock.lr_clock
        if lr_clock is not None:
            lr_clock.peak_lr *= factor / old_factor
        elif factor != saved_factor:
            ratio = factor / saved_factor
            scheduler = engine.lr_scheduler
            scheduler.base_lrs = [lr * ratio for lr in scheduler.base_lrs]
            for group in engine.optimizer.param_groups:
                group["lr"] *= ratio

    def give_up_message(self, event: dict[str, Any]) -> str:
        """What to tell the user when the guard gives up (exit status 6)."""
        why = event.get("reason") or (
            f"{self.guard.rollbacks} rollbacks already (--guard_max_rollbacks "
            f"{self.guard.cfg.guard_max_rollbacks})"
        )
        return (
            f"the stability guard gave up at step {event['step']} "
            f"({event['event']}, value {event['value']}): {why}. Nothing was saved after the "
            "last checkpoint (if any). Lower --lr, set --guard_lr_factor, save more often "
            "(--save_interval), or turn the guard off with --no_stability_guard."
        )


def anchor_step(cfg: TrainConfig, engine: Any, clock: RunClock) -> int:
    """The step after which the guard's anchor checkpoint is due: the end of the lr warmup of a
    step schedule or ``guard_window`` steps, whichever is later (the guard judges by then); 0
    (none) with ``--guard_anchor_checkpoint false`` or a ``--save_interval`` (its saves are the
    targets)."""
    if not cfg.guard.guard_anchor_checkpoint or cfg.checkpoint.save_interval > 0:
        return 0
    lambdas = getattr(engine.lr_scheduler, "lr_lambdas", None) or [None]
    warmup = getattr(lambdas[0], "warmup_steps", 0) if clock.lr_clock is None else 0
    return max(int(warmup or 0), cfg.guard.guard_window)
