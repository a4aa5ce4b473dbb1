"""Continued pretraining vs from scratch, and mean-of-pieces vs random rows for new tokens (CPU).

    nice -n 5 python benchmarks/bench_continued.py [--quick] [--base HF_DIR] [--out DIR]
        [--plot docs/bench/bench_continued.png] [--results docs/bench/bench_continued.json]

What it runs (each step a subprocess of the project's own commands, logs in OUT/logs/):
1. general corpus: the pydoc topic pages (the demo's); domain corpus: the docstrings of the
   email, http and urllib packages (benchmarks/domain_text.py);
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
import json
import os
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from domain_text import DEFAULT_PACKAGES, write_domain_text  # noqa: E402

from bertforge.files import write_json_atomic  # noqa: E402
from pretrain.demo import run_step, write_corpus  # noqa: E402

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
ARMS = ("scratch", "continued", "random_rows")
PATH_ARGS = ("out", "base", "plot", "results")  # recorded repository-relative where inside it
VOCAB_KEYS = (  # tensors with one row (or entry) per vocabulary token in an exported folder
    "bert.embeddings.word_embeddings.weight",
    "cls.predictions.decoder.weight",
)
BIAS_KEYS = ("cls.predictions.bias", "cls.predictions.decoder.bias")
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
        print(f"[bench] {name}: {secs:.0f} s", flush=True)
        return secs

    def train(self, name: str, shards: Path, run: Path, steps: int, lr: float, extra: list) -> None:
        """One single-process CPU run of pretrain/main.py."""
        a = self.args
        self.step(
            name,
            [
                sys.executable,
                REPO / "pretrain" / "main.py",
                "--ds_config",
                REPO / "ds_configs" / "cpu.json",
                "--data",
                shards,
                "--output_dir",
                run,
                "--max_steps",
                steps,
                "--global_batch_size",
                a.global_batch_size,
                "--micro_batch_size",
                a.global_batch_size,
                "--lr",
                lr,
                "--warmup_steps",
                max(1, steps // 10),
                "--decay",
                "linear",
                "--eval_interval",
                a.eval_interval,
                "--log_interval",
                10,
                "--progress",
                "false",
                "--num_workers",
                0,
                "--seed",
                1234,
                *extra,
            ],
        )


def base_model(b: Bench, general: Path) -> Path:
    """The demo's recipe, single process: shards, --base_steps of the tiny model, export."""
    a, py = b.args, sys.executable
    shards, run, hf = b.out / "general_shards", b.out / "base_run", b.out / "base_hf"
    b.step(
        "general_shards",
        [
            py,
            "-m",
            "data_prep",
            "build",
            "--input",
            general,
            "--output",
            shards,
            "--vocab_size",
            4000,
            "--max_seq_len",
            128,
            "--validation_fraction",
            0.05,
            "--workers",
            1,
        ],
    )
    b.train("base_train", shards, run, a.base_steps, 2e-3, ["--model", a.model])
    b.step("base_export", [py, "-m", "pretrain.export", run, "--output", hf])
    return hf


def domain_shards(b: Bench, base: Path, domain: Path) -> tuple[Path, dict]:
    """Extended tokenizer (report) and the domain shards built with it."""
    py, terms = sys.executable, b.out / "terms.txt"
    terms.write_text("".join(t + "\n" for t in TERMS), encoding="utf-8")
    ext, shards = b.out / "ext_tokenizer", b.out / "domain_shards"
    b.step(
        "extend_tokenizer",
        [
            py,
            "-m",
            "data_prep",
            "extend-tokenizer",
            "--tokenizer",
            base,
            "--input",
            domain,
            "--terms",
            terms,
            "--max_new",
            b.args.max_new,
            "--output",
            ext,
        ],
    )
    b.step(
        "domain_shards",
        [
            py,
            "-m",
            "data_prep",
            "build",
            "--input",
            domain,
            "--output",
            shards,
            "--tokenizer",
            ext,
            "--protected_terms",
            terms,
            "--max_seq_len",
            128,
            "--validation_fraction",
            0.1,
            "--workers",
            1,
        ],
    )
    report = json.loads((ext / "extension_report.json").read_text())
    return shards, report


