"""The stability guard: judge each optimizer step's loss and grad norm, skip or roll back.

:class:`StabilityGuard` owns the decision and nothing else (no DeepSpeed, no collectives): the
trainer hands it the step's global loss (all-reduced, identical on every rank) *before* the
optimizer step and the global grad norm *after* it, so every rank decides the same thing.

- **Spike**: a value whose robust z-score over the window of recent healthy values
  (``(x - median) / (1.4826 * MAD)``) exceeds ``guard_z`` *and* that is above ``guard_min_ratio``
  times the median (so a flat curve, MAD ~ 0, never triggers). Judged once ``guard_min_history``
  healthy steps are known. Only upward moves count.
- **Loss spike** -> ``"skip"``: the step's update is not applied (:func:`discard_update`), which
  helps when the batch is to blame. A spike on the step right after a skipped one is blamed on
  the weights the skip kept (the same weights, another batch): skipping again would change
  nothing, so its update is applied (clipped where clipping is on) and the spike recorded and
  counted. Measured (docs/guard.md): single-step loss spikes that the same run without the guard
  left behind in one step otherwise repeated on every following batch until the guard gave up.
- **Grad-norm spike** (known only after the update): recorded. With gradient clipping on, the
  update was bounded, so it counts for nothing else (on a healthy run at lr 1e-3..3e-3 such spikes
  of up to 25x the median come and go); without clipping it counts towards a burst.
- ``guard_spikes`` counted spikes within ``guard_spike_window`` steps, a non-finite loss, or a
  non-finite grad norm of an applied step -> ``"rollback"`` to the newest complete checkpoint.
- **Loss climb**: the median of the last ``guard_min_history`` losses above ``guard_climb``
  times the lowest such median of the run (or of its phase) -> ``"rollback"``: a divergence
  whose loss rises step by step, each step too small to be a spike.
- A rollback after ``guard_max_rollbacks`` of them -> ``"give_up"`` (exit :data:`EXIT_GAVE_UP`).
- A rollback with no checkpoint to go back to yet is taken in place (:meth:`in_place`): the
  step's update is dropped, the lr is multiplied by ``guard_lr_factor``, and it counts as a
  rollback, so a divergence that persists still gives up after ``guard_max_rollbacks``.

Under fp16 the loss scaler owns non-finite values (it skips the step and lowers the scale); the
guard judges spikes only. Its state (rollbacks, skipped sample ranges, lr factor) goes into every
checkpoint's ``trainer_state.json`` under ``"guard"``, so a resumed run keeps it.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from bertforge.pretrain.config.train_config import GuardConfig

EXIT_GAVE_UP = 6  # the guard rolled back guard_max_rollbacks times and diverged again
MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution times this is its standard deviation


def robust_z(value: float, window: list[float]) -> tuple[float, float]:
    """(median of ``window``, robust z-score of ``value`` against it); z is inf for a value above
    a window whose MAD is 0."""
    median = statistics.median(window)
    mad = statistics.median(abs(v - median) for v in window)
    if mad == 0.0:
        return median, (math.inf if value > median else 0.0)
    return median, (value - median) / (MAD_TO_SIGMA * mad)


def outcome(event: dict[str, Any]) -> str:
    """What became of the step a guard ``event`` is about, in words for the console (its
    ``action`` says the same to metrics.jsonl): "kept" (its update applied, and clipped where
    the event says so), "skipped" (its update dropped), "rolled back" or "gave up"."""
    action = event["action"]
    if action == "ok":
        clipped = event.get("clipped_at")
        return f"kept (update clipped to norm {clipped:g})" if clipped else "kept"
    if action == "skip":
        return "skipped (update dropped)"
    if action == "rollback":
        return "rolled back"
    if action == "give_up":
        return "gave up"
    raise ValueError(f"unknown guard action {action!r}")


@dataclass
class Verdict:
    """What the guard decided about a step, and the event to log (None for a plain "ok")."""

    action: str  # "ok" | "skip" | "rollback" | "give_up"
    event: dict[str, Any] | None = None


class StabilityGuard:
    """The decision of the stability guard for one run (see the module docstring)."""

    def __init__(
        self,
        cfg: GuardConfig,
        state: dict[str, Any] | None = None,
        fp16: bool = False,
        clipping: float = 0.0,
    ):
        self.cfg, self.fp16 = cfg, fp16
        self.clipping = float(clipping or 0.0)  # DeepSpeed's gradient_clipping (0: none)
        self.losses: deque[float] = deque(maxlen=cfg.guard_window)
        self.norms: deque[float] = deque(maxlen=cfg.guard_window)
        self.spike_steps: deque[int] = deque()
        self._pending_loss: float | None = None
        state = state or {}
        self.rollbacks = int(state.get("rollbacks", 0))
        self.lr_factor = float(state.get("lr_factor", 1.0))
        self.events: list[dict[str, Any]] = list(state.get("events", []))
        self.losses.extend(state.get("losses", []))
        self.norms.extend(state.get("grad_norms", []))
        self.spike_steps.extend(state.get("spike_steps", []))
        self.last_in_place = -math.inf  # the step of the last rollback taken in place
        self.last_skipped = int(state.get("last_skipped", -1))  # the last step not applied
        best = state.get("best_loss")  # the lowest recent median so far (None: none yet)
        self.best_loss = math.inf if best is None else float(best)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: rollback count, lr factor, the skipped steps and sample
        ranges, and the windows (so a resumed run judges its next steps as the uninterrupted
        run would)."""
        return {
            "rollbacks": self.rollbacks,
            "lr_factor": self.lr_factor,
            "events": self.events,
            "losses": list(self.losses),
            "grad_norms": list(self.norms),
            "spike_steps": list(self.spike_steps),
            "best_loss": None if math.isinf(self.best_loss) else self.best_loss,
            "last_skipped": self.last_skipped,
        }

    def restore_windows(self, state: dict[str, Any]) -> None:
        """After a rollback: the windows and the best loss as the checkpoint saved them (the
        healthy values of that time, not those of the abandoned steps)."""
        self.losses.clear()
        self.losses.extend(state.get("losses", []))
        self.norms.clear()
        self.norms.extend(state.get("grad_norms", []))
        best = state.get("best_loss")
        self.best_loss = math.inf if best is None else float(best)

    def _spike(self, value: float, window: deque[float]) -> tuple[bool, float, float]:
        if len(window) < self.cfg.guard_min_history:
            return False, math.nan, math.nan
        median, z = robust_z(value, list(window))
        return (z > self.cfg.guard_z and value > self.cfg.guard_min_ratio * median), median, z

    def _event(self, step: int, kind: str, value: float, median: float, z: float, action: str):
        return {
            "step": step,
            "split": "guard",
            "event": kind,
            "value": value,
            "median": median,
            "z": z,
            "action": action,
            "rollbacks": self.rollbacks,
        }

    def _escalate(self, step: int) -> str:
        """A rollback, or "give_up" when ``guard_max_rollbacks`` were already spent."""
        return "give_up" if self.rollbacks >= self.cfg.guard_max_rollbacks else "rollback"

    def _count_spike(self, step: int) -> bool:
        """Remember a spike; True when the window now holds ``guard_spikes`` of them."""
        self.spike_steps.append(step)
        while self.spike_steps and self.spike_steps[0] <= step - self.cfg.guard_spike_window:
            self.spike_steps.popleft()
        return len(self.spike_steps) >= self.cfg.guard_spikes

    def check_loss(self, step: int, loss: float) -> Verdict:
        """Before the optimizer step: "ok", "skip" (a loss spike), "rollback" or "give_up"; an
        "ok" with an event is a spike whose update is applied (:meth:`_judge_loss`)."""
        verdict = self._judge_loss(step, loss)
        if verdict.action != "ok":
            self.last_skipped = step  # not applied (a rollback in place is a skip too)
        return verdict

    def _judge_loss(self, step: int, loss: float) -> Verdict:
        self._pending_loss = None
        if not math.isfinite(loss):
            return self._nonfinite(step, "loss_nonfinite", loss)
        spike, median, z = self._spike(loss, self.losses)
        if not spike:
            climb = self._climb(step, loss)
            if climb is not None:
                return climb
            self._pending_loss = loss
            return Verdict("ok")
        if self._count_spike(step):
            action = self._escalate(step)
            return Verdict(action, self._event(step, "spikes_in_window", loss, median, z, action))
        if self.last_skipped == step - 1:  # the weights the skip kept: skipping changes nothing
            event = self._event(step, "loss_spike_after_skip", loss, median, z, "ok")
            event["reason"] = "the step before was skipped: its weights, not the batch, spike"
            return Verdict("ok", event)
        return Verdict("skip", self._event(step, "loss_spike", loss, median, z, "skip"))

    def _climb(self, step: int, loss: float) -> Verdict | None:
        """A rollback verdict when the recent median (this loss and the last healthy ones)
        climbed above ``guard_climb`` x the best recent median; None otherwise."""
        k = self.cfg.guard_min_history
        if self.cfg.guard_climb <= 0 or len(self.losses) < k:
            return None
        recent = statistics.median([*list(self.losses)[len(self.losses) - k + 1 :], loss])
        self.best_loss = min(self.best_loss, recent)
        if recent <= self.cfg.guard_climb * self.best_loss:
            return None
        action = self._escalate(step)
        event = self._event(step, "loss_climb", recent, self.best_loss, math.nan, action)
        return Verdict(action, event)

    def new_phase(self) -> None:
        """A phase of a --phases plan began (new data, length or mask rate): its loss level
        may differ, so the climb is judged against this phase's best only."""
        self.best_loss = math.inf

    def _stats(self) -> tuple[float, float]:
        return (statistics.median(self.losses) if self.losses else math.nan), math.nan

    def _nonfinite(self, step: int, kind: str, value: float) -> Verdict:
        """A NaN/inf loss or grad norm (``kind``): "ok" under fp16, whose loss scaler skips the
        step and lowers the scale; otherwise escalated (a rollback or giving up)."""
        if self.fp16:
            return Verdict("ok")
        action = self._escalate(step)
        return Verdict(action, self._event(step, kind, value, *self._stats(), action))

    def check_grad_norm(self, step: int, norm: float | None) -> Verdict:
        """After an optimizer step the guard let through: "ok", "rollback" or "give_up".
        A healthy step's loss and grad norm join the windows."""
        loss, self._pending_loss = self._pending_loss, None
        if loss is None:
            return Verdict("ok")
        if norm is None:  # DeepSpeed computes no norm (compute_grad_norm false): loss only
            self.losses.append(loss)
            return Verdict("ok")
        if not math.isfinite(norm):
            return self._nonfinite(step, "grad_norm_nonfinite", norm)
        spike, median, z = self._spike(norm, self.norms)
        if spike and self.clipping > 0:  # a clipped update: recorded, never escalated
            event = self._event(step, "grad_norm_spike", norm, median, z, "ok")
            event["clipped_at"] = self.clipping
            self.losses.append(loss)  # its loss was judged healthy already, and the norm
            self.norms.append(norm)  # joins too: a lasting rise of the norm becomes the median
            return Verdict("ok", event)
        if spike:
            action = self._escalate(step) if self._count_spike(step) else "ok"
            kind = "grad_norm_spike" if action == "ok" else "spikes_in_window"
            return Verdict(action, self._event(step, kind, norm, median, z, action))
        self.losses.append(loss)
        self.norms.append(norm)
        return Verdict("ok")

    def in_place(self, event: dict[str, Any], first_sample: int, end_sample: int) -> float:
        """A rollback was due but there is no checkpoint to go back to: the step's update is
        dropped already (a skip), the lr is multiplied by ``guard_lr_factor`` and it counts as a
        rollback (``guard_max_rollbacks`` still bounds a divergence). Returns the new lr factor."""
        self.rollbacks += 1
        self.lr_factor *= self.cfg.guard_lr_factor
        self.spike_steps.clear()
        self.last_in_place = event["step"]
        if event["event"] == "loss_climb":  # judge the climb afresh, at the lowered lr
            self.losses.clear()
        event.update(action="skip", rollbacks=self.rollbacks, lr_factor=self.lr_factor)
        event["reason"] = (
            f"no complete checkpoint to roll back to: skipped in place, rollback "
            f"{self.rollbacks} of {self.cfg.guard_max_rollbacks}, lr x {self.lr_factor:g}"
        )
        self.skipped(event, first_sample, end_sample)
        return self.lr_factor

    def skipped(self, event: dict[str, Any], first_sample: int, end_sample: int) -> None:
        """Note a skipped step's sample range [first_sample, end_sample) in the event and state."""
        event.update(skipped_samples=[first_sample, end_sample])
        self.events.append({k: event[k] for k in ("step", "event", "action", "skipped_samples")})

    def rolled_back(self, event: dict[str, Any], to_step: int, first: int, end: int) -> float:
        """Note a rollback to ``to_step`` that skips samples [first, end); returns the new lr
        factor (the old one times ``guard_lr_factor``)."""
        self.rollbacks += 1
        self.lr_factor *= self.cfg.guard_lr_factor
        self.spike_steps.clear()
        self.last_skipped = -1  # the checkpoint's weights now, not those a skip kept
        event.update(
            rollbacks=self.rollbacks,
            to_step=to_step,
            skipped_samples=[first, end],
            lr_factor=self.lr_factor,
        )
        keys = ("step", "event", "action", "to_step", "skipped_samples", "lr_factor")
        self.events.append({k: event[k] for k in keys})
        return self.lr_factor


