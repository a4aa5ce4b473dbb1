"""Replaced-token detection, ELECTRA (``--objective rtd``; packed shards): a small generator's
MLM fills the masked positions by sampling, the encoder (the discriminator) tells every real
token replaced or not (the model's side: :mod:`pretrain.model.rtd`, over each arch's
networks).

What it answers its consumers: the step's loss adds ``--rtd_weight`` x the discriminator's loss
(normalised by the global batch's real tokens, as the MLM loss is by its masked ones); the
records keep the two networks apart: the generator's MLM loss and accuracy, the discriminator's
loss beside its prior's (:func:`prior_loss`: the loss of a discriminator that predicts the
replaced share for every token; one at or above it has learned nothing about the tokens), its
accuracy, and its precision and recall of replaced tokens (:func:`rtd_scores`); the console
shows both; the plots draw the generator's MLM loss and the discriminator's panels (rtd.png);
the export writes the discriminator, and beside it a generator that a transformers class holds
(``generator/``: BERT's ``ElectraForMaskedLM``), checked by detection rather than fill-mask; the
memory estimate and the dry run count the generator.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bertforge.pretrain.model.model_config import ModelConfig
from bertforge.pretrain.model.objective_config import ObjectiveConfig
from bertforge.pretrain.model.rtd import RTD_COUNTS, generator_config
from bertforge.pretrain.model.specs import RTD as SPEC
from bertforge.pretrain.objectives.base import MLM_LOSS, Objective, Panel, accuracy_panel
from bertforge.pretrain.run_folder.run_checkpoints import CheckpointError

#: the discriminator's panels (rtd.png, and the overview)
DISCRIMINATOR = (
    Panel(
        "rtd_loss",
        "discriminator loss (replaced-token detection)",
        "binary cross-entropy (nats per token)",
        (
            ("train", "rtd_loss", "train"),
            ("train", "rtd_prior_loss", "prior (entropy of the replaced share)"),
            ("validation", "val_rtd_loss", "validation"),
        ),
    ),
    Panel(
        "rtd_scores",
        "discriminator: accuracy, precision and recall of replaced",
        "fraction (accuracy: of real tokens)",
        (
            ("train", "rtd_accuracy", "accuracy"),
            ("train", "rtd_prior_accuracy", "prior accuracy (1 - replaced share)"),
            ("train", "rtd_precision", "precision"),
            ("train", "rtd_recall", "recall"),
            ("validation", "val_rtd_accuracy", "validation accuracy"),
            ("validation", "val_rtd_recall", "validation recall"),
        ),
    ),
)


def prior_loss(share: float) -> float:
    """The discriminator loss (binary cross-entropy, nats per token) of the prior: the constant
    prediction ``share`` (the replaced share) for every token, H(p) = -p ln p - (1-p) ln(1-p).
    A discriminator that learned nothing about the tokens sits there, its accuracy at
    1 - share and its recall of replaced tokens at 0."""
    if share <= 0.0 or share >= 1.0:
        return 0.0
    return -(share * math.log(share) + (1.0 - share) * math.log1p(-share))


def rtd_scores(loss: float, *counts: float, prefix: str = "rtd_") -> dict[str, float]:
    """The discriminator's scores from its ``loss`` (normalised already) and its summed
    ``counts`` in :data:`RTD_COUNTS`' order (correct, real tokens, replaced, true positives,
    predicted replaced): loss, the prior's loss, accuracy, precision and recall of replaced
    tokens, and the replaced share; keys start with ``prefix``."""
    correct, tokens, replaced, true_positive, predicted = counts
    tokens = max(tokens, 1.0)
    share = replaced / tokens
    return {
        f"{prefix}loss": loss,
        f"{prefix}prior_loss": prior_loss(share),
        f"{prefix}accuracy": correct / tokens,
        f"{prefix}precision": true_positive / max(predicted, 1.0),
        f"{prefix}recall": true_positive / max(replaced, 1.0),
        f"{prefix}replaced_share": share,
    }


class ReplacedTokens(Objective):
    """Replaced-token detection (see the module doc)."""

    # the discriminator's loss (normalised by the global real-token count) and its counts
    step_sums = ("rtd_loss", *RTD_COUNTS)
    validation_sums = ("rtd_loss", *RTD_COUNTS)
    record_key = "rtd_loss"
    # the step's loss adds rtd_weight x the discriminator's; validation scores the generator
    train_loss_key = "mlm_loss"
    references = ("rtd_prior_loss", "rtd_prior_accuracy", "val_rtd_prior_loss")
    panels_apart = DISCRIMINATOR
    apart_stem = "rtd"
    export_pooler = False
    export_detects = True

    def loss_weights(self, settings: ObjectiveConfig | None) -> dict[str, float]:
        return {"rtd_weight": (settings or ObjectiveConfig()).rtd_weight}

    def normalizers(self, tokens: float) -> dict[str, float]:
        return {"token_normalizer": max(tokens, 1.0)}

    def step_loss(self, out, sums, scale, accum, weights):
        sums["rtd_loss"] += out["rtd_loss"].detach().double()
        for k in RTD_COUNTS:
            sums[k] += out[k].double()
        return weights["rtd_weight"] * out["rtd_loss"] * scale

    def owns(self, sums: dict[str, float]) -> bool:
        return sums["rtd_tokens"] > 0

    def step_terms(self, sums, world, weights):
        scores = rtd_scores(sums["rtd_loss"], *(sums[k] for k in RTD_COUNTS))
        return scores, weights.get("rtd_weight", 0.0) * scores["rtd_loss"]

    def validation_scores(self, extra: tuple[float, ...]) -> dict[str, float]:
        rtd_loss, *counts = extra
        tokens = counts[RTD_COUNTS.index("rtd_tokens")]
        return rtd_scores(rtd_loss / max(tokens, 1.0), *counts, prefix="val_rtd_")

    def progress_fields(self, record: dict[str, Any]) -> dict[str, Any]:
        # the step's loss (generator MLM + rtd_weight x discriminator, 38 where the MLM loss is
        # 7) says nothing about either network
        return {
            "gen_mlm_loss": record["mlm_loss"],
            "disc_loss": record["rtd_loss"],
            "prior_loss": record["rtd_prior_loss"],
            "disc_acc": record["rtd_accuracy"],
            "disc_prec": record["rtd_precision"],
            "disc_rec": record["rtd_recall"],
        }

    def validation_line(self, record: dict[str, Any], head: str, scores: str) -> str:
        return (
            f"{head}: generator MLM {scores}; discriminator loss "
            f"{record['val_rtd_loss']:.4f} (prior {record['val_rtd_prior_loss']:.4f}) accuracy "
            f"{record['val_rtd_accuracy']:.4f} precision {record['val_rtd_precision']:.4f} "
            f"recall {record['val_rtd_recall']:.4f}"
        )

    def loss_panels(self, loss_ylabel: str = MLM_LOSS) -> list[Panel]:
        return [
            Panel(
                "loss",
                "generator MLM loss",
                loss_ylabel,
                (("train", "mlm_loss", "train"), ("validation", "val_loss", "validation")),
            ),
            accuracy_panel("generator MLM accuracy"),
        ]

    def complete_records(self, data: dict[str, list[dict]]) -> None:
        # the prior's loss and accuracy, which runs before those were recorded lack
        for split, prefix in (("train", "rtd_"), ("validation", "val_rtd_")):
            for r in data[split]:
                share = r.get(f"{prefix}replaced_share")
                if isinstance(share, (int, float)):
                    r.setdefault(f"{prefix}prior_loss", prior_loss(share))
                    r.setdefault(f"{prefix}prior_accuracy", 1.0 - share)

    def generator_export(self, model: Any) -> tuple[Any, dict] | None:
        # a generator that a transformers class holds (BERT's: ElectraForMaskedLM), else None
        return model.generator_hf()

    def write_generator(self, out: Path, conf: Any, sd: dict[str, Any], tokenizer: Any) -> None:
        """The generator as the transformers class its config names (BERT's:
        ElectraForMaskedLM), with the run's tokenizer."""
        import transformers

        architecture = conf.architectures[0]
        model = getattr(transformers, architecture)(conf)
        missing, unexpected = model.load_state_dict(sd, strict=False)
        if missing or unexpected:
            raise CheckpointError(
                f"name mapping to {architecture} failed: missing {missing}, unexpected {unexpected}"
            )
        model.tie_weights()
        model.save_pretrained(str(out), safe_serialization=True)
        tokenizer.save_pretrained(str(out))

    def generator_config(
        self, cfg: ModelConfig, settings: ObjectiveConfig | None
    ) -> ModelConfig | None:
        return generator_config(cfg, settings or ObjectiveConfig())

    def dry_run_terms(self, model: Any) -> dict[str, int]:
        extra = getattr(model, "generator", None)  # the network beside the encoder
        return {"generator_parameters": int(extra.num_parameters())} if extra is not None else {}

    def dry_run_rows(self, model_report: dict[str, Any]) -> list[str]:
        if "generator_parameters" not in model_report:
            return []
        n = model_report["generator_parameters"]
        return [f"        of which the generator (--objective rtd): {n:,}"]


OBJECTIVE = ReplacedTokens(SPEC)