def random_rows_folder(base: Path, ext_tokenizer: Path, out: Path, seed: int = 0) -> Path:
    """`base` with one row per extended-tokenizer entry: old rows as they are, new rows random
    (normal(0, initializer_range); MLM bias 0), and the extended tokenizer."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    config = json.loads((base / "config.json").read_text())
    sd = load_file(str(base / "model.safetensors"))
    tok = AutoTokenizer.from_pretrained(str(ext_tokenizer))
    old, new = config["vocab_size"], len(tok)
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randn(new - old, config["hidden_size"], generator=gen)
    rows = rows * config.get("initializer_range", 0.02)
    for key in VOCAB_KEYS:
        if key in sd:
            sd[key] = torch.cat([sd[key], rows.to(sd[key].dtype)]).contiguous()
    for key in BIAS_KEYS:
        if key in sd:
            sd[key] = torch.cat([sd[key], torch.zeros(new - old, dtype=sd[key].dtype)])
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps({**config, "vocab_size": new}, indent=2))
    tok.save_pretrained(str(out))
    return out


def run_arms(b: Bench, shards: Path, base: Path, random_base: Path) -> dict[str, dict]:
    """The three arms, each after its lr-0 one-step run (the loss before training)."""
    a = b.args
    model = json.loads((base / "config.json").read_text())
    arch = [x for f in ARCH_FIELDS for x in (f"--{f}", model[f])]  # the base's size, random
    init = {
        "scratch": arch,
        "continued": ["--init_from", base],
        "random_rows": ["--init_from", random_base],
    }
    common = ["--whole_word", "--mask_prob", 0.2]  # final checkpoints: exported for new_token_loss
    results = {}
    for arm in ARMS:
        start = b.out / "runs" / f"{arm}_step0"
        b.train(f"{arm}_step0", shards, start, 1, 0.0, [*init[arm], *common])
        run = b.out / "runs" / arm
        b.train(arm, shards, run, a.steps, a.lr, [*init[arm], *common])
        results[arm] = arm_curve(start, run)
    return results


def export_arms(b: Bench) -> dict[str, dict[str, Path]]:
    """HF folders of every arm's lr-0 run (step 0) and final checkpoint (`pretrain.export`)."""
    from pretrain.export.hf_export import export

    folders: dict[str, dict[str, Path]] = {}
    for arm in ARMS:
        for when, run in (("step0", f"{arm}_step0"), ("final", arm)):
            out = b.out / "hf" / run
            export(b.out / "runs" / run, out, verify=False)
            folders.setdefault(arm, {})[when] = out
    return folders


def validation_batches(shards: Path, run: Path, passes: int, micro_batch_size: int) -> list:
    """`passes` fixed-mask passes over the validation split with the run's masking settings
    (config.json); pass k uses masking seed run_seed + k, so pass 0 has the trainer's masks."""
    from data_prep.reader import ShardReader
    from pretrain.data.loader import DataConfig, build_loader
    from pretrain.data.masking import MaskingConfig

    masking = json.loads((run / "config.json").read_text())["masking"]
    reader = ShardReader(shards, "validation")
    batches = []
    for k in range(passes):
        cfg = MaskingConfig(**{**masking, "seed": masking["seed"] + k})
        loader = build_loader(
            reader,
            DataConfig(num_workers=0),
            cfg,
            micro_batch_size=micro_batch_size,
            train=False,
        )
        for batch in loader:
            batches.append(
                (
                    k,
                    {
                        key: batch[key]
                        for key in ("input_ids", "attention_mask", "token_type_ids", "labels")
                    },
                )
            )
    return batches


