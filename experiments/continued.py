"""Continued pretraining vs from scratch, and mean-of-pieces vs random rows for new tokens (CPU).

    nice -n 5 python -m experiments.continued [--quick] [--base HF_DIR] [--out DIR]
        [--plot docs/bench/bench_continued.png] [--results docs/bench/bench_continued.json]

What it runs (each step a subprocess of the project's own commands, logs in OUT/logs/):
1. general corpus: the pydoc topic pages (the demo's); domain corpus: the docstrings of the
   email, http and urllib packages (data_prep/domain_text.py);
2. base model: the demo's recipe (WordPiece vocabulary of 4000 trained on the general corpus,
   tiny model, --base_steps steps), exported with `pretrain.export`; or `--base HF_DIR`;
3. `data_prep extend-tokenizer` on the domain text with TERMS (tokens per character before and
   after), then domain shards with the extended tokenizer and `--protected_terms`;
4. a copy of the base folder whose new vocabulary rows are random (normal(0,
   initializer_range), MLM bias 0: how a freshly initialised model starts them) and whose
   tokenizer is the extended one, so plain `--init_from` copies every row as it is;
5. three arms on the same domain shards, with the same flags, seed, data order and masks
   (`--whole_word --mask_prob 0.2`, linear decay): `scratch` (--model of the base, random
   weights), `continued` (--init_from base: new rows = mean of their pieces), `random_rows`
   (--init_from the folder of 4). Each arm's loss before training is the final validation of a
   one-step run at lr 0 (the weights stay as loaded).

Reported: validation MLM loss against wall-clock time (`elapsed_s` of the validation records of
metrics.jsonl) and step; the time and step at which each arm first reaches the loss `scratch`
has at its end; the validation loss of `continued` and `random_rows` at equal steps; and, for
every arm at step 0 and at the end, the loss on validation positions whose label is a new token
id: each arm's checkpoints exported (`pretrain.export`), one evaluator
(`AutoModelForMaskedLM`, eval mode) on the same fixed masks for every model (`--mask_passes`
passes over the validation split with the runs' masking settings, masking seeds seed..seed+N-1;
pass 0 is the trainer's own validation masks). The
processes run one at a time with one thread each; wall-clock numbers depend on what else the
machine runs.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import time
from pathlib import Path

from benchmarks.common import CPU_DS_CONFIG, REPO, write_results
from bertforge.data_prep.domain_text import DEFAULT_PACKAGES, write_domain_text
from bertforge.data_prep.sample_corpus import write_english_corpus
from bertforge.files import write_bytes_atomic, write_text_atomic
from bertforge.logs import get_logger
from bertforge.pretrain.config import command_line
from bertforge.pretrain.demo import run_step
from experiments.new_tokens import ARMS, new_token_eval, random_rows_folder

# __spec__.name, not __name__: run with `python -m`, this module's __name__ is "__main__"
log = get_logger(__spec__.name)

# Whole domain terms for extend-tokenizer and for whole-word masking (the README recipe's list).
TERMS = (
    "charset",
    "multipart",
    "payload",
    "MIME",
    "Content-Type",
    "Content-Transfer-Encoding",
    "quoted-printable",
    "base64",
    "RFC 2822",
    "boundary",
    "cookie",
    "urlopen",
    "HTTPConnection",
)
PATH_ARGS = ("out", "base", "plot", "results")  # recorded as paths (made portable), not str
ARCH_FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
)


class Bench:
    """Paths and the subprocess runner of one benchmark run."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.out = args, Path(args.out).absolute()
        self.logs, self.n = self.out / "logs", 0

    def step(self, name: str, cmd: list[str]) -> float:
        """Run one command (log in OUT/logs/); its wall-clock seconds."""
        self.n += 1
        secs = run_step(name, [str(c) for c in cmd], self.logs / f"{self.n:02d}_{name}.log")
        log.info(f"{name}: {secs:.0f} s")
        return secs

    def train(self, name: str, shards: Path, run: Path, steps: int, lr: float, **extra) -> None:
        """One single-process CPU run of pretrain/main.py (`extra`: more trainer flags)."""
        a = self.args
        self.step(
            name,
            command_line.trainer(
                ds_config=CPU_DS_CONFIG,
                data=shards,
                output_dir=run,
                max_steps=steps,
                global_batch_size=a.global_batch_size,
                micro_batch_size=a.global_batch_size,
                lr=lr,
                warmup_steps=max(1, steps // 10),
                decay="linear",
                eval_interval=a.eval_interval,
                log_interval=10,
                progress=False,
                num_workers=0,
                seed=1234,
                **extra,
            ),
        )


def base_model(b: Bench, general: Path) -> Path:
    """The demo's recipe, single process: shards, --base_steps of the tiny model, export."""
    a, py = b.args, sys.executable
    shards, run, hf = b.out / "general_shards", b.out / "base_run", b.out / "base_hf"
    b.step(
        "general_shards",
        command_line.data_prep_build(
            general, shards, vocab_size=4000, max_seq_len=128, validation_fraction=0.05, workers=1
        ),
    )
    b.train("base_train", shards, run, a.base_steps, 2e-3, model=a.model)
    b.step("base_export", [py, "-m", "bertforge.pretrain.export", run, "--output", hf])
    return hf


def domain_shards(b: Bench, base: Path, domain: Path) -> tuple[Path, dict]:
    """Extended tokenizer (report) and the domain shards built with it."""
    py, terms = sys.executable, b.out / "terms.txt"
    write_text_atomic(terms, "".join(t + "\n" for t in TERMS))
    ext, shards = b.out / "ext_tokenizer", b.out / "domain_shards"
    extend = {"tokenizer": base, "input": domain, "terms": terms, "max_new": b.args.max_new}
    b.step(
        "extend_tokenizer",
        [
            *(py, "-m", "bertforge.data_prep", "extend-tokenizer"),
            *command_line.flags({**extend, "output": ext}, switches=True),
        ],
    )
    b.step(
        "domain_shards",
        command_line.data_prep_build(
            domain,
            shards,
            tokenizer=ext,
            protected_terms=terms,
            max_seq_len=128,
            validation_fraction=0.1,
            workers=1,
        ),
    )
    report = json.loads((ext / "extension_report.json").read_text())
    return shards, report


def run_arms(b: Bench, shards: Path, base: Path, random_base: Path) -> dict[str, dict]:
    """The three arms, each after its lr-0 one-step run (the loss before training)."""
    a = b.args
    model = json.loads((base / "config.json").read_text())
    init = {
        "scratch": {f: model[f] for f in ARCH_FIELDS},  # the base's size, random weights
        "continued": {"init_from": base},
        "random_rows": {"init_from": random_base},
    }
    common = {"whole_word": True, "mask_prob": 0.2}  # final checkpoints: exported below
    results = {}
    for arm in ARMS:
        start = b.out / "runs" / f"{arm}_step0"
        b.train(f"{arm}_step0", shards, start, 1, 0.0, **init[arm], **common)
        run = b.out / "runs" / arm
        b.train(arm, shards, run, a.steps, a.lr, **init[arm], **common)
        results[arm] = arm_curve(start, run)
    return results


def _metrics(run: Path, split: str) -> list[dict]:
    from bertforge.pretrain.components.metrics import read_metrics

    return read_metrics(run / "metrics.jsonl", split)


def arm_curve(start: Path, run: Path) -> dict:
    """(step, elapsed_s, val_loss) points: step 0 at time 0 from the lr-0 run, then the run's.
    A validation after step s is placed at the `elapsed_s` of step s's record (validation
    records carry no time; each validation's own time shows in the steps after it)."""
    first = _metrics(start, "validation")[-1]["val_loss"]
    val = _metrics(run, "validation")
    elapsed = {r["step"]: r["elapsed_s"] for r in _metrics(run, "train")}
    return {
        "step": [0] + [r["step"] for r in val],
        "elapsed_s": [0.0] + [round(elapsed[r["step"]], 2) for r in val],
        "val_loss": [round(first, 4)] + [round(r["val_loss"], 4) for r in val],
        "val_accuracy": [None] + [round(r["val_accuracy"], 4) for r in val],
    }


def time_to_reach(curve: dict, target: float) -> dict | None:
    """The first validation point at or below `target` (step, seconds), None if never."""
    for step, secs, loss in zip(curve["step"], curve["elapsed_s"], curve["val_loss"]):
        if loss <= target:
            return {"step": step, "elapsed_s": secs, "val_loss": loss}
    return None


def summarise(arms: dict[str, dict], ext_report: dict, new_tok: dict) -> dict:
    """The numbers docs/benchmarks.md reports."""
    target = arms["scratch"]["val_loss"][-1]
    c, r = arms["continued"], arms["random_rows"]
    return {
        "target_val_loss": target,
        "time_to_scratch_final_loss": {arm: time_to_reach(arms[arm], target) for arm in ARMS},
        "mean_vs_random_at_equal_steps": [
            {"step": s, "mean_of_pieces": lc, "random": lr}
            for s, lc, lr in zip(c["step"], c["val_loss"], r["val_loss"])
        ],
        "tokens_per_char": {
            "before": ext_report["before"]["tokens_per_char"],
            "after": ext_report["after"]["tokens_per_char"],
        },
        "unk_rate": {
            "before": ext_report["before"]["unk_rate"],
            "after": ext_report["after"]["unk_rate"],
        },
        "new_tokens": len(ext_report["new_tokens"]),
        "vocab": [ext_report["base_vocab_size"], ext_report["new_vocab_size"]],
        "new_token_loss": {
            arm: {when: new_tok[arm][when]["new_token_loss"] for when in ("step0", "final")}
            for arm in ARMS
        },
        "new_token_positions": new_tok["continued"]["final"]["new_positions"],
        "new_token_occurrences_in_validation": new_tok["new_token_occurrences_in_validation"],
    }


def plot(arms: dict[str, dict], new_tok: dict, path: Path, title: str) -> None:
    """Validation loss against wall-clock time (left) and against step (middle); the loss on
    new-token positions at step 0 and at the end (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    style = {
        "scratch": ("from scratch", "tab:gray", "o"),
        "continued": ("continued, new rows = mean of pieces", "tab:blue", "s"),
        "random_rows": ("continued, new rows random", "tab:red", "^"),
    }
    fig, (ax_t, ax_s, ax_n) = plt.subplots(1, 3, figsize=(15, 4.2))
    for arm, curve in arms.items():
        label, color, marker = style[arm]
        ax_t.plot(
            curve["elapsed_s"], curve["val_loss"], marker=marker, ms=3, color=color, label=label
        )
        ax_s.plot(curve["step"], curve["val_loss"], marker=marker, ms=3, color=color, label=label)
    target = arms["scratch"]["val_loss"][-1]
    for ax, xlabel in (
        (ax_t, "wall-clock seconds (the trainer's elapsed_s)"),
        (ax_s, "optimizer step"),
    ):
        ax.axhline(target, color="tab:gray", ls=":", lw=1)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("validation MLM loss (domain text)")
        ax.grid(alpha=0.3)
    ax_s.legend()
    for i, arm in enumerate(ARMS):
        label, color, _ = style[arm]
        losses = [new_tok[arm][when]["new_token_loss"] for when in ("step0", "final")]
        bars = ax_n.bar([i - 0.2, i + 0.2], losses, width=0.38, color=color)
        bars[0].set_alpha(0.45)
        ax_n.bar_label(bars, fmt="%.2f", fontsize=8)
    ax_n.set_xticks(range(len(ARMS)), ["scratch", "mean of pieces", "random rows"])
    ax_n.set_ylabel("validation loss on new-token positions")
    n = new_tok["continued"]["final"]["new_positions"]
    ax_n.set_title(f"light: step 0, dark: end; {n} masked new-token positions", fontsize=9)
    ax_n.grid(alpha=0.3, axis="y")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    plt.close(fig)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, png.getbuffer())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m experiments.continued",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    p.add_argument("--out", default=str(REPO / "bench_out" / "continued"), help="work folder")
    p.add_argument("--base", type=Path, help="base HF folder (default: train one, as the demo)")
    p.add_argument("--model", default="tiny", help="preset of the base model it trains")
    p.add_argument("--base_steps", type=int, default=600, help="steps of the base model")
    p.add_argument("--steps", type=int, default=300, help="steps of each domain arm")
    p.add_argument("--eval_interval", type=int, default=25, help="validate every N steps")
    p.add_argument("--lr", type=float, default=1e-3, help="peak lr of every domain arm")
    p.add_argument("--global_batch_size", type=int, default=32, help="sequences per step")
    p.add_argument("--max_new", type=int, default=200, help="extend-tokenizer --max_new")
    p.add_argument(
        "--mask_passes", type=int, default=10, help="fixed-mask passes for the new-token loss"
    )
    p.add_argument("--quick", action="store_true", help="a few steps of everything (a smoke run)")
    p.add_argument("--plot", type=Path, help="PNG path (default: OUT/bench_continued.png)")
    p.add_argument("--results", type=Path, help="JSON path (default: OUT/results.json)")
    args = p.parse_args(argv)
    if args.quick:
        args.base_steps, args.steps, args.eval_interval = 20, 10, 5
    return args


def main(argv: list[str] | None = None) -> int:
    """Run everything; print and write the results."""
    args = parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    b, t0 = Bench(args), time.monotonic()
    shutil.rmtree(b.out, ignore_errors=True)
    b.out.mkdir(parents=True)
    general, domain = b.out / "pydoc_topics.txt", b.out / "domain.txt"
    write_english_corpus(general)
    info = write_domain_text(DEFAULT_PACKAGES, domain)
    base = args.base.absolute() if args.base else base_model(b, general)
    shards, ext_report = domain_shards(b, base, domain)
    random_base = random_rows_folder(base, b.out / "ext_tokenizer", b.out / "random_rows_hf")
    arms = run_arms(b, shards, base, random_base)
    new_tok = new_token_eval(b, shards, ext_report)
    summary = summarise(arms, ext_report, new_tok)
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "args": {k: v if k in PATH_ARGS else str(v) for k, v in vars(args).items()},
        "domain_text": info,
        "summary": summary,
        "arms": arms,
        "new_token_eval": new_tok,
        "seconds": round(time.monotonic() - t0, 1),
    }
    write_results(args.results or b.out / "results.json", result, run=b.out)
    plot(
        arms,
        new_tok,
        args.plot or b.out / "bench_continued.png",
        f"tiny BERT on {info['characters'] // 1000} K characters of email/http/urllib "
        f"docstrings, {args.steps} steps, whole-word masking at 0.2",
    )
    print(json.dumps(summary, indent=1))
    log.info(f"done in {result['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
