"""Fine-tune and score models on labelled tasks; print one comparison table.

    python -m pretrain.evaluate --models runs/zh@all hf/bert-base-chinese --tasks tasks.json \\
        --out eval/ [--seeds 3] [--lrs 3e-5,1e-4] [--min_steps 300] [--max_train_examples 2000]

    # texts longer than --max_length: sliding windows (or key_sentences; default first)
    python -m pretrain.evaluate --models hf/model --tasks tasks.json --out eval/ \\
        --long_documents windows [--window_stride 64]

    # two folders of one name (hf_model) told apart by a label
    python -m pretrain.evaluate --models base=runs/demo/hf_model domain=runs/cont/hf_model ...

    # one task from flags instead of a tasks file
    python -m pretrain.evaluate --models hf/model --out eval/ --name sentiment \\
        --type classification --train reviews.jsonl --text_column text --label_column label

Models: an HF folder, a run folder (its newest complete checkpoint), ``RUN@STEP`` or ``RUN@all``
(every complete checkpoint: also draws OUT/score_vs_step_RUN.png), each as ``LABEL=...`` to name
its row. Every task also gets two reference rows: the majority class and a classical model
(TF-IDF + logistic regression). Writes OUT/results.json (every run's scores) and OUT/results.md
(the table, also printed). Exit status 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from bertforge.cli import ArgumentParser
from bertforge.errors import USER_ERROR_EXIT, UserError
from bertforge.logs import get_logger
from bertforge.pretrain.data.downstream_tasks import (
    TASK_TYPES,
    TaskError,
    TaskSpec,
    load_task,
    load_task_file,
)
from bertforge.pretrain.evaluate.finetune import Recipe
from bertforge.pretrain.evaluate.long_documents import STRATEGIES
from bertforge.pretrain.evaluate.report import markdown_table, plot_steps, write_results
from bertforge.pretrain.evaluate.runner import evaluate_models

log = get_logger(__name__)

_INT_RECIPE = {  # recipe fields with an integer flag each (defaults: finetune.Recipe)
    "epochs": "passes over the training split, at least",
    "min_steps": "optimizer steps, at least",
    "dev_checks": "dev scores over a run; the best one's weights are tested",
    "patience": "stop after this many dev checks without a better score; 0: never",
    "batch_size": "examples per optimizer step",
    "max_length": "tokens per example",
    "window_stride": "windows: tokens from one window's start to the next; 0: half a window",
}


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="python -m pretrain.evaluate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--models", nargs="+", required=True, help="[LABEL=]PATH | [LABEL=]RUN@STEP | RUN@all ..."
    )
    p.add_argument("--tasks", help="tasks JSON file (its format: docs/evaluation.md)")
    p.add_argument("--out", required=True, help="folder for results.json, results.md, plots")
    p.add_argument("--seeds", type=int, default=3, help="fine-tuning seeds per lr (default 3)")
    p.add_argument("--seed", type=int, default=0, help="first seed (seeds are seed..seed+K-1)")
    p.add_argument("--device", default=None, help="cuda | cpu (default: cuda when present)")
    p.add_argument("--only", nargs="+", default=None, help="evaluate only these task names")
    g = p.add_argument_group("recipe overrides (all tasks)")
    g.add_argument("--lrs", default=None, help="comma-separated learning-rate grid")
    for name, what in _INT_RECIPE.items():
        default = getattr(Recipe(), name)
        g.add_argument(f"--{name}", type=int, default=None, help=f"{what} (default {default})")
    g.add_argument("--warmup_ratio", type=float, default=None)
    g.add_argument(
        "--long_documents",
        choices=STRATEGIES,
        default=None,
        help="a classification text over --max_length: its first tokens, sliding windows "
        "(mean of their probabilities) or its TextRank key sentences "
        f"(default {Recipe().long_documents})",
    )
    g.add_argument("--max_train_examples", type=int, default=None, help="cap per task")
    g.add_argument("--max_test_examples", type=int, default=None, help="cap per task")
    t = p.add_argument_group("a single task from flags (instead of --tasks)")
    t.add_argument("--name")
    t.add_argument("--type", choices=TASK_TYPES)
    t.add_argument("--train")
    t.add_argument("--test", default=None)
    t.add_argument("--format", default=None)
    for col in ("text_column", "text_pair_column", "label_column"):
        t.add_argument(f"--{col}", default=None)
    return p


def _task_specs(args: argparse.Namespace) -> list[TaskSpec]:
    if args.tasks:
        specs = load_task_file(args.tasks)
    elif args.train and args.type:
        extra = {
            k: getattr(args, k)
            for k in ("test", "format", "text_column", "text_pair_column", "label_column")
            if getattr(args, k) is not None
        }
        specs = [
            TaskSpec(
                name=args.name or Path(args.train).stem, type=args.type, train=args.train, **extra
            )
        ]
    else:
        raise TaskError("give --tasks FILE, or --type and --train for a single task")
    if args.only:
        unknown = sorted(set(args.only) - {s.name for s in specs})
        if unknown:
            raise TaskError(f"--only {unknown}: no such task in {[s.name for s in specs]}")
        specs = [s for s in specs if s.name in args.only]
    for s in specs:
        s.max_train_examples = args.max_train_examples or s.max_train_examples
        s.max_test_examples = args.max_test_examples or s.max_test_examples
    return specs


def _overrides(args: argparse.Namespace) -> dict:
    over = {k: getattr(args, k) for k in (*_INT_RECIPE, "warmup_ratio", "long_documents")}
    if args.lrs:
        over["lrs"] = tuple(float(x) for x in args.lrs.split(","))
    return {k: v for k, v in over.items() if v is not None and k in Recipe.__dataclass_fields__}


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    args = _parser().parse_args(argv)
    out = Path(args.out)
    try:
        if args.seeds < 1:
            raise TaskError("--seeds must be at least 1")
        tasks = [load_task(s) for s in _task_specs(args)]
        device = torch.device(args.device) if args.device else None
        results = evaluate_models(
            args.models,
            tasks,
            list(range(args.seed, args.seed + args.seeds)),
            _overrides(args),
            device,
            workdir=str(out / "models"),
        )
    except UserError as e:
        log.error(str(e))
        return USER_ERROR_EXIT
    json_path, md_path = write_results(out, results)
    print(markdown_table(results))
    for path in [json_path, md_path, *plot_steps(results, out)]:
        print(path, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
