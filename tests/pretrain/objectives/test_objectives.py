"""The objectives' registry (issue 54, item 1): one Objective per ObjectiveSpec, the step sums in
the order the trainer all-reduced them before the move, and each record found its objective."""

from __future__ import annotations

import re
from pathlib import Path

from bertforge.pretrain.model.specs import OBJECTIVES as SPECS
from bertforge.pretrain.objectives.registry import (
    OBJECTIVES,
    objective_for,
    objective_of_record,
    step_sums,
    validation_objective,
)

REPO = Path(__file__).resolve().parents[3]


def test_every_spec_has_its_objective_in_the_same_order():
    assert list(OBJECTIVES) == list(SPECS)
    for name, spec in SPECS.items():
        assert objective_for(spec).spec is spec and objective_for(spec).name == name


def test_the_step_sums_keep_their_order():
    # the order STEP_SUMS had when step_records named every objective's sums itself, SOP's added
    assert step_sums() == (
        "mlm_loss",
        "mlm_correct",
        "nsp_loss",
        "nsp_correct",
        "nsp_count",
        "sop_loss",
        "sop_correct",
        "sop_count",
        "rtd_loss",
        "rtd_correct",
        "rtd_tokens",
        "rtd_replaced",
        "rtd_true_positive",
        "rtd_predicted",
    )


def test_a_record_finds_its_objective():
    assert objective_of_record({"loss": 1.0, "mlm_loss": 1.0}).name == "mlm"
    assert objective_of_record({"loss": 1.0, "nsp_loss": 0.6}).name == "mlm+nsp"
    assert objective_of_record({"loss": 1.0, "sop_loss": 0.6}).name == "mlm+sop"
    assert objective_of_record({"loss": 1.0, "rtd_loss": 0.4}).name == "rtd"
    assert objective_of_record({"val_rtd_loss": 0.4}, prefix="val_").name == "rtd"
    assert objective_of_record(None).name == "mlm"
    assert validation_objective(()).name == "mlm"
    assert validation_objective((1.0,) * 6).name == "rtd"


def test_the_consumers_ask_the_objectives():
    """No objective's keys are tested in the files that now ask the objective."""
    keys = re.compile(r"rtd|nsp_|sop_|\"mlm\"")
    consumers = (
        "pretrain/components/step_records.py",
        "pretrain/components/console.py",
        "pretrain/plot/__init__.py",
        "pretrain/plot/panels.py",
        "pretrain/trainer.py",
    )
    found = {f: keys.findall((REPO / f).read_text(encoding="utf-8")) for f in consumers}
    assert not {f: k for f, k in found.items() if k}, found
