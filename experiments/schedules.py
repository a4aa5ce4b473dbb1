"""Learning-rate and batch phase schedules on this CPU: held-out MLM loss at equal steps (issue 25).

    python -m experiments.schedules [--out /work/exp/schedules] [--steps 600] [--seeds 3]
        [--average_last 3] [--quick]

Data: CPython's pydoc topics (general English, ``data_prep.sample_corpus``) and standard-library
docstrings (the domain, ``data_prep.domain_text``), one WordPiece vocabulary trained on the
general text. Every arm is the project's trainer launched as a user launches it (one process,
one thread, ``--num_workers 0``), tiny model, the same seeds for every arm:

- ``linear`` (a): ``--schedule warmup_decay`` (linear decay to 0);
- ``constant`` (b): ``--decay constant``;
- ``wsd`` (c): ``--schedule wsd --decay_fraction 0.2 --decay_shape 1-sqrt``: the reference;
- ``wsd_batch_warmup`` (d): (c) plus a batch-size ramp, written as a ``--phases`` file; equal
  steps, so it sees fewer tokens (reported);
- ``wsd_avg`` (e): ``pretrain.export --average last:K`` of (c)'s last K checkpoints, against
  (c)'s last checkpoint exported alone, both scored by one evaluator (the exported folder with
  ``AutoModelForMaskedLM`` on the validation split masked by the project's Masker with the run's
  masking seed: the trainer's own validation masks);
- annealing, from (b)'s last checkpoint (a constant-lr, general-text run): ``anneal`` (f)
  ``--anneal_from RUN@STEP --anneal_tokens N`` on a general + domain mixture, against
  ``rewarm`` (g), the same tokens of continued pretraining with ``--init_from`` that checkpoint
  (weights only) and a fresh warmup + linear decay on the same mixture; judged on the domain's
  and the general text's validation records (forgetting).

(a)-(d): validation loss at the last step (the runs' own ``split: validation`` records). Per
comparison: median [min, max] over seeds, the mean paired difference (same seed) to the
reference with a bootstrap 95% interval, and training seconds. Every run
resumes (``--resume auto``) and every finished stage is skipped, so a killed benchmark continues
where it stopped. Writes OUT/summary.json, OUT/summary.md, OUT/schedules.png, and with
``--results``/``--plot`` copies for docs/bench. Wall times depend on what else the machine runs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import CPU_DS_CONFIG, REPO, build_shards, one_thread_env, write_results
from bertforge.cli import ArgumentParser
from bertforge.files import write_json_atomic, write_text_atomic
from bertforge.logs import get_logger
from bertforge.pretrain.components.metrics import read_metrics
from bertforge.pretrain.config import command_line
from bertforge.pretrain.run_folder.run_checkpoints import find_latest, tag_for
from experiments.arms import paired_difference, pretraining_record

log = get_logger(__spec__.name)  # run as `python -m`: __name__ is "__main__"

SCHEDULE_ARMS = ("linear", "constant", "wsd", "wsd_batch_warmup")
REFERENCE, ANNEAL_REFERENCE = "wsd", "rewarm"
DECAY_FRACTION = 0.2
MAX_SEQ_LEN = 128


def phase_plan(a: argparse.Namespace) -> dict:
    """(d)'s phase file: (c)'s warmup, stable and 1-sqrt decay steps, with the batch ramping
    from a quarter of --global_batch_size by quarters over the first ~10% of (c)'s tokens."""
    decay = round(DECAY_FRACTION * a.steps)
    quarter = max(1, a.global_batch_size // 4)
    ramp_tokens = a.steps * a.global_batch_size * MAX_SEQ_LEN // 10
    return {
        "phases": [
            {
                "name": "warmup",
                "steps": a.warmup,
                "lr": "warmup",
                "batch": {"start": quarter, "increment": quarter, "ramp_tokens": ramp_tokens},
            },
            {"name": "stable", "steps": a.steps - a.warmup - decay, "lr": "constant"},
            {"name": "decay", "steps": decay, "lr": "1-sqrt", "min_lr_ratio": 0.0},
        ]
    }


class Bench:
    """The stages of one benchmark in OUT; each skipped when its result is already there."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.out = args, args.out.absolute()
        (self.out / "logs").mkdir(parents=True, exist_ok=True)

    def _run(self, name: str, cmd: list[str]) -> None:
        log_file = self.out / "logs" / f"{name}.log"
        log.info(f"{name}: {' '.join(map(str, cmd))}  (log: {log_file})")
        with open(log_file, "a", encoding="utf-8") as f:
            code = subprocess.run(
                cmd, cwd=REPO, env=one_thread_env(), stdout=f, stderr=f
            ).returncode
        if code != 0:
            tail = log_file.read_text(encoding="utf-8")[-3000:]
            raise SystemExit(f"{name} failed (exit {code}); end of {log_file}:\n{tail}")

    def shards(self) -> tuple[Path, Path]:
        """General shards (their tokenizer trained on the general text) and domain shards built
        with that tokenizer, so a mixture of the two has one vocabulary."""
        from bertforge.data_prep.domain_text import DEFAULT_PACKAGES, write_domain_text
        from bertforge.data_prep.sample_corpus import write_english_corpus

        general, domain = self.out / "general.txt", self.out / "domain.txt"
        if not general.is_file():
            write_english_corpus(general, self.args.max_docs)
        if not domain.is_file():
            write_domain_text(DEFAULT_PACKAGES, domain)
        common = {"max_seq_len": MAX_SEQ_LEN, "validation_fraction": 0.1, "workers": 1}
        gs = build_shards(
            general, self.out / "general_shards", vocab_size=self.args.vocab, **common
        )
        common["validation_fraction"] = 0.15  # the domain text is small: enough held out
        ds = build_shards(domain, self.out / "domain_shards", tokenizer=gs / "tokenizer", **common)
        return gs, ds

    def train(self, name: str, data: list[str] | Path, steps: int | None, **flags) -> Path:
        """One trainer run in OUT/runs/NAME (resumed; skipped when its last checkpoint is
        there). `steps` None: the run's length comes from its flags (a phase plan, an anneal)."""
        run, a = self.out / "runs" / name, self.args
        done = run / "DONE"
        if done.is_file():
            return run
        latest = find_latest(run / "checkpoints") if (run / "checkpoints").is_dir() else None
        if steps is not None and latest is not None and latest.name == tag_for(steps):
            done.write_text("")
            return run
        cmd = command_line.trainer(
            ds_config=CPU_DS_CONFIG,
            data=data,
            model=a.model,
            output_dir=run,
            max_steps=steps,
            resume="auto",
            global_batch_size=a.global_batch_size,
            micro_batch_size=flags.pop("micro_batch_size", a.global_batch_size),
            lr=a.lr,
            eval_interval=a.eval_interval,
            eval_batches=1000,  # the whole validation split every time
            save_interval=a.eval_interval,
            keep_last=a.average_last,
            num_workers=0,
            progress="false",
            **flags,
        )
        self._run(name, cmd)
        done.write_text("")
        return run

    def export(self, name: str, run: Path, average: str | None = None) -> Path:
        """What ``python -m pretrain.export RUN --output OUT/hf/NAME [--average SPEC]`` writes,
        in this process (two interpreter start-ups fewer per seed); skipped when there."""
        from bertforge.pretrain.export.hf_export import export

        out = self.out / "hf" / name
        if not (out / "config.json").is_file():
            log.info(f"export {run} -> {out}" + (f" (--average {average})" if average else ""))
            export(run, out, average=average, verify=False)
        return out

    def heldout(self, name: str, folder: Path, run: Path, shards: Path) -> dict:
        """Held-out MLM loss of an exported folder (cached in OUT/eval/NAME.json)."""
        cached = self.out / "eval" / f"{name}.json"
        if cached.is_file():
            return json.loads(cached.read_text(encoding="utf-8"))
        result = heldout_loss(folder, run, shards, self.args.global_batch_size)
        write_json_atomic(cached, result)
        return result


def heldout_loss(folder: Path, run: Path, shards: Path, micro_batch_size: int) -> dict:
    """Mean MLM loss of the HF folder over every masked position of the validation split of
    `shards`, masked by the project's Masker with `run`'s masking settings and seed (the masks
    the trainer's own validation uses): the new-token benchmark's evaluator with no new ids."""
    from experiments.new_tokens import new_token_loss, validation_batches

    batches = validation_batches(shards, run, 1, micro_batch_size)
    scored = new_token_loss(folder, batches, [])
    return {"val_loss": scored["pass0_val_loss"], "masked": scored["pass0_masked"]}


def last_validation(run: Path, source: str | None = None) -> dict:
    """The run's last validation record (of one mixture source, or the overall one)."""
    recs = [
        r for r in read_metrics(run / "metrics.jsonl", "validation") if r.get("source") == source
    ]
    if not recs:
        raise SystemExit(f"error: {run}/metrics.jsonl has no validation record (source {source})")
    return recs[-1]


def curve(run: Path) -> list[tuple[int, float]]:
    """(step, val_loss) of the overall validation records, one per step (the last)."""
    recs = read_metrics(run / "metrics.jsonl", "validation")
    return sorted({r["step"]: r["val_loss"] for r in recs if r.get("source") is None}.items())


def compare(values: dict[str, list[float] | None], reference: str, extra: dict) -> dict:
    """Per arm: median [min, max], values, the paired difference to `reference` (same seeds)
    and `extra[arm]` (seconds, tokens, ...)."""
    ref = values.get(reference)
    rows = {}
    for arm, v in values.items():
        rows[arm] = {"median": statistics.median(v), "min": min(v), "max": max(v), "values": v}
        if arm != reference and ref is not None:
            rows[arm]["vs_" + reference] = paired_difference(v, ref)
        rows[arm] |= extra.get(arm, {})
    return {"reference": reference, "arms": rows}


def markdown(title: str, table: dict) -> str:
    """One comparison of :func:`compare` as a markdown table."""
    ref = table["reference"]
    lines = [
        f"**{title}**",
        "",
        "| arm | held-out loss | vs " + ref + " (95% CI) | tokens | training s |",
    ]
    lines.append("|---|---|---|---|---|")
    for arm, r in table["arms"].items():
        d = r.get("vs_" + ref)
        diff = f"{d['mean']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]" if d else "(reference)"
        tokens = f"{statistics.median(r['tokens']):,.0f}" if "tokens" in r else "-"
        secs = f"{statistics.median(r['seconds']):.0f}" if "seconds" in r else "-"
        lines.append(
            f"| {arm} | {r['median']:.4f} [{r['min']:.4f}, {r['max']:.4f}] | {diff} "
            f"| {tokens} | {secs} |"
        )
    return "\n".join(lines) + "\n"


def plot(curves: dict[str, list[list[tuple[int, float]]]], steps: int, path: Path) -> None:
    """Validation loss against step for (a)-(d), one line per seed, the decay region shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, (arm, seeds) in enumerate(curves.items()):
        for j, pts in enumerate(seeds):
            ax.plot(*zip(*pts), color=f"C{i}", lw=1, alpha=0.8, label=arm if j == 0 else None)
    ax.axvspan((1 - DECAY_FRACTION) * steps, steps, color="#999", alpha=0.15, label="wsd decay")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("validation MLM loss")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def schedule_arms(b: Bench, gs: Path) -> tuple[dict, dict, dict]:
    """(a)-(d) for every seed: {arm: [final val loss] | None}, {arm: extra}, {arm: [curves]}."""
    a = b.args
    common = {"warmup_steps": a.warmup}
    wsd = {"schedule": "wsd", "decay_fraction": DECAY_FRACTION, "decay_shape": "1-sqrt"}
    flags = {
        "linear": {"schedule": "warmup_decay", "decay": "linear"},
        "constant": {"schedule": "warmup_decay", "decay": "constant"},
        "wsd": wsd,
    }
    values, extra, curves = {}, {}, {}
    for arm in SCHEDULE_ARMS:
        losses, recs, arm_curves = [], [], []
        for seed in a.seed_list:
            if arm == "wsd_batch_warmup":
                plan = b.out / "phases.json"
                write_json_atomic(plan, phase_plan(a), indent=2)
                # the ramp's first batch is a quarter: the micro-batch (fixed in a plan) divides it
                micro = max(1, a.global_batch_size // 4)
                run = b.train(
                    f"{arm}_s{seed}", gs, None, phases=plan, micro_batch_size=micro, seed=seed
                )
            else:
                run = b.train(f"{arm}_s{seed}", gs, a.steps, seed=seed, **common, **flags[arm])
            last = last_validation(run)
            if last["step"] != a.steps:
                raise SystemExit(f"error: {run} ended at step {last['step']}, not {a.steps}")
            losses.append(last["val_loss"])
            recs.append(pretraining_record(run))
            arm_curves.append(curve(run))
        values[arm], curves[arm] = losses, arm_curves
        extra[arm] = {k: [r[k] for r in recs] for k in ("tokens", "training_s")}
        extra[arm]["seconds"] = extra[arm].pop("training_s")
    return values, extra, curves


def averaging(b: Bench, gs: Path) -> tuple[dict, dict]:
    """(e): (c)'s last K checkpoints averaged vs (c)'s last checkpoint, one evaluator; and the
    evaluator's loss on the last checkpoint against the run's own final val_loss (a check)."""
    k = b.args.average_last
    last, avg, check = [], [], []
    for seed in b.args.seed_list:
        run = b.out / "runs" / f"wsd_s{seed}"
        one = b.heldout(f"wsd_last_s{seed}", b.export(f"wsd_last_s{seed}", run), run, gs)
        mean = b.export(f"wsd_avg_s{seed}", run, f"last:{k}")
        last.append(one["val_loss"])
        avg.append(b.heldout(f"wsd_avg_s{seed}", mean, run, gs)["val_loss"])
        check.append(round(one["val_loss"] - last_validation(run)["val_loss"], 6))
    values = {"wsd_last": last, f"wsd_avg_last{k}": avg}
    return values, {"evaluator_minus_run_val_loss": check}


def annealing(b: Bench, gs: Path, ds: Path) -> dict:
    """(f) vs (g) from (b)'s last checkpoint on a general + domain mixture, the same tokens:
    {source: comparison} for the domain and the general validation records."""
    a = b.args
    tokens = round(a.anneal_fraction * a.steps) * a.global_batch_size * MAX_SEQ_LEN
    mixture = [f"general={gs}:1", f"domain={ds}:1"]
    per_source: dict[str, dict[str, list[float] | None]] = {"domain": {}, "general": {}}
    extra: dict[str, dict] = {}
    for arm in ("anneal", ANNEAL_REFERENCE):
        recs = []
        for seed in a.seed_list:
            base = b.out / "runs" / f"constant_s{seed}"
            ckpt = base / "checkpoints" / tag_for(a.steps)
            name = f"{arm}_s{seed}"
            if arm == "anneal":
                run = b.train(
                    name,
                    mixture,
                    None,
                    anneal_from=f"{base}@{a.steps}",
                    anneal_tokens=tokens,
                    seed=seed,
                )
            else:
                steps = tokens // (a.global_batch_size * MAX_SEQ_LEN)
                run = b.train(
                    name,
                    mixture,
                    steps,
                    init_from=ckpt,
                    warmup_steps=max(1, steps // 10),
                    schedule="warmup_decay",
                    decay="linear",
                    seed=seed,
                )
            for src in per_source:
                per_source[src].setdefault(arm, []).append(last_validation(run, src)["val_loss"])
            recs.append(pretraining_record(run))
        extra[arm] = {
            "tokens": [r["tokens"] for r in recs],
            "seconds": [r["training_s"] for r in recs],
        }
    return {
        "anneal_tokens": tokens,
        "from": f"constant_sSEED@{a.steps}",
        **{src: compare(v, ANNEAL_REFERENCE, extra) for src, v in per_source.items()},
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = ArgumentParser(
        prog="python -m experiments.schedules",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--out", type=Path, default=Path("/work/exp/schedules"), help="work folder (resumed)"
    )
    p.add_argument("--steps", type=int, default=600, help="optimizer steps of arms (a)-(d)")
    p.add_argument("--seeds", type=int, default=3, help="seeds per arm (the same for every arm)")
    p.add_argument("--average_last", type=int, default=3, help="K checkpoints averaged in (e)")
    p.add_argument("--anneal_fraction", type=float, default=0.2, help="anneal budget / --steps")
    p.add_argument("--model", default="tiny")
    p.add_argument("--global_batch_size", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-3, help="peak lr of every arm")
    p.add_argument("--vocab", type=int, default=4000, help="WordPiece vocabulary size")
    p.add_argument(
        "--results",
        type=Path,
        default=REPO / "docs/bench/schedules.json",
        help="also write the summary JSON here (not with --quick)",
    )
    p.add_argument(
        "--plot",
        type=Path,
        default=REPO / "docs/bench/schedules.png",
        help="also save the plot here (not with --quick)",
    )
    p.add_argument("--quick", action="store_true", help="a tiny form for the test (1 seed)")
    args = p.parse_args(argv)
    if args.quick:  # the table's shape, not its numbers
        args.steps, args.seeds, args.average_last, args.global_batch_size = 8, 1, 2, 4
        args.results = args.plot = None
        args.vocab, args.max_docs = 1000, 60  # a smaller tokenizer and build: seconds
    if args.steps < 5 or args.seeds < 1 or args.average_last < 1:
        p.error("--steps must be at least 5, --seeds and --average_last at least 1")
    args.max_docs = getattr(args, "max_docs", None)  # all pydoc topics unless --quick
    args.eval_interval = args.steps // 2 if args.quick else args.steps // 10
    if args.average_last * args.eval_interval > args.steps:
        p.error(f"--average_last {args.average_last}: more checkpoints than the run saves")
    args.warmup = max(1, round(0.06 * args.steps))
    args.seed_list = list(range(1, args.seeds + 1))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    b = Bench(args)
    tokens = args.steps * args.global_batch_size * MAX_SEQ_LEN
    print(
        f"plan: arms {', '.join(SCHEDULE_ARMS)} x seeds {args.seed_list}: {args.steps} steps "
        f"({tokens:,} tokens; wsd_batch_warmup fewer), warmup {args.warmup}, validation every "
        f"{args.eval_interval}; wsd_avg: last {args.average_last} checkpoints of wsd; anneal and "
        f"rewarm: {round(args.anneal_fraction * tokens):,} tokens from constant@{args.steps}; "
        f"model {args.model}, batch {args.global_batch_size} x {MAX_SEQ_LEN}, lr {args.lr}",
        flush=True,
    )
    start = time.monotonic()
    gs, ds = b.shards()
    values, extra, curves = schedule_arms(b, gs)
    summary = {
        "plan": {
            "model": args.model,
            "steps": args.steps,
            "global_batch_size": args.global_batch_size,
            "max_seq_len": MAX_SEQ_LEN,
            "lr": args.lr,
            "warmup_steps": args.warmup,
            "seeds": args.seed_list,
        },
        "schedules": compare(values, REFERENCE, extra),
    }
    tables = [markdown("(a)-(d): validation loss at the last step", summary["schedules"])]
    avg, check = averaging(b, gs)
    summary["averaging"] = compare(avg, "wsd_last", {}) | check
    tables.append(
        markdown("(e): averaged checkpoints vs the last (one evaluator)", summary["averaging"])
    )
    gaps = check["evaluator_minus_run_val_loss"]
    tables[-1] += f"\nevaluator minus the run's own val_loss, last checkpoint: {gaps}\n"
    summary["annealing"] = annealing(b, gs, ds)
    for src in ("domain", "general"):
        tables.append(markdown(f"annealing, {src} validation", summary["annealing"][src]))
    summary["seconds"] = round(time.monotonic() - start, 1)  # this launch (done stages skipped)
    summary["command"] = " ".join(
        ["python -m experiments.schedules", *(argv if argv is not None else sys.argv[1:])]
    )
    write_results(b.out / "summary.json", summary, b.out)
    table = "\n".join(tables)
    write_text_atomic(b.out / "summary.md", table)
    drawn = {arm: c for arm, c in curves.items() if c}
    plot(drawn, args.steps, b.out / "schedules.png")
    if args.results:
        write_results(args.results, summary, b.out)
    if args.plot:
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(b.out / "schedules.png", args.plot)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
