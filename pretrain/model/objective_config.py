"""What ``--objective`` and the replaced-token-detection flags set (recipe section ``objective``).

Light to import (no torch): the command line builds its flags from these fields. Which
:class:`~pretrain.model.specs.ObjectiveSpec` a run trains is resolved from them and the shards'
format by :func:`pretrain.model.specs.resolve_objective`.
"""

from __future__ import annotations

from dataclasses import dataclass

from bertforge.cli import opt

#: ``--objective`` values; "auto" lets the shards decide (nsp shards: mlm+nsp, packed: mlm).
OBJECTIVE_CHOICES = ("auto", "mlm", "mlm+nsp", "mlm+sop", "rtd")
#: How the generator's and the discriminator's token embeddings are shared (rtd).
EMBEDDING_SHARING = ("plain", "disentangled")


@dataclass(frozen=True)
class ObjectiveConfig:
    """The training objective, and the knobs of replaced-token detection (ELECTRA)."""

    objective: str = opt(
        "auto",
        "training objective: auto (the shards decide: nsp shards train mlm+nsp, packed ones "
        "mlm) | mlm | mlm+nsp | mlm+sop (ALBERT's sentence-order prediction, on nsp shards) | "
        "rtd (ELECTRA's replaced-token detection: a small generator fills "
        "the masked positions, the encoder learns which tokens were replaced; docs/model.md)",
        choices=OBJECTIVE_CHOICES,
    )
    rtd_weight: float = opt(
        50.0, "rtd: lambda, the discriminator loss's weight beside the generator's MLM loss"
    )
    generator_width: float = opt(
        0.25,
        "rtd: the generator's hidden and feed-forward width as a fraction of the encoder's "
        "(rounded to whole attention heads of the encoder's head size; ELECTRA: 1/4 to 1/3)",
    )
    generator_depth: float = opt(
        1.0, "rtd: the generator's layers as a fraction of the encoder's (at least 1)"
    )
    embedding_sharing: str = opt(
        "plain",
        "rtd: plain (ELECTRA: one set of embeddings, both losses train it) | disentangled "
        "(DeBERTa-v3: the encoder's token embeddings are the generator's, gradient stopped, "
        "plus a zero-initialised difference of its own)",
        choices=EMBEDDING_SHARING,
    )

    generator_from: str = opt(
        "",
        "rtd with --init_from: the generator's folder (ElectraForMaskedLM as transformers writes "
        "it); default: INIT_FROM/generator when there (what our export writes), else a new one",
    )

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVE_CHOICES:
            raise ValueError(
                f"--objective {self.objective!r}: choose one of {', '.join(OBJECTIVE_CHOICES)}"
            )
        if self.embedding_sharing not in EMBEDDING_SHARING:
            raise ValueError(
                f"--embedding_sharing {self.embedding_sharing!r}: choose one of "
                f"{', '.join(EMBEDDING_SHARING)}"
            )
        if not 0.0 < self.generator_width <= 1.0:
            raise ValueError(f"--generator_width {self.generator_width}: give a value in (0, 1]")
        if not 0.0 < self.generator_depth <= 1.0:
            raise ValueError(f"--generator_depth {self.generator_depth}: give a value in (0, 1]")
        if not self.rtd_weight > 0.0:
            raise ValueError(f"--rtd_weight {self.rtd_weight}: give a positive weight")
