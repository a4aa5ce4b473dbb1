"""One place that decides the batch sizes and writes them into the DeepSpeed config.

DeepSpeed requires ``train_batch_size == micro_batch * grad_accum * world_size``. Users give any two
(each in the recipe or in the DeepSpeed JSON, not both: :mod:`.one_home`); the third is derived
here and every value is checked against the world size before any model, data or process-group
work starts. Given none, a rank takes :data:`DEFAULT_MICRO_BATCH` sequences per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bertforge.errors import UserError
from bertforge.pretrain.config.train_config import DEFAULT_MICRO_BATCH

BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


class BatchSizeError(UserError, ValueError):
    """Batch sizes that cannot be satisfied on this world size."""


@dataclass(frozen=True)
class BatchPlan:
    """Resolved batch sizes for one world size."""

    global_batch: int  # sequences per optimizer step, all ranks and micro-batches together
    micro_batch: int  # sequences per forward pass on one rank
    grad_accum: int  # micro-batches per rank per optimizer step
    world_size: int  # data-parallel ranks

    def with_global(self, global_batch: int) -> BatchPlan:
        """This plan at another global batch: the micro-batch and world size stay, the
        accumulation follows (a phase plan's batch of a step)."""
        accum = global_batch // (self.micro_batch * self.world_size)
        return BatchPlan(global_batch, self.micro_batch, accum, self.world_size)

    def as_dict(self) -> dict[str, int]:
        return {
            "global_batch": self.global_batch,
            "micro_batch": self.micro_batch,
            "grad_accum": self.grad_accum,
            "world_size": self.world_size,
        }


def _value(ds_config: dict[str, Any], key: str, override: int | None, source: str) -> int | None:
    """The recipe's value, else the config's; ``"auto"`` means "derive it" (DeepSpeed cannot)."""
    if override is not None:
        value: Any = override
        where = f"the recipe's value for {key}"
    else:
        value = ds_config.get(key)
        where = f"{source}: {key}"
    if value is None or value == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise BatchSizeError(f"{where} must be a positive integer, got {value!r}")
    return value


def resolve_batch(
    ds_config: dict[str, Any],
    world_size: int,
    *,
    global_batch: int | None = None,
    micro_batch: int | None = None,
    grad_accum: int | None = None,
    source: str = "DeepSpeed config",
) -> BatchPlan:
    """Derive and check (global batch, micro batch, accumulation) for ``world_size`` ranks.

    The keyword values are the recipe's (None: not given there); :func:`.one_home.check_one_home`
    has refused a value given in the config too. When all three are known they must agree.
    """
    if world_size <= 0:
        raise BatchSizeError(f"world size must be positive, got {world_size}")
    g = _value(ds_config, BATCH_KEYS[0], global_batch, source)
    m = _value(ds_config, BATCH_KEYS[1], micro_batch, source)
    a = _value(ds_config, BATCH_KEYS[2], grad_accum, source)
    hint = (
        f"(world size {world_size}; train_batch_size must equal "
        f"train_micro_batch_size_per_gpu x gradient_accumulation_steps x world size). "
        f"Fix {source} or the recipe's batch section (--global_batch_size / --micro_batch_size / "
        "--grad_accum)"
    )
    if g is not None and m is None and a is None:
        m = DEFAULT_MICRO_BATCH  # the global batch alone: the default micro batch shares it
    if g is not None and m is not None:
        if g % (m * world_size):
            raise BatchSizeError(
                f"global batch {g} is not divisible by micro batch {m} x world size "
                f"{world_size} = {m * world_size} {hint}"
            )
        derived = g // (m * world_size)
        if a is not None and a != derived:
            raise BatchSizeError(
                f"global batch {g} != micro batch {m} x accumulation {a} x world "
                f"size {world_size} = {m * a * world_size} {hint}"
            )
        a = derived
    elif g is not None and a is not None:
        if g % (a * world_size):
            raise BatchSizeError(
                f"global batch {g} is not divisible by accumulation {a} x world "
                f"size {world_size} {hint}"
            )
        m = g // (a * world_size)
    elif m is not None:
        a = a or 1
        g = m * a * world_size
    else:
        m, a = DEFAULT_MICRO_BATCH, a or 1
        g = m * a * world_size
    assert g is not None and m is not None and a is not None
    return BatchPlan(global_batch=g, micro_batch=m, grad_accum=a, world_size=world_size)


def apply_batch(ds_config: dict[str, Any], plan: BatchPlan) -> dict[str, Any]:
    """Return a copy of ``ds_config`` with all three batch keys filled from ``plan``."""
    out = dict(ds_config)
    out[BATCH_KEYS[0]] = plan.global_batch
    out[BATCH_KEYS[1]] = plan.micro_batch
    out[BATCH_KEYS[2]] = plan.grad_accum
    return out
