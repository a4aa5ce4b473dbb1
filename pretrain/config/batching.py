"""One place that decides the batch sizes and writes them into the DeepSpeed config.

DeepSpeed requires ``train_batch_size == micro_batch * grad_accum * world_size``. Users give any two
(each in the recipe or in the DeepSpeed JSON, not both: :mod:`.one_home`); the third is derived
here and every value is checked against the world size before any model, data or process-group
work starts. Given none, a rank takes :data:`DEFAULT_MICRO_BATCH` sequences per step.

The global batch is what a run keeps; the accumulation only splits it for one world size. So an
accumulation that came from a recipe file (a run's own ``RUN/recipe.yaml`` pins the one its world
size needed) yields to this world size: it is derived again from the global and micro batch, and
the plan's ``note`` says so (the trainer logs it). An accumulation given as a flag, or in the
DeepSpeed JSON, is kept and checked. A micro batch is never changed (it is the memory a rank
needs): one that cannot share the global batch is refused, naming its flag and a value that fits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bertforge.errors import UserError
from bertforge.pretrain.config.train_config import DEFAULT_MICRO_BATCH

BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
FIELDS = ("global_batch_size", "micro_batch_size", "grad_accum")  # the recipe's, as BATCH_KEYS
_FLAGS = {"global_batch_size": "--global_batch_size", "micro_batch_size": "--micro_batch_size"}
_FLAGS["grad_accum"] = "--grad_accum"


class BatchSizeError(UserError, ValueError):
    """Batch sizes that cannot be satisfied on this world size: ``problem`` says what is wrong,
    ``fix`` which setting to change (its flag, recipe key or JSON key) and to what."""

    def __init__(self, problem: str, fix: str = ""):
        super().__init__(f"{problem}: {fix}" if fix else problem)
        self.problem, self.fix = problem, fix


@dataclass(frozen=True)
class BatchPlan:
    """Resolved batch sizes for one world size."""

    global_batch: int  # sequences per optimizer step, all ranks and micro-batches together
    micro_batch: int  # sequences per forward pass on one rank
    grad_accum: int  # micro-batches per rank per optimizer step
    world_size: int  # data-parallel ranks
    note: str = field(default="", compare=False)  # a recipe's accumulation derived again: why

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


@dataclass(frozen=True)
class _Size:
    """One of the three sizes: its value (None: not given) and where it is set."""

    value: int | None
    home: str  # what to change: "--grad_accum", "--grad_accum (recipe R: batch.grad_accum)" ...
    origin: str = ""  # "recipe FILE" when the value came from a recipe file

    @property
    def recipe(self) -> bool:
        """The value came from a recipe file, not a flag or the DeepSpeed JSON."""
        return self.origin.startswith("recipe ")


def _size(
    ds_config: dict[str, Any], i: int, override: int | None, origin: str, source: str
) -> _Size:
    """The recipe's (or flag's) value, else the config's; ``"auto"`` means "derive it"."""
    name, key = FIELDS[i], BATCH_KEYS[i]
    flag = _FLAGS[name]
    if override is not None:
        value: Any = override
        origin = origin if origin.startswith("recipe ") else ""
        home = f"{flag} ({origin}: batch.{name})" if origin else flag
    else:
        value, origin = ds_config.get(key), ""
        home = f"{key} in {source}" if value not in (None, "auto") else f"{flag} (batch.{name})"
    if value is None or value == "auto":
        return _Size(None, home)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise BatchSizeError(f"{home} must be a positive integer, got {value!r}")
    return _Size(value, home, origin)


def _divisor_at_most(n: int, limit: int) -> int:
    """The largest divisor of ``n`` that is at most ``limit``."""
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)


