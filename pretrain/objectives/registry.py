"""The one list of objectives as their consumers ask them (``OBJECTIVES``, by ``--objective``
name, in the order of :data:`pretrain.model.specs.OBJECTIVES`), and the questions asked of the
list: the objective of a run's spec (:func:`objective_for`), of a record
(:func:`objective_of_record`), and the union of their step sums (:func:`step_sums`). Adding an
objective is a file here plus its line below (docs/design.md, "How to add an objective")."""

from __future__ import annotations

from typing import Any

from bertforge.pretrain.model.specs import ObjectiveSpec
from bertforge.pretrain.objectives import mlm, nsp, rtd, sop
from bertforge.pretrain.objectives.base import Objective

OBJECTIVES: dict[str, Objective] = {
    o.name: o for o in (mlm.OBJECTIVE, nsp.OBJECTIVE, sop.OBJECTIVE, rtd.OBJECTIVE)
}
#: the default: what a record of no other objective is
DEFAULT = mlm.OBJECTIVE


def objective_for(spec: ObjectiveSpec) -> Objective:
    """The objective a run trains, from its resolved spec (``resolve_objective``)."""
    return OBJECTIVES[spec.name]


def objective_of_record(record: dict[str, Any] | None, prefix: str = "") -> Objective:
    """The objective whose record this is (a training record's keys, or with ``prefix``
    "val_" a validation record's); masked-LM when no objective claims it."""
    for objective in OBJECTIVES.values():
        key = objective.record_key
        if record and key is not None and prefix + key in record:
            return objective
    return DEFAULT


def step_sums() -> tuple[str, ...]:
    """Every objective's per-rank step sums after the masked-LM loss and correct count, each
    once, in the registry's order."""
    names = ["mlm_loss", "mlm_correct"]
    for objective in OBJECTIVES.values():
        names += [k for k in objective.step_sums if k not in names]
    return tuple(names)


def validation_objective(extra: tuple[float, ...]) -> Objective:
    """The objective whose validation sums ``extra`` are (those after the masked-LM loss,
    correct and masked counts; none: masked-LM)."""
    for objective in OBJECTIVES.values():
        if extra and len(objective.validation_sums) == len(extra):
            return objective
    return DEFAULT