def can_discard(optimizer: Any) -> bool:
    """True when :func:`discard_update` works on this DeepSpeed optimizer (ZeRO stages 1-3)."""
    return hasattr(type(optimizer), "_update_scale") and hasattr(optimizer, "overflow")


@contextmanager
def discard_update(optimizer: Any) -> Iterator[None]:
    """Make the next boundary ``engine.step()`` drop the accumulated gradients instead of
    applying them, through DeepSpeed's own overflow path (ZeRO-1/2 and ZeRO-3 alike): the
    gradient buffers are freed, the engine counts a skipped step (``global_steps`` and
    ``global_samples`` advance, ``skipped_steps`` + 1, ``was_step_applied()`` False) and neither
    the optimizer nor the LR scheduler steps. The loss scaler still sees the real overflow flag,
    so an fp16 scale evolves exactly as without the guard.

    Both ZeRO optimizers call ``self._update_scale(self.overflow)`` right before testing
    ``self.overflow`` for that path; an instance attribute overrides the method for one step.
    """
    real_update = optimizer._update_scale

    def update_then_discard(has_overflow: bool = False) -> None:
        real_update(has_overflow)
        optimizer.overflow = True

    optimizer._update_scale = update_then_discard
    try:
        yield
    finally:
        del optimizer._update_scale  # the class's method again