def resolve_batch(
    ds_config: dict[str, Any],
    world_size: int,
    *,
    global_batch: int | None = None,
    micro_batch: int | None = None,
    grad_accum: int | None = None,
    source: str = "DeepSpeed config",
    origins: Mapping[str, str] | None = None,
) -> BatchPlan:
    """Derive and check (global batch, micro batch, accumulation) for ``world_size`` ranks.

    The keyword values are the recipe's (None: not given there); :func:`.one_home.check_one_home`
    has refused a value given in the config too. ``origins``: where each keyword value came from,
    by recipe field (``cfg.sources``' ``"flag --grad_accum"`` or ``"recipe FILE"``); a value
    without one counts as a flag. When all three are known they must agree, except that a
    recipe's accumulation is derived again (see the module docstring).
    """
    if world_size <= 0:
        raise BatchSizeError(f"world size must be positive, got {world_size}")
    origins = origins or {}
    given = (global_batch, micro_batch, grad_accum)
    g, m, a = (_size(ds_config, i, given[i], origins.get(FIELDS[i], ""), source) for i in range(3))
    ranks = f"world size {world_size}"
    if g.value is not None and m.value is None and a.value is None:
        # the global batch alone: the default micro batch shares it
        home = m.home.removesuffix(")") + f"; {DEFAULT_MICRO_BATCH} by default)"
        m = _Size(DEFAULT_MICRO_BATCH, home)
    if g.value is not None and g.value % world_size:
        raise BatchSizeError(
            f"global batch {g.value} cannot be shared evenly by {world_size} ranks",
            f"set {g.home} to a multiple of {world_size}, or launch a number of ranks that "
            f"divides {g.value}",
        )
    note = ""
    if g.value is not None and m.value is not None:
        per_rank = g.value // world_size
        fits = _divisor_at_most(per_rank, m.value)
        if per_rank < m.value:
            raise BatchSizeError(
                f"micro batch {m.value} x {ranks} = {m.value * world_size} is larger than the "
                f"global batch {g.value}",
                f"lower {m.home} to {fits} or less (it must divide {g.value} / {world_size} "
                f"= {per_rank})",
            )
        if per_rank % m.value:
            raise BatchSizeError(
                f"global batch {g.value} is not divisible by micro batch {m.value} x {ranks} = "
                f"{m.value * world_size}",
                f"set {m.home} to a divisor of {per_rank} (e.g. {fits}), or {g.home} to a "
                f"multiple of {m.value * world_size}",
            )
        derived = per_rank // m.value
        if a.value is not None and a.value != derived:
            if not a.recipe:
                raise BatchSizeError(
                    f"global batch {g.value} != micro batch {m.value} x accumulation {a.value} x "
                    f"{ranks} = {m.value * a.value * world_size}",
                    f"drop {a.home} (the other two derive it: {derived}), or change "
                    f"{m.home} or {g.home}",
                )
            note = (
                f"batch: global batch {g.value} kept on {world_size} rank(s) as micro batch "
                f"{m.value} x accumulation {derived} (the {a.origin}'s batch.grad_accum "
                f"{a.value} fits another world size; a {_FLAGS['grad_accum']} flag would be kept)"
            )
        return BatchPlan(g.value, m.value, derived, world_size, note)
    if g.value is not None and a.value is not None:
        per_rank = g.value // world_size
        if per_rank % a.value:
            raise BatchSizeError(
                f"global batch {g.value} is not divisible by accumulation {a.value} x {ranks} = "
                f"{a.value * world_size}",
                f"set {a.home} to a divisor of {per_rank}, or give the micro batch "
                f"({m.home}) instead",
            )
        return BatchPlan(g.value, per_rank // a.value, a.value, world_size)
    micro = m.value or DEFAULT_MICRO_BATCH
    accum = a.value or 1
    return BatchPlan(micro * accum * world_size, micro, accum, world_size)


def apply_batch(ds_config: dict[str, Any], plan: BatchPlan) -> dict[str, Any]:
    """Return a copy of ``ds_config`` with all three batch keys filled from ``plan``."""
    out = dict(ds_config)
    out[BATCH_KEYS[0]] = plan.global_batch
    out[BATCH_KEYS[1]] = plan.micro_batch
    out[BATCH_KEYS[2]] = plan.grad_accum
    return out
