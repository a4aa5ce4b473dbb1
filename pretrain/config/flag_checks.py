"""The checks of ``--anneal_from`` / ``--anneal_tokens`` and ``--ema`` that the command line makes
before anything is loaded, and their error classes (:mod:`pretrain.schedule.anneal` and
:mod:`pretrain.components.ema` raise them too, later: config may not import components).
"""

from __future__ import annotations

from bertforge.errors import UserError


class AnnealError(UserError, ValueError):
    """--anneal_from / --anneal_tokens that cannot be honoured (the message names the fix)."""


class EMAError(UserError, ValueError):
    """An --ema value out of range, or an export --ema of a checkpoint without an EMA."""


def check_ema_decay(decay: float) -> None:
    """0 (off) or 0 < decay < 1."""
    if decay != 0.0 and not 0.0 < decay < 1.0:
        raise EMAError(f"--ema must be between 0 and 1 (exclusive), e.g. 0.999; got {decay}")


def check_anneal_flags(run_cfg, explicit_max_steps: bool) -> None:
    """The flag combinations --anneal_from refuses (called by the command line's checks)."""
    if not run_cfg.anneal_from:
        if run_cfg.anneal_tokens:
            raise AnnealError("--anneal_tokens goes with --anneal_from RUN@STEP; add it or drop")
        return
    if run_cfg.init_from:
        raise AnnealError(
            "--anneal_from loads weights and optimizer state from its checkpoint; drop "
            "--init_from (weights only, fresh optimizer)"
        )
    if getattr(run_cfg, "phases", ""):
        raise AnnealError(
            "--anneal_from decays the lr over --anneal_tokens in one phase; drop --phases, or "
            "write the decay as the last phase of a --phases plan"
        )
    if explicit_max_steps:
        raise AnnealError(
            "--anneal_from: the run's length is --anneal_tokens (steps = ceil(tokens / (global "
            "batch x seq len))); drop --max_steps"
        )
    if run_cfg.anneal_tokens <= 0:
        raise AnnealError("--anneal_from needs --anneal_tokens N (N > 0 tokens to anneal over)")
