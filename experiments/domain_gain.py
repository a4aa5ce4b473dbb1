"""Does continued pretraining of a real checkpoint on a domain pay, and which knobs matter?

    python -m experiments.domain_gain --out runs/gain_stdlib [--base HF_DIR]
        [--steps 200] [--seeds 5] [--arms b_mask15 c_wholeword ...] [--quick]

Experiment B of issue 23, and the seeds' tips measured. The base is a real pretrained encoder:
sentence-transformers' all-MiniLM-L6-v2 (``benchmarks.learning.real_checkpoint``: a ``BertModel``
without an MLM head, bert-base-uncased vocabulary), or ``--base``. The domain is the standard
library's docstrings; the task is which package a docstring comes from
(``benchmarks.tasks.stdlib_tasks``: 8 packages, labels true by construction). The continued-
pretraining corpus is every other docstring of those packages plus the ``CORPUS_EXTRA`` packages,
so no docstring of the task is pretrained on.

Arms (every continued arm: ``--init_from`` the base, the same optimizer steps, sequences, batch,
lr schedule, seed and data order; one rank, one thread):

- ``a_base``: no continued pretraining (the classifier and everything else trained only in
  fine-tuning); the reference of the main table;
- ``b_mask15``: 15% token masking;
- ``c_wholeword``: whole-word masking with protected domain terms, 15%;
- ``d_vocab_mean``: (c) on an extended vocabulary (the same terms added as tokens), new rows the
  mean of their pieces (``--init_from``'s default);
- ``e_vocab_random``: (d) with random new rows (normal(0, initializer_range));
- ``mask08``, ``mask20``, ``mask30``: (b) at mask rates 0.08, 0.20, 0.30;
- ``static15``: (b) with ``--static_masking`` (a sample's mask fixed over the epochs).

Domain terms (one rule for (c)-(e)): ``data_prep extend-tokenizer``'s mining, words of the
corpus the base tokenizer splits into ``--min_pieces`` (3) or more pieces that occur
``--min_frequency`` (5) or more times, at most ``--max_new`` of them.

Each arm is fine-tuned by ``pretrain.evaluate`` over the same seeds and lr grid. Printed and
written to OUT/summary.json and OUT/summary.md: the main table (every arm against ``a_base``,
bootstrap 95% interval of the mean paired difference) and the tips table (each tip's pair);
OUT/gain.png. Every stage is skipped when its result is in OUT, so a killed experiment continues;
``--arms`` runs only those arms (tables when ``a_base`` is among them): two processes on disjoint
arms can share one OUT, and a last run without ``--arms`` makes the whole tables from their
results. ``--quick`` is a tiny form for CI (needs ``--base``: a small
model the test wrote; checks the tables' shape, not their numbers).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from benchmarks.common import CPU_DS_CONFIG, build_shards, write_results
from benchmarks.learning.real_checkpoint import minilm
from benchmarks.tasks.stdlib_tasks import PACKAGES, TASK_NAME, write_tasks
from bertforge.cli import ArgumentParser
from bertforge.files import write_text_atomic
from bertforge.logs import get_logger
from bertforge.pretrain.config import command_line
from bertforge.pretrain.run_folder.run_checkpoints import find_latest, tag_for
from experiments.arms import (
    Stages,
    markdown,
    paired_difference,
    plot,
    pretraining_record,
    scores,
    summarise,
)
from experiments.new_tokens import random_rows_folder

log = get_logger(__spec__.name)  # run as `python -m`: __name__ is "__main__"

REFERENCE = "a_base"
TASKS = (TASK_NAME,)
CORPUS_EXTRA = ("concurrent", "ctypes", "idlelib", "json", "tkinter", "urllib")
# arm -> (shards, trainer flags, init): shards "base" (base tokenizer) or "ext" (extended one);
# init "base" (the checkpoint) or "random_rows" (its copy with random new rows)
ARMS: dict[str, tuple[str, dict, str] | None] = {
    "a_base": None,
    "b_mask15": ("base", {"mask_prob": 0.15}, "base"),
    "c_wholeword": ("base", {"mask_prob": 0.15, "whole_word": True}, "base"),
    "d_vocab_mean": ("ext", {"mask_prob": 0.15, "whole_word": True}, "base"),
    "e_vocab_random": ("ext", {"mask_prob": 0.15, "whole_word": True}, "random_rows"),
    "mask08": ("base", {"mask_prob": 0.08}, "base"),
    "mask20": ("base", {"mask_prob": 0.20}, "base"),
    "mask30": ("base", {"mask_prob": 0.30}, "base"),
    "static15": ("base", {"mask_prob": 0.15, "static_masking": True}, "base"),
}
TIPS = (  # (the claim as the seeds state it, arm, the arm it is compared with)
    ("continued pretraining beats none", "b_mask15", "a_base"),
    ("protecting domain terms from being split by masking", "c_wholeword", "b_mask15"),
    ("a specialised domain wants a lower mask rate: 0.08 vs 0.15", "mask08", "b_mask15"),
    ("mask rate 0.20 vs 0.15", "mask20", "b_mask15"),
    ("mask rate 0.30 (MosaicBERT's, ModernBERT's) vs 0.15", "mask30", "b_mask15"),
    ("dynamic masking uses the data better than static (static - dynamic)", "static15", "b_mask15"),
    ("an extended vocabulary with mean-of-pieces rows vs none", "d_vocab_mean", "c_wholeword"),
    ("mean-of-pieces rows beat random rows for added tokens", "d_vocab_mean", "e_vocab_random"),
)


class Experiment(Stages):
    """The stages of experiment B in OUT; each skipped when its result is already there."""

    def __init__(self, args: argparse.Namespace):
        super().__init__(args.out)
        self.args = args

    def base(self) -> Path:
        return self.args.base.absolute() if self.args.base else minilm(self.args.cache)

    def tasks_and_corpus(self) -> tuple[Path, Path]:
        """The task (tasks.json) and the domain corpus without the task's docstrings."""
        tasks, corpus = self.out / "tasks" / "tasks.json", self.out / "corpus.txt"
        if not (tasks.is_file() and corpus.is_file()):
            packages = (*PACKAGES, *self.args.corpus_extra)
            write_tasks(tasks.parent, PACKAGES, self.args.per_package, corpus, packages)
        return tasks, corpus

    def terms_and_tokenizer(self, corpus: Path) -> tuple[Path, Path]:
        """The mined domain terms (terms.txt, for protected terms) and the extended tokenizer."""
        a, ext, terms = self.args, self.out / "ext_tokenizer", self.out / "terms.txt"
        if not (ext / "extension_report.json").is_file():
            cmd = [sys.executable, "-m", "bertforge.data_prep", "extend-tokenizer"]
            cmd += command_line.flags(
                {
                    "tokenizer": self.base(),
                    "input": corpus,
                    "output": ext,
                    "min_pieces": a.min_pieces,
                    "min_frequency": a.min_frequency,
                    "max_new": a.max_new,
                },
                switches=False,
            )
            self.run("extend_tokenizer", cmd)
        if not terms.is_file():
            report = json.loads((ext / "extension_report.json").read_text(encoding="utf-8"))
            write_text_atomic(terms, "".join(t["token"] + "\n" for t in report["new_tokens"]))
        return terms, ext

    def shards(self, corpus: Path, terms: Path, tokenizer: Path, name: str) -> Path:
        return build_shards(
            corpus,
            self.out / f"shards_{name}",
            tokenizer=tokenizer,
            protected_terms=terms,
            max_seq_len=self.args.seq_len,
            validation_fraction=0.05,
            workers=1,
        )

    def pretrain(self, arm: str, shards: Path, init: Path, extra: dict) -> Path:
        run, a = self.out / "runs" / arm, self.args
        latest = find_latest(run / "checkpoints") if (run / "checkpoints").is_dir() else None
        if latest is not None and latest.name == tag_for(a.steps):
            return run  # finished before
        cmd = command_line.trainer(
            ds_config=CPU_DS_CONFIG,
            data=shards,
            init_from=init,
            output_dir=run,
            max_steps=a.steps,
            resume="auto",
            global_batch_size=a.batch,
            micro_batch_size=a.batch,
            lr=a.lr,
            warmup_steps=max(1, a.steps // 10),
            decay="linear",
            save_interval=a.steps,
            keep_last=1,
            eval_interval=max(1, a.steps // 4),
            num_workers=0,
            progress="false",
            seed=1234,
            **extra,
        )
        self.run(f"pretrain_{arm}", cmd)
        return run

    def evaluate_arm(self, arm: str, model: Path, tasks: Path) -> dict:
        a = self.args
        return self.evaluate(arm, [f"{arm}={model}"], tasks, TASKS, a.seeds, a.recipe)


def tips_table(summary: dict) -> list[dict]:
    """Each tip's paired difference (same fine-tuning seed) with its bootstrap interval."""
    rows = []
    for claim, arm, against in TIPS:
        for task, t in summary["tasks"].items():
            if arm in t["arms"] and against in t["arms"]:
                d = paired_difference(t["arms"][arm]["values"], t["arms"][against]["values"])
                rows.append({"claim": claim, "arm": arm, "against": against, "task": task, **d})
    return rows


def tips_markdown(rows: list[dict]) -> str:
    lines = ["| tip | arm - against | task | mean paired difference [95% CI] | reading |"]
    lines.append("|---|---|---|---|---|")
    for r in rows:
        reading = (
            "no difference within the interval"
            if r["low"] <= 0 <= r["high"]
            else ("arm better" if r["low"] > 0 else "arm worse")
        )
        lines.append(
            f"| {r['claim']} | {r['arm']} - {r['against']} | {r['task']} | "
            f"{r['mean']:+.3f} [{r['low']:+.3f}, {r['high']:+.3f}] | {reading} |"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = ArgumentParser(
        prog="python -m experiments.domain_gain",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", type=Path, required=True, help="experiment folder (resumed if there)")
    p.add_argument("--base", type=Path, default=None, help="base HF folder (default: MiniLM)")
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "bertforge")
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=None, help="only these")
    p.add_argument("--steps", type=int, default=200, help="continued-pretraining steps per arm")
    p.add_argument("--batch", type=int, default=16, help="sequences per optimizer step")
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-4, help="continued-pretraining peak lr")
    p.add_argument("--per_package", type=int, default=100, help="task docstrings per package")
    p.add_argument(
        "--corpus_extra",
        nargs="*",
        default=list(CORPUS_EXTRA),
        help="more packages whose docstrings join the corpus (not the task)",
    )
    p.add_argument("--min_pieces", type=int, default=3, help="term rule: base pieces at least")
    p.add_argument("--min_frequency", type=int, default=5, help="term rule: occurrences")
    p.add_argument("--max_new", type=int, default=200, help="terms (and new tokens) at most")
    p.add_argument("--seeds", type=int, default=5, help="fine-tuning seeds per arm (K >= 5)")
    p.add_argument("--lrs", default="1e-4", help="fine-tuning lr grid, the same for every arm")
    p.add_argument("--ft_steps", type=int, default=60, help="fine-tuning optimizer steps, least")
    p.add_argument("--ft_max_length", type=int, default=64, help="fine-tuning tokens per example")
    p.add_argument("--quick", action="store_true", help="a tiny form for CI (needs --base)")
    args = p.parse_args(argv)
    if args.quick:  # shape, not numbers: seconds of everything
        if args.base is None:
            p.error("--quick needs --base (a small model folder; CI downloads nothing)")
        args.steps, args.batch, args.seq_len, args.seeds, args.per_package = 4, 4, 32, 2, 12
        args.ft_steps, args.ft_max_length, args.corpus_extra = 4, 32, []
        args.min_pieces, args.min_frequency, args.max_new = 2, 2, 20
    args.recipe = ["--lrs", args.lrs, "--min_steps", str(args.ft_steps), "--epochs", "1"]
    args.recipe += ["--batch_size", "16", "--max_length", str(args.ft_max_length)]
    args.recipe += ["--dev_checks", "1" if args.quick else "4", "--patience", "0"]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exp = Experiment(args)
    base = exp.base()
    tasks, corpus = exp.tasks_and_corpus()
    terms, ext = exp.terms_and_tokenizer(corpus)
    arms = args.arms or list(ARMS)
    # the shards and initial weights of the continued arms that run, nothing more
    continued = [ARMS[arm] for arm in arms if ARMS[arm] is not None]
    tokenizers = {"base": base, "ext": ext}
    shards = {
        name: exp.shards(corpus, terms, tokenizers[name], name)
        for name in dict.fromkeys(shard_set for shard_set, _, _ in continued)
    }
    inits = {"base": base}
    if any(init == "random_rows" for _, _, init in continued):
        inits["random_rows"] = random_rows_folder(base, ext, exp.out / "random_rows")
    results, records = {}, {}
    for arm in arms:
        if ARMS[arm] is None:
            results[arm] = exp.evaluate_arm(arm, base, tasks)
            continue
        shard_set, flags, init = ARMS[arm]
        run = exp.pretrain(arm, shards[shard_set], inits[init], flags)
        records[arm] = pretraining_record(run)
        results[arm] = exp.evaluate_arm(arm, run, tasks)
    if REFERENCE not in results:
        log.info(f"arms {' '.join(args.arms)} done; the tables need {REFERENCE} (omit --arms)")
        return 0
    arms = {name: scores(res) for name, res in results.items()}
    summary = summarise(arms, results[REFERENCE]["references"], args.seeds, TASKS, REFERENCE)
    tips = tips_table(summary)
    summary |= {
        "tips": tips,
        "pretraining": records,
        "continued": {
            "steps": args.steps,
            "batch": args.batch,
            "seq_len": args.seq_len,
            "lr": args.lr,
            "ranks": 1,
            "threads": 1,
        },
        "terms": terms.read_text(encoding="utf-8").split(),
        "finetune_recipe": args.recipe,
        "seconds": exp.seconds,  # this launch's stages (a resumed experiment skips the done ones)
        "command": " ".join(["python -m experiments.domain_gain", *(argv or sys.argv[1:])]),
    }
    if records:
        summary["pretraining_median_s"] = statistics.median(
            r["training_s"] for r in records.values()
        )
    write_results(exp.out / "summary.json", summary, exp.out)
    table = markdown(summary) + "\n" + tips_markdown(tips)
    write_text_atomic(exp.out / "summary.md", table)
    plot(summary, exp.out / "gain.png")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
