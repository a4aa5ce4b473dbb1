"""What a training objective answers its consumers, and the answers of masked-LM (the default).

The model side of an objective (its heads, loss terms, metrics, shard format, the networks
beside the encoder) is its :class:`~pretrain.model.specs.ObjectiveSpec`, which the archs build
from. An :class:`Objective` holds that spec and answers what the parts above the model ask:
the trainer (the step's loss beyond the masked-LM loss and the sums it all-reduces), the step and
validation records and the console (:mod:`pretrain.components.step_records`,
:mod:`pretrain.components.console`), the plots (its panels), the export (its writers and check),
the doctor's memory estimate (the networks it trains beside the encoder) and the dry run (its
rows). Each objective's file overrides what it does differently; the one list is
:mod:`.registry`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bertforge.pretrain.model.specs import ObjectiveSpec

if TYPE_CHECKING:
    from pathlib import Path

    import torch

    from bertforge.pretrain.model.model_config import ModelConfig
    from bertforge.pretrain.model.objective_config import ObjectiveConfig

#: the masked-LM loss's axis label
MLM_LOSS = "loss (nats per masked token)"


@dataclass(frozen=True)
class Panel:
    """One panel: its PNG's stem, title, y-axis label (with the unit) and its curves, each
    ``(split, key, legend label)``."""

    stem: str
    title: str
    ylabel: str
    curves: tuple[tuple[str, str, str], ...]
    log: bool = False


class Objective:
    """One training objective as its consumers see it (see the module doc); what is defined here
    is masked-LM's: the step records ``loss``, ``mlm_loss`` and ``mlm_accuracy`` and nothing
    else."""

    #: per-rank sums a training step adds to the masked-LM loss and correct count (all-reduced
    #: with them, once a step)
    step_sums: tuple[str, ...] = ()
    #: the model's outputs a validation pass sums beyond the masked-LM loss, correct and masked
    #: counts
    validation_sums: tuple[str, ...] = ()
    #: a key only this objective's training records hold (None: masked-LM's, the default)
    record_key: str | None = None
    #: the training record's loss a plot draws against the validation loss
    train_loss_key: str = "loss"
    #: curves drawn dashed: the references a curve is read against
    references: tuple[str, ...] = ()
    #: panels in a PNG of their own (``apart_stem``.png) and in the overview
    panels_apart: tuple[Panel, ...] = ()
    apart_stem: str | None = None
    #: whether the export of a masked-LM BERT's weights may get the untrained pooler
    export_pooler: bool = True
    #: the task that trains BERT's pooler, as the model card names it (the export keeps it
    #: trained; None: the pooler is not trained)
    pooler_task: str | None = None
    #: the transformers auto class the export is reloaded with and checked by fill-mask
    export_auto_class: str = "AutoModelForMaskedLM"
    #: whether the export is checked as a discriminator (replaced-token detection), not by
    #: fill-mask
    export_detects: bool = False

    def __init__(self, spec: ObjectiveSpec) -> None:
        self.spec = spec
        self.name = spec.name

    # -- the training step -----------------------------------------------------------------
    def loss_weights(self, settings: ObjectiveConfig | None) -> dict[str, float]:
        """The weights of its loss terms beside the masked-LM loss, by name (none)."""
        return {}

    def normalizers(self, tokens: float) -> dict[str, float]:
        """The model's normalizers beyond ``mlm_normalizer`` given the global batch's real
        ``tokens`` (1.0 in validation: sums)."""
        return {}

    def step_loss(
        self, out: dict[str, Any], sums: dict[str, Any], scale: float, accum: int, weights: dict
    ) -> torch.Tensor | None:
        """What a micro-batch's ``out`` adds to its backward loss beyond the masked-LM loss
        (``scale``: DeepSpeed's averaging over ``accum`` micro-batches and the ranks undone),
        accumulating its :attr:`step_sums` into ``sums`` (None: nothing)."""
        return None

    # -- records and console ---------------------------------------------------------------
    def owns(self, sums: dict[str, float]) -> bool:
        """Whether a step's all-reduced sums hold this objective's terms."""
        return False

    def step_terms(
        self, sums: dict[str, float], world: int, weights: dict[str, float]
    ) -> tuple[dict[str, float], float]:
        """(its metrics of a step record, what it adds to the step's ``loss``)."""
        return {}, 0.0

    def validation_scores(self, extra: tuple[float, ...]) -> dict[str, float]:
        """Its scores of a validation record from the summed :attr:`validation_sums`."""
        return {}

    def progress_fields(self, record: dict[str, Any]) -> dict[str, Any]:
        """The console's progress fields of a step record, before the lr and the rate."""
        return {"loss": record["loss"]}

    def validation_line(self, record: dict[str, Any], head: str, scores: str) -> str:
        """The console line of a validation record: ``head`` (step and source) and the
        masked-LM ``scores``."""
        return f"{head}: {scores}"

    # -- plots -----------------------------------------------------------------------------
    def loss_panels(self, loss_ylabel: str = MLM_LOSS) -> list[Panel]:
        """The loss and accuracy panels."""
        return [
            Panel(
                "loss",
                "loss",
                loss_ylabel,
                (("train", "loss", "train"), ("validation", "val_loss", "validation (MLM)")),
            ),
            accuracy_panel("MLM accuracy"),
        ]

    def complete_records(self, data: dict[str, list[dict]]) -> None:
        """Fill in the keys its panels read that older runs did not record (none)."""

    # -- export, memory estimate, dry run --------------------------------------------------
    def generator_export(self, model: Any) -> tuple[Any, dict] | None:
        """(config, state dict) of a network exported beside the encoder (none)."""
        return None

    def write_generator(self, out: Path, conf: Any, sd: dict[str, Any], tokenizer: Any) -> None:
        """Write :meth:`generator_export`'s network as its transformers class (none)."""

    def generator_config(
        self, cfg: ModelConfig, settings: ObjectiveConfig | None
    ) -> ModelConfig | None:
        """The architecture of a network trained beside the encoder (none), for the memory
        estimate."""
        return None

    def dry_run_terms(self, model: Any) -> dict[str, int]:
        """Its entries of the dry run's model report (none)."""
        return {}

    def dry_run_rows(self, model_report: dict[str, Any]) -> list[str]:
        """Its lines under the dry run's model line (none)."""
        return []


def accuracy_panel(title: str) -> Panel:
    """The masked-LM accuracy panel under ``title``."""
    return Panel(
        "accuracy",
        title,
        "fraction of masked tokens",
        (("train", "mlm_accuracy", "train"), ("validation", "val_accuracy", "validation")),
    )
