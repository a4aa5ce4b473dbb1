"""Fine-tune and score models on labelled tasks; print one comparison table.

    bertforge evaluate --models runs/zh@all hf/bert-base-chinese --tasks tasks.json \\
        --out eval/ [--seeds 3] [--lrs 3e-5,1e-4] [--min_steps 300] [--max_train_examples 2000]

    # texts longer than --max_length: sliding windows (or key_sentences; default first)
    bertforge evaluate --models hf/model --tasks tasks.json --out eval/ \\
        --long_documents windows [--window_stride 64]

    # two folders of one name (hf_model) told apart by a label
    bertforge evaluate --models base=runs/demo/hf_model domain=runs/cont/hf_model ...

    # GLUE (or CLUE) as download_glue_data.py or Hugging Face's datasets wrote it; a protocol
    bertforge evaluate --models runs/demo@all bert=hf/bert-base-uncased --glue glue_data \\
        --out eval_glue/ --protocol bert [--only RTE STS-B] [--seeds 3] [--lrs 2e-5,3e-5]
    bertforge evaluate --models hf/bert-base-chinese --clue clue_data --out eval_clue/

    # one task from flags instead of a tasks file
    bertforge evaluate --models hf/model --out eval/ --name sentiment \\
        --type classification --train reviews.jsonl --text_column text --label_column label

Models: an HF folder, a run folder (its newest complete checkpoint), ``RUN@STEP`` or ``RUN@all``
(every complete checkpoint: also draws OUT/score_vs_step_RUN.png), each as ``LABEL=...`` to name
its row. Every task also gets two reference rows: the majority class and a classical model
(TF-IDF + logistic regression). Writes OUT/results.json (every run's scores) and OUT/results.md
(the table, also printed); with --glue/--clue: OUT/glue.json and OUT/glue.md (docs/evaluation.md,
"GLUE"). Exit status 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from bertforge.cli import command_parser
from bertforge.errors import USER_ERROR_EXIT, UserError
from bertforge.logs import get_logger, quiet_libraries, quiet_transformers
from bertforge.pretrain.data.downstream_tasks import (
    TASK_TYPES,
    TaskError,
    TaskSpec,
    load_task,
    load_task_file,
)
from bertforge.pretrain.data.glue.readers import load_benchmark
from bertforge.pretrain.evaluate.finetune import Recipe
from bertforge.pretrain.evaluate.glue.protocols import OVERRIDABLE, PROTOCOLS
from bertforge.pretrain.evaluate.glue.report import markdown_table as benchmark_table
from bertforge.pretrain.evaluate.glue.report import plot_steps as plot_benchmark_steps
from bertforge.pretrain.evaluate.glue.report import write_results as write_benchmark
from bertforge.pretrain.evaluate.glue.suite import evaluate_benchmark
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
    p = command_parser("bertforge evaluate", __doc__)
    p.add_argument(
        "--models", nargs="+", required=True, help="[LABEL=]PATH | [LABEL=]RUN@STEP | RUN@all ..."
    )
    p.add_argument("--tasks", help="tasks JSON file (its format: docs/evaluation.md)")
    b = p.add_argument_group("GLUE and CLUE (instead of --tasks)")
    b.add_argument(
        "--glue",
        metavar="DIR",
        help="GLUE folder: download_glue_data.py's layout (CoLA/train.tsv, ...) or Hugging "
        "Face's copies per config (cola/ saved by datasets, or its parquet files)",
    )
    b.add_argument(
        "--clue", metavar="DIR", help="CLUE folder: afqmc/train.json, dev.json, ... (jsonl)"
    )
    b.add_argument(
        "--protocol",
        choices=sorted(PROTOCOLS),
        default="run_glue",
        help="fine-tuning preset (docs/evaluation.md); the recipe flags below override it "
        "(default run_glue: lr 2e-5, batch 32, 3 epochs, seed 42)",
    )
    b.add_argument(
        "--from_mnli",
        choices=("protocol", "off"),
        default="protocol",
        help="RTE/MRPC/STS-B from the MNLI fine-tuned model as the protocol says, or never",
    )
    b.add_argument("--max_eval_examples", type=int, default=None, help="cap per reported split")
    p.add_argument("--no_progress", action="store_true", help="no progress bar")
    p.add_argument("--out", required=True, help="folder for results.json, results.md, plots")
    p.add_argument(
        "--seeds",
        type=int,
        default=None,
        help="fine-tuning seeds per lr (default 3; GLUE/CLUE: the protocol's)",
    )
    p.add_argument("--seed", type=int, default=0, help="first seed (seeds are seed..seed+K-1)")
    p.add_argument(
        "--device",
        default=None,
        help="cuda | cpu (default: cuda when present); --glue/--clue: a comma-separated list "
        "runs the tasks side by side, one per device (default: every GPU)",
    )
    p.add_argument("--only", nargs="+", default=None, help="evaluate only these task names")
    g = p.add_argument_group("recipe overrides (all tasks)")
    g.add_argument("--lrs", default=None, help="comma-separated learning-rate grid")
    for name, what in _INT_RECIPE.items():
        default = getattr(Recipe(), name)
        g.add_argument(f"--{name}", type=int, default=None, help=f"{what} (default {default})")
    g.add_argument("--warmup_ratio", type=float, default=None)
    g.add_argument("--weight_decay", type=float, default=None, help="AdamW's (default 0.01)")
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
    over = {
        k: getattr(args, k)
        for k in (*_INT_RECIPE, "warmup_ratio", "weight_decay", "long_documents")
    }
    if args.lrs:
        over["lrs"] = tuple(float(x) for x in args.lrs.split(","))
    return {k: v for k, v in over.items() if v is not None and k in Recipe.__dataclass_fields__}


def _benchmark_overrides(args: argparse.Namespace) -> dict:
    """The recipe flags given, as protocol settings (protocols.OVERRIDABLE)."""
    over = {k: getattr(args, k) for k in OVERRIDABLE if k not in ("lrs", "seeds")}
    over = {k: v for k, v in over.items() if v is not None}
    if "epochs" in over:
        over["epochs"] = float(over["epochs"])
    if args.lrs:
        over["lrs"] = tuple(float(x) for x in args.lrs.split(","))
    if args.seeds is not None:
        over["seeds"] = tuple(range(args.seed, args.seed + args.seeds))
    if args.from_mnli == "off":
        over["from_mnli"] = False
    return over


def _run_benchmark(args: argparse.Namespace) -> int:
    """--glue / --clue: every task the folder holds (or --only), the protocol, the outputs."""
    bench, root = ("glue", args.glue) if args.glue else ("clue", args.clue)
    if args.tasks or args.train:
        raise UserError(f"--{bench} and --tasks/--train are two evaluations: run them apart")
    if args.protocol == "mosaicbert" and bench == "clue":
        raise UserError("--protocol mosaicbert has settings for GLUE's tasks only; use bert")
    unused = [
        f"--{k}"
        for k in ("min_steps", "dev_checks", "patience", "window_stride", "long_documents")
        if getattr(args, k) is not None
    ]
    if unused:
        raise UserError(
            f"{', '.join(unused)}: not part of a --{bench} protocol (fixed epochs, dev scored "
            "once at the end, as the papers ran it); leave them out"
        )
    datas = load_benchmark(bench, root, args.only)
    for d in datas:
        d.train = d.train.head(args.max_train_examples)
        d.evals = {k: v.head(args.max_eval_examples) for k, v in d.evals.items()}
    results = evaluate_benchmark(
        bench,
        args.models,
        datas,
        args.protocol,
        _benchmark_overrides(args),
        [torch.device(d) for d in args.device.split(",")] if args.device else None,
        workdir=str(Path(args.out) / "models"),
        progress_bar=not args.no_progress,
    )
    out = Path(args.out)
    paths = write_benchmark(out, results)
    print(benchmark_table(results))
    for path in [*paths, *plot_benchmark_steps(results, out)]:
        print(path, file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    args = _parser().parse_args(argv)
    quiet_libraries()
    quiet_transformers()
    out = Path(args.out)
    try:
        if args.seeds is not None and args.seeds < 1:
            raise TaskError("--seeds must be at least 1")
        if args.glue and args.clue:
            raise TaskError("--glue and --clue: give one benchmark per run")
        if args.glue or args.clue:
            return _run_benchmark(args)
        args.seeds = 3 if args.seeds is None else args.seeds
        tasks = [load_task(s) for s in _task_specs(args)]
        device = torch.device(args.device) if args.device else None
        results = evaluate_models(
            args.models,
            tasks,
            list(range(args.seed, args.seed + args.seeds)),
            _overrides(args),
            device,
            workdir=str(out / "models"),
            progress_bar=not args.no_progress,
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