def new_token_loss(folder: Path, batches: list, new_ids: list[int]) -> dict:
    """Cross-entropy of one HF model summed over masked positions whose label is a new id (and,
    as a check against the trainer's val_loss, over all masked positions of pass 0)."""
    import torch
    from transformers import AutoModelForMaskedLM

    from kernels import IGNORE_INDEX

    model = AutoModelForMaskedLM.from_pretrained(str(folder)).eval()
    new = torch.tensor(sorted(new_ids))
    new_sum, new_n, all_sum, all_n = 0.0, 0, 0.0, 0
    per_pass: dict[int, list[float]] = {}  # pass -> [loss sum, positions]: the spread over masks
    with torch.no_grad():
        for k, batch in batches:
            labels = batch["labels"]
            logits = model(**{n: t for n, t in batch.items() if n != "labels"}).logits
            ce = torch.nn.functional.cross_entropy(
                logits.transpose(1, 2).double(),
                labels,
                ignore_index=IGNORE_INDEX,
                reduction="none",
            )
            is_new = torch.isin(labels, new)
            new_sum, new_n = new_sum + float(ce[is_new].sum()), new_n + int(is_new.sum())
            acc = per_pass.setdefault(k, [0.0, 0])
            acc[0], acc[1] = acc[0] + float(ce[is_new].sum()), acc[1] + int(is_new.sum())
            if k == 0:
                seen = labels != IGNORE_INDEX
                all_sum, all_n = all_sum + float(ce[seen].sum()), all_n + int(seen.sum())
    return {
        "new_token_loss": round(new_sum / max(new_n, 1), 4),
        "new_positions": new_n,
        "per_pass": [round(t / max(n, 1), 4) for t, n in per_pass.values()],
        "pass0_val_loss": round(all_sum / max(all_n, 1), 4),
        "pass0_masked": all_n,
    }


def new_token_eval(b: Bench, shards: Path, ext_report: dict) -> dict:
    """Loss on new-token positions of every arm at step 0 and at the end, one evaluator, the
    same masks for every model; plus how many distinct new-token occurrences the split has."""
    import numpy as np

    from data_prep.reader import ShardReader

    new_ids = [t["id"] for t in ext_report["new_tokens"]]
    folders = export_arms(b)
    batches = validation_batches(
        shards, b.out / "runs" / "continued", b.args.mask_passes, b.args.global_batch_size
    )
    reader = ShardReader(shards, "validation")
    occurrences = sum(int(np.isin(reader[i].input_ids, new_ids).sum()) for i in range(len(reader)))
    result = {
        "mask_passes": b.args.mask_passes,
        "new_token_occurrences_in_validation": occurrences,
    }
    for arm, by_when in folders.items():
        result[arm] = {when: new_token_loss(f, batches, new_ids) for when, f in by_when.items()}
        print(f"[bench] new-token loss {arm}: {result[arm]}", flush=True)
    return result


def _metrics(run: Path, split: str) -> list[dict]:
    from pretrain.components.metrics import read_metrics

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


def relative(value: object) -> str | None:
    """A path inside the repository as a repository-relative string; others as given."""
    if value is None:
        return None
    try:
        return str(Path(str(value)).absolute().relative_to(REPO))
    except ValueError:
        return str(value)


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
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
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
    write_corpus(general)
    info = write_domain_text(DEFAULT_PACKAGES, domain)
    base = args.base.absolute() if args.base else base_model(b, general)
    shards, ext_report = domain_shards(b, base, domain)
    random_base = random_rows_folder(base, b.out / "ext_tokenizer", b.out / "random_rows_hf")
    arms = run_arms(b, shards, base, random_base)
    new_tok = new_token_eval(b, shards, ext_report)
    summary = summarise(arms, ext_report, new_tok)
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "args": {k: relative(v) if k in PATH_ARGS else str(v) for k, v in vars(args).items()},
        "domain_text": {**info, "output": relative(info["output"])},
        "summary": summary,
        "arms": arms,
        "new_token_eval": new_tok,
        "seconds": round(time.monotonic() - t0, 1),
    }
    write_json_atomic(args.results or b.out / "results.json", result)
    plot(
        arms,
        new_tok,
        args.plot or b.out / "bench_continued.png",
        f"tiny BERT on {info['characters'] // 1000} K characters of email/http/urllib "
        f"docstrings, {args.steps} steps, whole-word masking at 0.2",
    )
    print(json.dumps(summary, indent=1))
    print(f"[bench] done in {result['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
