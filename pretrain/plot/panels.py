"""The panels drawn against the optimizer step: which ones a run gets, what each draws with its
axis labels and units, and the marks every one carries (the phases, the resumes).

- The loss-scale panel only for a run whose loss scale moved off 1, that is fp16's dynamic
  loss scaling: fp32 and bf16 runs record 1 at every step, a flat line that says nothing.
- The loss and accuracy panels, and any panels apart (a replaced-token-detection run's
  discriminator's), are the run's objective's (:mod:`pretrain.objectives`), found from its step
  records.
- A resumed launch (a ``"split": "resume"`` record) is a dotted vertical line after the step it
  continued from, named at the foot of the panel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bertforge.pretrain.objectives.base import Objective, Panel
from bertforge.pretrain.objectives.registry import OBJECTIVES, objective_of_record

#: what a panel's x axis counts
STEP_LABEL = "optimizer step"
#: drawn dashed: the references a curve is read against (each objective's)
REFERENCES = tuple(k for o in OBJECTIVES.values() for k in o.references)

LR = Panel("lr", "learning rate", "learning rate", (("train", "lr", "lr"),))
LOSS_SCALE = Panel(
    "loss_scale",
    "loss scale (fp16)",
    "loss scale (log)",
    (("train", "loss_scale", "loss scale"),),
    log=True,
)
GRAD_NORM = Panel(
    "grad_norm",
    "gradient norm",
    "L2 norm of the gradients, before clipping",
    (("train", "grad_norm", "grad norm"),),
)
THROUGHPUT = Panel(
    "throughput",
    "throughput",
    "tokens per second (all ranks)",
    (("train", "tokens_per_s", "tokens/s"),),
)


def objective_of(train: list[dict]) -> Objective:
    """The objective whose step records these are."""
    return objective_of_record(train[0] if train else None)


def uses_loss_scaling(train: list[dict]) -> bool:
    """Whether the run scaled its loss (fp16): a loss scale other than 1 at some step."""
    return any(r.get("loss_scale") not in (None, 1, 1.0) for r in train)


def step_panels(train: list[dict]) -> list[Panel]:
    """The panels a run gets a PNG of (its objective's panels apart go to their own PNG)."""
    scale = [LOSS_SCALE] if uses_loss_scaling(train) else []
    return [*objective_of(train).loss_panels(), LR, *scale, GRAD_NORM, THROUGHPUT]


def series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the records with a finite number at ``key``."""
    xs, ys = [], []
    for r in records:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            xs.append(r["step"])
            ys.append(float(v))
    return xs, ys


def phase_spans(records: list[dict]) -> list[tuple[str, int, int]]:
    """(phase, first step, last step) of each run of consecutive training records with the same
    ``phase``; [] when no record names one (a run without phases)."""
    spans: list[list] = []
    for r in records:
        name = r.get("phase")
        if name is None:
            continue
        if spans and spans[-1][0] == name:
            spans[-1][2] = r["step"]
        else:
            spans.append([name, r["step"], r["step"]])
    return [tuple(span) for span in spans]


def shade_phases(ax, spans: list[tuple[str, int, int]]) -> None:
    """Alternate grey bands over the steps of each phase, the phase's name at the top."""
    for i, (name, first, last) in enumerate(spans):
        # A band covers its steps from half a step before the first to half after the last.
        ax.axvspan(first - 0.5, last + 0.5, color="0.5", alpha=0.12 if i % 2 == 0 else 0.04, lw=0)
        ax.text(
            (first + last) / 2,
            1.0,
            name,
            transform=ax.get_xaxis_transform(),
            ha="center",
            va="bottom",
            fontsize=7,
            color="0.3",
        )


def mark_resumes(ax, steps: list[int]) -> None:
    """A dotted line half a step after each step a launch resumed from, named at the foot."""
    for step in steps:
        ax.axvline(step + 0.5, color="C3", ls=":", lw=1.2, label="_resumed")
        ax.text(
            step + 0.5,
            0.02,
            f" resumed after {step}",
            transform=ax.get_xaxis_transform(),
            rotation=90,
            ha="right",
            va="bottom",
            fontsize=7,
            color="C3",
        )


@dataclass(frozen=True)
class Marks:
    """What every step panel of a run carries: its phases and the steps it resumed after."""

    spans: list[tuple[str, int, int]]
    resumes: list[int]


def draw(ax, panel: Panel, data: dict[str, list[dict]], marks: Marks) -> bool:
    """Draw ``panel`` on ``ax`` (title, axis labels, curves, marks); whether it had any data."""
    drawn = False
    for split, key, label in panel.curves:
        xs, ys = series(data[split], key)
        if xs:
            style = "--" if key in REFERENCES else ("-" if split == "train" else "o-")
            ax.plot(xs, ys, style, label=label, markersize=3)
            drawn = True
    ax.set_title(panel.title, pad=12 if marks.spans else 6)
    ax.set_xlabel(STEP_LABEL)
    ax.set_ylabel(panel.ylabel)
    ax.grid(alpha=0.3)
    if drawn:
        if panel.log:
            ax.set_yscale("log")
        shade_phases(ax, marks.spans)
        mark_resumes(ax, marks.resumes)
        ax.legend(fontsize=8)
    return drawn
