"""Each setting has one home per run: the recipe (or its flag) or the DeepSpeed JSON, never both.

The DeepSpeed JSON is the engine (ZeRO, precision blocks, the optimizer's betas and eps); the
recipe is the learning (schedule, optimizer, batch sizes, clipping). A few settings can be written
in either, because DeepSpeed's own JSON has keys for them and users arrive with such files: the lr,
the weight decay, the optimizer's type, clipping, the three batch sizes, the precision and
activation checkpointing. :func:`check_one_home` refuses a run that gives one of them in both,
naming both places, so no value silently wins over another. A JSON value of ``"auto"`` (the HF
Trainer's convention) counts as not given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bertforge.errors import UserError
from bertforge.pretrain.config.precision import enabled_precision_block

if TYPE_CHECKING:
    from bertforge.pretrain.config.train_config import TrainConfig


class TwoHomesError(UserError, ValueError):
    """A setting given both in the recipe (or a flag) and in the DeepSpeed JSON."""


@dataclass(frozen=True)
class SharedKnob:
    """A setting both files can hold: its recipe field, its DeepSpeed JSON key, and which of
    the two the shipped files use (where a clash is resolved)."""

    field: str  # "section.field" in the recipe, e.g. "optim.lr"
    ds_key: str  # the JSON path, e.g. "optimizer.params.lr"
    home: str  # "recipe" or "json"

    def in_json(self, ds: dict[str, Any]) -> tuple[str, Any] | None:
        """(the JSON key, its value) where the JSON gives this setting, else None."""
        if self.field == "precision.precision":
            block = enabled_precision_block(ds)
            return (f"{block}.enabled", True) if block else None
        value: Any = ds
        for part in self.ds_key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is None or value == "auto" or value is False:
            return None  # "enabled": false (activation checkpointing) gives nothing either
        return self.ds_key, value

    def fix(self, where: str, key: str, src: str) -> str:
        """What to change, keeping the setting where the shipped files keep it."""
        if self.home == "recipe":
            return f"remove {key} from {src}"
        return f"drop {where}, or set {key} false in {src}"  # its JSON keys are "enabled"


SHARED_KNOBS = (
    SharedKnob("optim.lr", "optimizer.params.lr", "recipe"),
    SharedKnob("optim.weight_decay", "optimizer.params.weight_decay", "recipe"),
    SharedKnob("optim.optimizer", "optimizer.type", "recipe"),
    SharedKnob("optim.gradient_clipping", "gradient_clipping", "recipe"),
    SharedKnob("batch.global_batch_size", "train_batch_size", "recipe"),
    SharedKnob("batch.micro_batch_size", "train_micro_batch_size_per_gpu", "recipe"),
    SharedKnob("batch.grad_accum", "gradient_accumulation_steps", "recipe"),
    SharedKnob("precision.precision", "fp16.enabled or bf16.enabled", "json"),
    SharedKnob("memory.activation_checkpointing", "activation_checkpointing.enabled", "json"),
)


def given_by_json(ds: dict[str, Any]) -> frozenset[str]:
    """The recipe fields whose value this DeepSpeed JSON gives ({"optim.lr", ...})."""
    return frozenset(k.field for k in SHARED_KNOBS if k.in_json(ds) is not None)


def check_one_home(ds: dict[str, Any], cfg: TrainConfig, src: str) -> None:
    """Refuse a setting that the recipe or a flag gives and ``ds`` (read from ``src``) gives too.

    Only values the user gave count on the recipe's side (``cfg.sources``: a flag or the
    recipe file); a value resolution filled in (a checkpoint's peak lr) is not a second home.
    """
    clashes = []
    for knob in SHARED_KNOBS:
        where = cfg.sources.get(knob.field, "")
        in_json = knob.in_json(ds)
        if in_json is None or not where.startswith(("flag", "recipe")):
            continue
        section, name = knob.field.split(".")
        ours = getattr(getattr(cfg, section), name)  # these sections are TrainConfig's own
        key, theirs = in_json
        clashes.append(
            f"  {knob.field} = {ours!r} ({where}) and {key} = {theirs!r} ({src}): "
            + knob.fix(where, key, src)
        )
    if clashes:
        raise TwoHomesError(
            f"{src}: {len(clashes)} setting(s) given in two places; each has one home per run "
            "(docs/training.md, 'Where each setting lives'):\n" + "\n".join(clashes)
        )
