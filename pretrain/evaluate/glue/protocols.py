"""Fine-tuning protocols the papers used, as named presets (``--protocol``); every knob is a flag.

- ``bert`` (Devlin et al., 2019, section 4.1 and appendix A.3): batch 32, 3 epochs, the lr chosen
  among 5e-5, 4e-5, 3e-5, 2e-5 on dev, 128 tokens, Adam (eps 1e-6 as BERT's optimizer) with
  weight decay 0.01 and 10% linear warmup.
- ``mosaicbert`` (MosaicML's examples, ``benchmarks/bert/src/glue/finetuning_jobs.py`` and
  ``yamls/finetuning/glue/mosaic-bert-base-uncased.yaml``): a learning rate, batch, epochs and
  seed list per task, 256 tokens, AdamW betas (0.9, 0.98), eps 1e-6, 6% warmup then linear decay
  to 0; RTE, MRPC and STS-B start from the MNLI fine-tuned model. Composer's decoupled weight
  decay ``wd`` is torch AdamW's ``wd / lr`` (both decay each step by the same share). WNLI is not
  in MosaicBERT's list: it gets RTE's settings without the MNLI start.
- ``run_glue`` (transformers' ``examples/pytorch/text-classification/run_glue.py`` README): one
  setting (lr 2e-5, batch 32, 3 epochs, 128 tokens, no warmup, no weight decay, seed 42), trained on
  the whole train split, dev reported: the number transformers' Trainer gives.

What is reported is the same rule for all: per task, the learning rate with the best median dev
score over the seeds, and that rate's median [min, max] over the seeds. With one rate this is the
median over seeds; with several (``bert``) the rate is chosen on the dev split that is reported,
as BERT's paper did for its dev numbers (an optimistic choice: the tables say so).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from bertforge.errors import UserError


@dataclass(frozen=True)
class Settings:
    """The hyper-parameters of one task's fine-tuning runs."""

    lrs: tuple[float, ...] = (2e-5,)  # one run per rate and seed; the best median dev score wins
    epochs: float = 3.0  # passes over the whole train split
    batch_size: int = 32
    warmup_ratio: float = 0.0  # share of the steps with a linear warmup; then linear decay to 0
    weight_decay: float = 0.0  # torch AdamW's (multiplied by the lr); none on biases, LayerNorms
    max_length: int = 128  # tokens per example (a pair: both texts together)
    seeds: tuple[int, ...] = (42,)
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    grad_clip: float = 1.0
    from_mnli: bool = False  # start from the MNLI fine-tuned model's encoder (MosaicBERT, RoBERTa)


@dataclass(frozen=True)
class Protocol:
    """A named preset: defaults for every task, and per-task changes."""

    name: str
    source: str  # where it comes from, for tables and model cards
    default: Settings
    per_task: dict[str, dict[str, Any]] = field(default_factory=dict)

    def settings(self, task: str) -> Settings:
        """The settings of one task (by its GLUE name)."""
        return replace(self.default, **self.per_task.get(task, {}))


def _mosaic(lr: float, decoupled_wd: float, batch: int, epochs: int, seeds, **kw) -> dict:
    return {
        "lrs": (lr,),
        "weight_decay": decoupled_wd / lr,
        "batch_size": batch,
        "epochs": float(epochs),
        "seeds": tuple(seeds),
        **kw,
    }


_SEEDS5 = (19, 8364, 717, 10536, 90166)

PROTOCOLS: dict[str, Protocol] = {
    p.name: p
    for p in (
        Protocol(
            "bert",
            "Devlin et al. 2019: batch 32, 3 epochs, best lr of 5e-5/4e-5/3e-5/2e-5 on dev",
            Settings(
                lrs=(5e-5, 4e-5, 3e-5, 2e-5),
                warmup_ratio=0.1,
                weight_decay=0.01,
                adam_eps=1e-6,
                seeds=(0,),
            ),
        ),
        Protocol(
            "mosaicbert",
            "MosaicBERT's glue.py: lr, batch, epochs, seeds per task; RTE, MRPC, STS-B from MNLI",
            Settings(
                max_length=256,
                warmup_ratio=0.06,
                adam_betas=(0.9, 0.98),
                adam_eps=1e-6,
                seeds=(19,),
            ),
            {
                "MNLI": _mosaic(5e-5, 5e-6, 48, 3, (19,)),
                "RTE": _mosaic(1e-5, 1e-5, 16, 3, _SEEDS5, from_mnli=True),
                "QQP": _mosaic(3e-5, 3e-6, 16, 5, (19,)),
                "CoLA": _mosaic(5e-5, 5e-6, 32, 10, _SEEDS5[:4]),
                "MRPC": _mosaic(8e-5, 8e-6, 32, 10, _SEEDS5, from_mnli=True),
                "QNLI": _mosaic(1e-5, 1e-6, 16, 10, (19,)),
                "SST-2": _mosaic(3e-5, 3e-6, 16, 3, _SEEDS5[:3]),
                "STS-B": _mosaic(3e-5, 3e-6, 32, 10, _SEEDS5, from_mnli=True),
                "WNLI": _mosaic(1e-5, 1e-5, 16, 3, _SEEDS5),
            },
        ),
        Protocol(
            "run_glue",
            "transformers' run_glue.py: lr 2e-5, batch 32, 3 epochs, train on train, report dev",
            Settings(),
        ),
    )
}

# flag -> Settings field, for the overrides every protocol takes
OVERRIDABLE = ("lrs", "epochs", "batch_size", "warmup_ratio", "weight_decay", "max_length", "seeds")


def task_settings(protocol: str, task: str, overrides: dict[str, Any]) -> Settings:
    """A task's settings: the protocol's, then the flags given (``overrides``: field -> value)."""
    if protocol not in PROTOCOLS:
        raise UserError(f"--protocol {protocol}: not one of {sorted(PROTOCOLS)}")
    known = {f.name for f in fields(Settings)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise UserError(f"unknown setting(s) {unknown}; known: {sorted(known)}")
    return replace(PROTOCOLS[protocol].settings(task), **overrides)
