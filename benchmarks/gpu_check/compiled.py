"""The gpu-check part ``compile``: ``--compile`` beside eager on the same launch lines.

Each configuration of ``plan.compiled`` is trained again with ``--compile true`` (the BERT ones
as the ``train`` part trains them, the ModernBERT ones as the ``modernbert`` part does: a
``modernbert-*`` preset selects the arch). Its row adds the first step's seconds, which hold the
compilation; the report sets each compiled row beside the eager row of the same name
(:func:`benchmarks.gpu_check.report.compile_targets`).
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.gpu_check.common import PartResult, Plan
from benchmarks.gpu_check.train import run_matrix


def first_step(run_dir: Path) -> dict:
    """The first optimizer step's seconds (with --compile: the compilation is in it)."""
    from bertforge.pretrain.components.metrics import read_metrics

    return {"first step s": round(read_metrics(run_dir / "metrics.jsonl")[0]["step_time_s"], 1)}


def part_compile(plan: Plan, out: Path, res: PartResult, deadline: float) -> None:
    """Each configuration of ``plan.compiled`` with --compile, a throughput row each."""
    if not plan.compiled:
        res.rows.append({"run": "-", "status": "not run: the dry run compiles nothing"})
        res.status = "ok"  # nothing was due
        return
    run_matrix(plan, out, res, deadline, "compile", plan.compiled, first_step, compile=True)
    res.details["eager rows"] = "the train and modernbert parts' rows of the same names"
