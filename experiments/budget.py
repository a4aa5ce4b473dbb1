"""The budget recipe lever by lever, at equal wall time (issue 52).

    python -m experiments.budget --out runs/budget_levers [--lever_seconds 60]
        [--long_seconds 150] [--seeds 3] [--quick]

Every arm is the project's trainer launched as a user launches it (one process, one thread,
``--num_workers 0``), the ``tiny`` model, ended by ``--max_time_hours`` (start-up included, as a
user's budget counts it), the same seeds for every arm:

- ``standard``: the standard BERT recipe: lr 1e-4, 1% warmup + linear decay laid over the
  budget (``--schedule_clock time``: on the step clock the budget would stop it mid-decay),
  15% masking, dropout 0.1, 128 tokens, one global batch throughout;
- one arm per lever of ``recipes/budget.yaml`` added alone to it: ``+lr`` (its peak lr),
  ``+wsd`` (its warmup-stable-1-sqrt-decay on the clock), ``+mask`` (30%), ``+no_dropout``,
  ``+ramp`` (the batch ramp over the first 60% of the budget);
- ``budget``: the whole recipe (``--recipe recipes/budget.yaml``, model, engine and batch sizes
  scaled to this CPU).

Two stages: the lever table (every arm, ``--lever_seconds`` each) and the long stage (standard
vs budget only, ``--long_seconds``). Within a seed round the arms alternate, in an order rotated
by the round, so load that moves on a shared machine falls on every arm alike.

Measured per run: the held-out masked-LM loss at 15% masking (the trainer's own validation on
the held-out documents of the corpus, ``--eval_mask_prob 0.15``, every ``--eval_every`` steps and
at the end), the seconds it needed to reach the standard arm's final held-out loss of the same
seed (linear between validations; None: never), tokens and steps; then every final model
fine-tuned on the GLUE slices of ``tests/data/glue`` (SST-2, STS-B) by ``pretrain.evaluate
--glue``. Per arm: median [min, max] over seeds and the mean paired difference to ``standard``
(same seed) with a bootstrap 95% interval. Every run resumes (``--resume auto``: a killed run
continues with the rest of its budget) and every finished stage is skipped. Writes
OUT/summary.json and OUT/summary.md (``--results`` copies the JSON for docs/bench).

Corpus: the pydoc topic pages and the docstrings of the standard library, numpy, networkx and
sympy (``data_prep.domain_text``; about 10 MB), 5% of the documents held out. The recipe was
written from the literature before any of this text was seen.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
from pathlib import Path

from benchmarks.common import CPU_DS_CONFIG, REPO, build_shards, write_results
from bertforge.cli import ArgumentParser
from bertforge.files import write_json_atomic, write_text_atomic
from bertforge.logs import get_logger
from bertforge.pretrain.components.metrics import read_metrics
from bertforge.pretrain.config import command_line
from experiments.arms import Stages, paired_difference

log = get_logger(__spec__.name if __spec__ else __name__)

RECIPE = REPO / "recipes" / "budget.yaml"
GLUE = REPO / "tests" / "data" / "glue"
STANDARD, BUDGET = "standard", "budget"
EVAL_MASK = 0.15
# The standard BERT recipe (Devlin et al. 2019): lr 1e-4, warmup 10k of 1M steps, linear decay,
# 15% masking, dropout 0.1, 128 tokens (its first 90%).
STANDARD_FLAGS = {
    "lr": 1e-4,
    "schedule": "warmup_decay",
    "decay": "linear",
    "schedule_clock": "time",
    "warmup_ratio": 0.01,
    "mask_prob": 0.15,
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
}
# Each lever of recipes/budget.yaml alone (the values the recipe sets).
LEVERS = {
    "+lr": {"lr": 5e-4},
    "+wsd": {"schedule": "wsd", "warmup_ratio": 0.06, "decay_fraction": 0.2},
    "+mask": {"mask_prob": 0.3},
    "+no_dropout": {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0},
    "+ramp": {"batch_ramp_start": "RAMP"},  # a quarter of the global batch (arm_flags)
}
LEVER_ARMS = (STANDARD, *LEVERS, BUDGET)
LONG_ARMS = (STANDARD, BUDGET)
PYTHON_PACKAGES = ("numpy", "networkx", "sympy")  # pinned by constraints.txt (sympy via torch)


def arm_flags(arm: str, a: argparse.Namespace) -> dict:
    """The trainer flags of ``arm`` (besides the run's shared ones)."""
    if arm == BUDGET:
        return {"recipe": RECIPE, "batch_ramp_start": a.global_batch_size // 4}
    flags = dict(STANDARD_FLAGS)
    for key, value in LEVERS.get(arm, {}).items():
        flags[key] = a.global_batch_size // 4 if value == "RAMP" else value
    if arm == "+wsd":
        flags.pop("decay")
    return flags


def arm_order(arms: tuple[str, ...], round_index: int) -> list[str]:
    """The arms of one seed round, rotated by the round (each arm takes each slot in turn)."""
    k = round_index % len(arms)
    return list(arms[k:] + arms[:k])


def corpus(out: Path, quick: bool) -> Path:
    """The training text (module docstring); quick: the pydoc pages only."""
    from bertforge.data_prep.domain_text import write_domain_text
    from bertforge.data_prep.sample_corpus import write_english_corpus

    text = out / "corpus.txt"
    if text.is_file():
        return text
    parts = [out / "pydoc.txt"]
    write_english_corpus(parts[0], 40 if quick else None)
    if not quick:
        stdlib = sorted(
            m
            for m in sys.stdlib_module_names
            if not m.startswith("_") and m not in ("antigravity", "this") and _pure_python(m)
        )
        for name, packages in (("stdlib", stdlib), ("packages", list(PYTHON_PACKAGES))):
            path = out / f"{name}.txt"
            write_domain_text([p for p in packages if _pure_python(p)], path)
            parts.append(path)
    body = "\n\n".join(p.read_text(encoding="utf-8").strip() for p in parts)
    write_text_atomic(text, body + "\n")
    return text


def _pure_python(name: str) -> bool:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    skip = ("idlelib", "turtledemo", "tkinter", "test", "lib2to3", "ensurepip")
    return bool(spec and spec.origin and spec.origin.endswith(".py")) and name not in skip


class Bench:
    """The runs of one measurement in OUT; each skipped when its result is there."""

    def __init__(self, a: argparse.Namespace):
        self.a, self.out = a, a.out.absolute()
        self.stages = Stages(self.out)

    def shards(self) -> Path:
        text = corpus(self.out, self.a.quick)
        return build_shards(
            text,
            self.out / "shards",
            vocab_size=self.a.vocab,
            max_seq_len=128,
            validation_fraction=0.05 if not self.a.quick else 0.1,
        )

    def train(self, stage: str, arm: str, seed: int, seconds: float, shards: Path) -> Path:
        """One run, OUT/runs/STAGE/ARM/seedN (resumed until its DONE marker)."""
        a = self.a
        run = self.out / "runs" / stage / arm.replace("+", "plus_") / f"seed{seed}"
        if (run / "DONE").is_file():
            return run
        flags = arm_flags(arm, a)
        cmd = command_line.trainer(
            data=shards,
            output_dir=run,
            ds_config=CPU_DS_CONFIG,
            model=a.model,
            max_time_hours=seconds / 3600.0,
            max_steps=100_000_000,
            global_batch_size=a.global_batch_size,
            micro_batch_size=a.micro_batch_size,
            seed=seed,
            resume="auto",
            eval_interval=a.eval_every,
            eval_batches=a.eval_batches,
            eval_mask_prob=EVAL_MASK,
            save_interval=0,
            save_interval_minutes=0,
            num_workers=0,
            progress="false",
            **flags,
        )
        self.stages.run(f"{stage}_{run.parent.name}_seed{seed}", cmd)
        (run / "DONE").write_text("")
        return run

    def glue(self, stage: str, runs: dict[tuple[str, int], Path]) -> dict:
        """pretrain.evaluate --glue of every final model of the stage (one call, cached)."""
        out = self.out / "glue" / stage
        if not (out / "glue.json").is_file():
            models = [f"{arm}_seed{seed}={run}" for (arm, seed), run in runs.items()]
            cmd = [sys.executable, "-m", "bertforge.pretrain.evaluate", "--models", *models]
            cmd += ["--glue", str(GLUE), "--out", str(out), "--seeds", "1", "--device", "cpu"]
            cmd += ["--lrs", str(self.a.glue_lr), "--epochs", str(self.a.glue_epochs)]
            cmd += ["--no_progress"]
            if self.a.quick:
                cmd += ["--max_train_examples", "64", "--max_eval_examples", "64"]
            self.stages.run(f"glue_{stage}", cmd)
        return json.loads((out / "glue.json").read_text(encoding="utf-8"))


def run_record(run: Path) -> dict:
    """Steps, tokens, seconds and the held-out curve [(elapsed_s, val_loss)] of one run."""
    train = {r["step"]: r for r in read_metrics(run / "metrics.jsonl", "train")}
    vals = read_metrics(run / "metrics.jsonl", "validation")
    curve = sorted({r["step"]: (r["elapsed_s"], r["val_loss"]) for r in vals}.items())
    last = train[max(train)]
    return {
        "steps": max(train),
        "tokens": int(sum(r["tokens"] for r in train.values())),
        "elapsed_s": round(last["elapsed_s"], 1),
        "curve": [[round(t, 2), v] for _, (t, v) in curve],
        "final_loss": curve[-1][1][1],
        "guard_events": sum(1 for r in read_metrics(run / "metrics.jsonl", "guard")),
    }


def time_to(curve: list[list[float]], target: float) -> float | None:
    """The first time the held-out loss reached ``target``, linear between validations."""
    prev = None
    for t, v in curve:
        if v <= target:
            if prev is None or prev[1] == v:
                return t
            t0, v0 = prev
            return t0 + (t - t0) * (v0 - target) / (v0 - v)
        prev = (t, v)
    return None


def glue_scores(glue: dict, label: str) -> dict[str, float]:
    """SST-2 accuracy and STS-B Spearman of one model of a glue.json."""
    # pretrain.evaluate names a run's row LABEL@STEP (the checkpoint it scored)
    m = next(v for k, v in glue["models"].items() if k.split("@")[0] == label)
    return {"SST-2": m["SST-2"]["accuracy"], "STS-B": m["STS-B"]["spearmanr"]}


def summarise_stage(records: dict, glue: dict | None, arms: tuple[str, ...], seeds: list[int]):
    """Per arm: held-out loss, time to the standard's final loss, tokens, GLUE; paired diffs."""
    out = {}
    for arm in arms:
        recs = [records[(arm, s)] for s in seeds]
        targets = [records[(STANDARD, s)]["final_loss"] for s in seeds]
        times = [time_to(r["curve"], t) for r, t in zip(recs, targets)]
        row = {
            "final_loss": _spread([r["final_loss"] for r in recs]),
            "time_to_standard_s": times,
            "time_fraction": [
                None if t is None else round(t / r["elapsed_s"], 3) for t, r in zip(times, recs)
            ],
            "tokens": _spread([r["tokens"] for r in recs]),
            "steps": _spread([r["steps"] for r in recs]),
            "guard_events": sum(r["guard_events"] for r in recs),
        }
        if arm != STANDARD:
            row["loss_vs_standard"] = paired_difference([r["final_loss"] for r in recs], targets)
        if glue is not None:
            g = [glue_scores(glue, f"{arm}_seed{s}") for s in seeds]
            ref = [glue_scores(glue, f"{STANDARD}_seed{s}") for s in seeds]
            for task in ("SST-2", "STS-B"):
                row[task] = _spread([x[task] for x in g])
                if arm != STANDARD:
                    row[task + "_vs_standard"] = paired_difference(
                        [x[task] for x in g], [x[task] for x in ref]
                    )
        out[arm] = row
    return out


def _spread(values: list[float]) -> dict:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "values": values,
    }


def markdown(summary: dict) -> str:
    """One table per stage."""
    lines = []
    for stage, s in summary["stages"].items():
        lines += [
            f"\n**{stage}**: {s['seconds']:g} s per run, seeds {s['seeds']}\n",
            "| arm | held-out loss @15% | vs standard | time to standard's final loss "
            "(fraction of budget) | tokens | SST-2 acc | vs standard | STS-B Spearman | "
            "vs standard |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for arm, r in s["arms"].items():
            fl = r["final_loss"]
            cells = [f"{fl['median']:.3f} [{fl['min']:.3f}, {fl['max']:.3f}]"]
            cells.append(_diff(r.get("loss_vs_standard")))
            fr = [f"{x:.2f}" if x is not None else "never" for x in r["time_fraction"]]
            cells.append(", ".join(fr))
            cells.append(f"{r['tokens']['median'] / 1e6:.2f} M")
            for task in ("SST-2", "STS-B"):
                if task in r:
                    t = r[task]
                    cells.append(f"{t['median']:.3f} [{t['min']:.3f}, {t['max']:.3f}]")
                    cells.append(_diff(r.get(task + "_vs_standard")))
                else:
                    cells += ["-", "-"]
            lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    lines.append(
        "\nHeld-out loss: median [min, max] over pretraining seeds; vs standard: mean paired "
        "difference (same seed), bootstrap 95% interval. Time: when each seed's run first "
        "reached the standard arm's final held-out loss of that seed, as a fraction of the "
        "budget (1.00 for the standard itself)."
    )
    return "\n".join(lines) + "\n"


def _diff(d: dict | None) -> str:
    return "-" if d is None else f"{d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("runs/budget_levers"))
    p.add_argument("--lever_seconds", type=float, default=60.0)
    p.add_argument("--long_seconds", type=float, default=150.0)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--model", default="tiny")
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--global_batch_size", type=int, default=64)
    p.add_argument("--micro_batch_size", type=int, default=16)
    p.add_argument("--eval_every", type=int, default=10, help="validation every N steps")
    p.add_argument("--eval_batches", type=int, default=4, help="held-out global batches")
    p.add_argument("--glue_lr", type=float, default=5e-4)
    p.add_argument("--glue_epochs", type=int, default=5)
    p.add_argument("--stages", nargs="+", default=["long", "levers"], choices=["levers", "long"])
    p.add_argument("--no_glue", action="store_true", help="held-out loss only")
    p.add_argument("--results", type=Path, default=None, help="copy of summary.json")
    p.add_argument(
        "--quick", action="store_true", help="CI: tiny corpus, 2 seeds, standard vs budget, 12 s"
    )
    a = p.parse_args(argv)
    # the children import this checkout's package (an editable install may point elsewhere)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        x for x in (str(REPO), os.environ.get("PYTHONPATH", "")) if x
    )
    if a.quick:
        a.seeds, a.lever_seconds, a.long_seconds, a.vocab = 2, 14.0, 14.0, 1000
        a.global_batch_size, a.micro_batch_size, a.eval_every, a.eval_batches = 16, 4, 4, 2
        a.glue_epochs, a.stages = 1, ["long"]
    bench = Bench(a)
    shards = bench.shards()
    seeds = list(range(1, a.seeds + 1))
    plan = {"levers": (LEVER_ARMS, a.lever_seconds), "long": (LONG_ARMS, a.long_seconds)}
    summary = {"command": " ".join(sys.argv), "stages": {}}
    for stage in a.stages:
        arms, seconds = plan[stage]
        runs = {}
        for i, seed in enumerate(seeds):  # one round per seed, the arms alternating in it
            for arm in arm_order(arms, i):
                runs[(arm, seed)] = bench.train(stage, arm, seed, seconds, shards)
        records = {k: run_record(r) for k, r in runs.items()}
        summary["stages"][stage] = {
            "seconds": seconds,
            "seeds": seeds,
            "arms": summarise_stage(records, None, arms, seeds),
            "runs": {f"{arm}/seed{s}": rec for (arm, s), rec in records.items()},
        }
        write_json_atomic(bench.out / "summary.json", summary)  # the losses before GLUE's
        if not a.no_glue:
            glue = bench.glue(stage, runs)
            summary["stages"][stage]["arms"] = summarise_stage(records, glue, arms, seeds)
            write_json_atomic(bench.out / "summary.json", summary)
    text = markdown(summary)
    write_text_atomic(bench.out / "summary.md", text)
    print(text)
    if a.results:
        write_results(a.results, summary, run=bench.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
