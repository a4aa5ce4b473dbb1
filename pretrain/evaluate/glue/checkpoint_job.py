"""One checkpoint's GLUE (or CLUE) during pretraining: the background job that
``--downstream_eval glue:DIR[:TASKS]`` starts after each N-th checkpoint.

``python -m pretrain.evaluate.downstream RUN@STEP --tasks glue:DIR:RTE,STS-B --out
RUN/downstream/step_N.jsonl [--max_examples 500] [--device cuda]`` (what
:mod:`pretrain.components.downstream_jobs` runs) fine-tunes the checkpoint on each task with the
``run_glue`` protocol (lr 2e-5, batch 32, 3 epochs, 128 tokens, no warmup; one seed, the
protocol's 42 unless ``--seed``) through :func:`suite.evaluate_benchmark`, on the first
``--max_examples`` train examples of each task, and scores each reported dev split whole (so
the numbers are dev numbers, of a capped fine-tuning). One record per reported split and metric::

    {"split": "downstream", "benchmark": "glue", "task": "RTE", "metric": "accuracy",
     "value": 0.61, "lr": 2e-05, "seed": 42, "train": 500, "test": 277, "seconds": 41.2,
     "step": 400, "tokens": 52428800, "hours": 0.31}

(MNLI's tasks are "MNLI-m" and "MNLI-mm"), and ``{"task": "GLUE", "metric": "score", ...}`` when
every task of the benchmark's average was run (:func:`tasks.benchmark_score`; none otherwise).
``tokens``: the tokens trained on up to the step (the per-step ``tokens`` of RUN/metrics.jsonl);
``hours``: the run's training time at the checkpoint, over all its launches (the checkpoint's
``elapsed_s``). Either is left out, with a warning in the job's log, where the run does not
record it. The job then redraws ``BENCH_vs_tokens.png`` beside ``--out``
(:mod:`pretrain.evaluate.glue.progress_plot`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from bertforge.logs import get_logger
from bertforge.pretrain.components.metrics import read_metrics
from bertforge.pretrain.data.glue.readers import BenchmarkData
from bertforge.pretrain.data.glue.spec import BenchmarkSpec, load_spec
from bertforge.pretrain.evaluate.glue.suite import evaluate_benchmark
from bertforge.pretrain.evaluate.models import ModelRef
from bertforge.pretrain.evaluate.runner import default_device
from bertforge.pretrain.run_folder.layout import RunFolder
from bertforge.pretrain.run_folder.run_checkpoints import read_state

log = get_logger(__name__)

PROTOCOL = "run_glue"


def load_capped(value: str, max_train: int) -> tuple[BenchmarkSpec, list[BenchmarkData]]:
    """The tasks of ``glue:DIR[:TASKS]``, each cut to its first ``max_train`` train examples."""
    spec, datas = load_spec(value, "--tasks")
    for d in datas:
        d.train = d.train.head(max_train)
    return spec, datas


def tokens_seen(metrics: Path, step: int) -> int | None:
    """Tokens trained on in steps 1..``step`` (each step's last record: a guard's rollback
    repeats steps); None when metrics.jsonl lacks one of those steps (a run continued from
    another run's step, a lost file)."""
    if not metrics.is_file():
        return None
    per_step = {int(r["step"]): r["tokens"] for r in read_metrics(metrics) if r["step"] <= step}
    if sorted(per_step) != list(range(1, step + 1)):
        return None
    return int(sum(per_step.values()))


def checkpoint_progress(ref: ModelRef) -> dict[str, Any]:
    """``{"tokens": ..., "hours": ...}`` of a run's checkpoint (module doc); {} for an HF
    folder. Read before the job gives its lease back: the checkpoint may be pruned after."""
    if ref.checkpoint is None or ref.step is None:
        return {}
    out: dict[str, Any] = {}
    tokens = tokens_seen(RunFolder(ref.path).metrics, ref.step)
    if tokens is None:
        log.warning(
            f"{ref.path}/metrics.jsonl does not hold every step up to {ref.step}: the records "
            "carry no tokens and leave the tokens plot"
        )
    else:
        out["tokens"] = tokens
    elapsed = read_state(ref.checkpoint).get("elapsed_s")
    if elapsed is None:
        log.warning(f"{ref.checkpoint} records no elapsed_s: the records carry no hours")
    else:
        out["hours"] = float(elapsed) / 3600.0
    return out


def benchmark_records(results: dict[str, Any], extra: dict[str, Any]) -> list[dict[str, Any]]:
    """``split: downstream`` records of one model's :func:`evaluate_benchmark` results (module
    doc), each with ``extra`` (step, tokens, hours)."""
    bench = results["benchmark"]
    records = []
    for r in results["results"]:
        seeds = sorted({run["seed"] for run in r["runs"]})
        seconds = sum(run["seconds"] for run in r["runs"])
        for name, metrics in r["evals"].items():
            for metric, stats in metrics.items():
                records.append(
                    {
                        "split": "downstream",
                        "benchmark": bench,
                        "task": name,
                        "metric": metric,
                        "value": stats["median"],
                        "lr": r["lr"],
                        "seed": seeds[0] if len(seeds) == 1 else seeds,
                        "train": r["train"],
                        "test": r["eval_sizes"][name],
                        "seconds": seconds,
                        **extra,
                    }
                )
    (row,) = results["summary"].values()
    if row[bench] is not None:
        records.append(
            {
                "split": "downstream",
                "benchmark": bench,
                "task": bench.upper(),
                "metric": "score",
                "value": row[bench],
                "seconds": sum(run["seconds"] for r in results["results"] for run in r["runs"]),
                **extra,
            }
        )
    return records


def score_checkpoint(
    hf_dir: Path,
    spec: BenchmarkSpec,
    datas: list[BenchmarkData],
    seed: int | None,
    device: torch.device | None,
    extra: dict[str, Any],
) -> list[dict[str, Any]]:
    """Fine-tune and score the HF folder ``hf_dir`` (the exported checkpoint) on every task with
    the run_glue protocol (``seed``: None keeps the protocol's); its records."""
    overrides = {} if seed is None else {"seeds": (seed,)}
    # one device: a background job never spreads over every GPU of the node
    devices = [device or default_device()]
    results = evaluate_benchmark(
        spec.benchmark, [str(hf_dir)], datas, PROTOCOL, overrides, devices, progress_bar=False
    )
    return benchmark_records(results, extra)
