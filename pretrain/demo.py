"""The main job end to end on text that ships with CPython (no download, no GPU):

    bertforge demo --output_dir runs/demo    (what `make demo` runs)

1. corpus: the pydoc topic pages of this Python (`pydoc_data.topics`, ~460 KB of English prose);
2. shards: `bertforge prep build` trains a WordPiece vocabulary and writes packed shards;
3. doctor: `bertforge doctor` checks versions, data, batch sizes, memory and disk;
4. train: the DeepSpeed launcher starts two local ranks (ZeRO-2, ds_configs/cpu.json) and trains
   the tiny model for half the steps, then stops with a checkpoint;
5. resume: a second launch with `--resume auto` continues to the last step (the learning rate is
   constant after warmup, so two launches give the same schedule as one);
6. export: `bertforge export` writes a Hugging Face folder (validation ran at the end of
   each launch and every --eval_interval steps);
7. fill-mask: transformers' pipeline on a few sentences, predictions printed;
8. plot: `bertforge plot` draws the loss curves to PNG.

Each step is a subprocess with its log in OUTPUT/logs/; a failure stops the demo with the failing
command and the end of its log.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bertforge.cli import command_parser
from bertforge.data_prep.reader import ShardReader
from bertforge.data_prep.sample_corpus import pydoc_documents, write_english_corpus
from bertforge.errors import USER_ERROR_EXIT, UserError
from bertforge.files import write_json_atomic
from bertforge.logs import get_logger, quiet_libraries, quiet_transformers, report
from bertforge.pretrain.config import command_line
from bertforge.pretrain.distributed.startup import free_port
from bertforge.pretrain.run_folder.layout import RunFolder

log = get_logger(__name__)

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "demo.yaml"  # the run's settings; the demo's flags override them
MARKER = "demo.json"  # written into the output folder: marks it as ours (safe to redo)
SENTENCES = (
    "The {mask} statement causes the current function to return a value.",
    "An {mask} is raised when an error is detected during execution.",
    "The body of the {mask} loop is executed while the condition is true.",
    "Strings are immutable sequences of {mask} code points.",
    "A class definition creates a new {mask} object.",
)


class DemoError(UserError):
    """An output folder or model folder the demo cannot use (the message says what to do)."""


class StepFailed(RuntimeError):
    """A demo step exited non-zero; the message has the command and the end of its log."""


def write_corpus(path: Path) -> tuple[int, int]:
    """The English sample corpus (the pydoc topics) into `path`; returns (documents, bytes)."""
    write_english_corpus(path)
    return len(pydoc_documents()), path.stat().st_size


def run_step(name: str, cmd: list[str], log: Path, stream: bool = False) -> float:
    """Run `cmd` from the repository root with its output in `log` (and on screen if `stream`:
    the trainer writes plain progress lines into a pipe); raise StepFailed with the log's tail on
    failure."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONUNBUFFERED": "1",
    }
    t0 = time.monotonic()
    with open(log, "wb") as f:
        f.write(f"$ {shlex.join(cmd)}\n".encode())
        f.flush()
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        assert proc.stdout is not None
        for chunk in iter(lambda: proc.stdout.read1(4096), b""):
            f.write(chunk)
            if stream:
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
        rc = proc.wait()
    if rc != 0:
        tail = log.read_text(errors="replace").splitlines()[-40:]
        raise StepFailed(
            f"step '{name}' failed (exit {rc}):\n  {shlex.join(cmd)}\n"
            f"log: {log}\n--- last lines ---\n" + "\n".join(tail)
        )
    return time.monotonic() - t0


def train_command(
    args: argparse.Namespace, shards: Path, run: Path, max_steps: int, resume: str, port: int
) -> list[str]:
    """The DeepSpeed launcher on `args.ranks` local ranks (`deepspeed --num_gpus N ...`) running
    recipes/demo.yaml; the demo's own flags (whose defaults are the recipe's values) override it."""
    return command_line.trainer(
        ranks=args.ranks,
        master_addr="127.0.0.1",
        master_port=port,
        recipe=RECIPE,
        ds_config=args.ds_config,
        data=shards,
        model=args.model,
        output_dir=run,
        max_steps=max_steps,
        resume=resume,
        global_batch_size=args.global_batch_size,
        micro_batch_size=args.global_batch_size // args.ranks,
        lr=args.lr,
        warmup_steps=args.warmup_steps,
        eval_interval=args.eval_interval,
    )


def read_sentences(path: Path) -> list[str]:
    """Fill-mask sentences from a file: one per line, each with one ``[MASK]`` (the model's own
    mask token replaces it); blank lines and lines starting with ``#`` are skipped."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise DemoError(f"--sentences {path}: cannot read it ({e})") from None
    sentences = []
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.count("[MASK]") != 1:
            raise DemoError(
                f"--sentences {path}, line {number}: write exactly one [MASK] in each sentence "
                f"(found {line.count('[MASK]')}): {line!r}"
            )
        sentences.append(line.replace("[MASK]", "{mask}"))
    if not sentences:
        raise DemoError(f"--sentences {path}: no sentence in it (one per line, with [MASK])")
    return sentences


def fill_mask(
    hf_dir: Path, out: Path | None = None, sentences: tuple[str, ...] = SENTENCES, top_k: int = 3
) -> list[dict]:
    """Top-k predictions of the exported model for ``sentences`` ({mask} where the mask goes;
    transformers' fill-mask pipeline)."""
    if not (Path(hf_dir) / "config.json").is_file():
        what = "no such folder" if not Path(hf_dir).exists() else "no config.json in it"
        raise DemoError(
            f"--fill_mask {hf_dir}: {what}, so no exported model there. Export one first: "
            f"`bertforge export RUN --output {hf_dir}` (RUN: a training run's "
            "--output_dir)."
        )
    # Imports inside functions here: transformers, torch (through pretrain.data and
    # components.metrics) and tokenizers, used after the steps have run in their own processes; the
    # demo's own process stays light until then.
    from transformers import pipeline

    fill = pipeline("fill-mask", model=str(hf_dir), tokenizer=str(hf_dir), device="cpu")
    results = []
    for s in sentences:
        text = s.replace("{mask}", fill.tokenizer.mask_token)
        preds = fill(text, top_k=top_k)
        results.append(
            {
                "sentence": text,
                "predictions": [
                    {"token": p["token_str"], "score": round(float(p["score"]), 4)} for p in preds
                ],
            }
        )
    report(
        f"  {r['sentence']}\n      -> "
        + ", ".join(f"{p['token']!r} {p['score']:.2f}" for p in r["predictions"])
        for r in results
    )
    if out:
        write_json_atomic(out, results)
    return results


def frequent_token_guess(shards: Path, masking: dict) -> dict:
    """The accuracy on the validation split's masked tokens of always guessing the token that is
    masked most often in the training split, under the run's masking: the score a model that
    learned only token frequencies gets, to read the trained model's accuracy against."""
    # Lazy: torch (see fill_mask).
    from bertforge.pretrain.data.loader import DataConfig, build_loader
    from bertforge.pretrain.data.masking import IGNORE_INDEX, MaskingConfig

    cfg = MaskingConfig(**masking)
    loader_cfg = DataConfig(num_workers=0)

    def labels(split: str) -> np.ndarray:
        reader = ShardReader(shards, split=split)
        batches = build_loader(reader, loader_cfg, cfg, micro_batch_size=256, train=False)
        return np.concatenate([b["labels"][b["labels"] != IGNORE_INDEX].numpy() for b in batches])

    train = labels("train")
    top = int(np.bincount(train).argmax())
    val = labels("validation")
    # Lazy: tokenizers (see fill_mask).
    from tokenizers import Tokenizer

    token = Tokenizer.from_file(str(shards / "tokenizer" / "tokenizer.json")).id_to_token(top)
    return {"token": token, "accuracy": float((val == top).mean()), "masked_tokens": len(val)}


def prepare_output(out: Path) -> None:
    """Start clean in a folder this demo made before; refuse anyone else's non-empty folder."""
    if out.exists() and any(out.iterdir()):
        if not (out / MARKER).is_file():
            raise DemoError(
                f"--output_dir {out} exists, is not empty and was not made by "
                "the demo: choose another folder (or delete it)"
            )
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / MARKER, {"status": "running", "started": time.time()})


def demo_paths(out: Path) -> dict[str, Path]:
    """Where each step writes, under the demo's output folder."""
    return {
        "corpus": out / "corpus" / "pydoc_topics.txt",
        "shards": out / "shards",
        "run": out / "run",
        "hf": out / "hf_model",
        "plots": out / "plots",
        "fill_mask": out / "fill_mask.json",
        "logs": out / "logs",
    }


def demo_steps(args: argparse.Namespace, paths: dict[str, Path]) -> list[tuple[str, list, bool]]:
    """The command table: (name, command, stream its output?) for each step, in order."""
    half = args.steps // 2
    py = sys.executable
    return [
        (
            "shards",
            command_line.data_prep_build(
                paths["corpus"],
                paths["shards"],
                vocab_size=args.vocab_size,
                max_seq_len=128,
                validation_fraction=0.05,
                workers=args.ranks,
            ),
            False,
        ),
        (
            "doctor",
            [
                *(py, "-m", "bertforge.pretrain.doctor"),
                *command_line.flags(
                    {
                        "ds_config": args.ds_config,
                        "data": paths["shards"],
                        "slots": args.ranks,
                        "model": args.model,
                        "output_dir": paths["run"],
                        "global_batch_size": args.global_batch_size,
                        "micro_batch_size": args.global_batch_size // args.ranks,
                    },
                    switches=False,
                ),
            ],
            False,
        ),
        (
            f"train steps 1-{half}",
            train_command(args, paths["shards"], paths["run"], half, "none", free_port()),
            True,
        ),
        (
            f"resume steps {half + 1}-{args.steps}",
            train_command(args, paths["shards"], paths["run"], args.steps, "auto", free_port()),
            True,
        ),
        (
            "export",
            [
                py,
                "-m",
                "bertforge.pretrain.export",
                str(paths["run"]),
                "--output",
                str(paths["hf"]),
            ],
            False,
        ),
        (
            "fill-mask",
            [py, "-m", "bertforge.pretrain.demo", "--fill_mask", str(paths["hf"])]
            + ["--fill_mask_out", str(paths["fill_mask"])],
            True,
        ),
        (
            "plot",
            [py, "-m", "bertforge.pretrain.plot", str(RunFolder(paths["run"]).metrics)]
            + ["--out", str(paths["plots"])],
            False,
        ),
    ]


def run_demo(args: argparse.Namespace) -> dict:
    """All steps; returns the summary that is also written to OUTPUT/demo.json."""
    # Lazy: components.metrics imports torch (see fill_mask).
    from bertforge.pretrain.components.metrics import read_metrics

    out = Path(args.output_dir).absolute()
    paths = demo_paths(out)
    steps = demo_steps(args, paths)
    if args.plan:
        report(f"# {name}\n{shlex.join(cmd)}" for name, cmd, _ in steps)
        return {}
    prepare_output(out)
    t_start = time.monotonic()
    docs, size = write_corpus(paths["corpus"])
    log.info(f"demo corpus: {docs} pydoc topic pages, {size / 1e3:.0f} KB -> {paths['corpus']}")
    timings = {}
    for i, (name, cmd, stream) in enumerate(steps, 1):
        step_log = paths["logs"] / f"{i:02d}_{name.split()[0]}.log"
        log.info(f"demo step {i}/{len(steps)}: {name}  (log: {step_log})")
        timings[name] = round(run_step(name, cmd, step_log, stream), 1)
        log.info(f"demo step {i} done in {timings[name]:.0f} s")
    val = read_metrics(RunFolder(paths["run"]).metrics, "validation")
    summary = {
        "status": "done",
        "seconds": round(time.monotonic() - t_start, 1),
        "timings_s": timings,
        "validation": [
            {k: r.get(k) for k in ("step", "val_loss", "val_accuracy", "val_perplexity")}
            for r in val
        ],
        "frequent_token_guess": frequent_token_guess(
            paths["shards"], json.loads(RunFolder(paths["run"]).config.read_text())["masking"]
        ),
        "paths": {k: str(v) for k, v in paths.items()},
        "plots": sorted(str(p) for p in paths["plots"].glob("*.png")),
        "commands": {name: shlex.join(cmd) for name, cmd, _ in steps},
    }
    write_json_atomic(out / MARKER, summary)
    return summary


def summary_lines(s: dict) -> list[str]:
    """Where everything went, and how well the model did: the report that ends the demo."""
    p = s["paths"]
    out = [f"\n[demo] finished in {s['seconds']:.0f} s. Validation (masked-LM):"]
    out += [
        f"  step {v['step']:>4}: loss {v['val_loss']:.3f}  accuracy {v['val_accuracy']:.3f}"
        f"  perplexity {v['val_perplexity']:.1f}"
        for v in s["validation"]
    ]
    guess, last = s["frequent_token_guess"], s["validation"][-1]
    out += [
        f"[demo] learned: the model predicts {last['val_accuracy']:.1%} of the masked tokens;"
        f" always guessing the most frequent one ({guess['token']!r}) gets"
        f" {guess['accuracy']:.1%}",
        "  (a 1M-parameter model on 460 KB of text: fill-mask gets some words right and"
        " guesses frequent tokens elsewhere; more --steps keep lowering the loss)",
        "[demo] outputs:",
    ]
    for label, key in (
        ("corpus", "corpus"),
        ("shards + tokenizer", "shards"),
        ("run (checkpoints, metrics.jsonl, tensorboard)", "run"),
        ("Hugging Face model", "hf"),
        ("fill-mask predictions", "fill_mask"),
        ("step logs", "logs"),
    ):
        out.append(f"  {label:<46} {p[key]}")
    out += [f"  {'plot: ' + Path(png).stem.replace('_', ' '):<46} {png}" for png in s["plots"]]
    return [*out, f"  {'summary':<46} {Path(p['run']).parent / MARKER}"]


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("bertforge demo", __doc__)
    p.add_argument("--output_dir", default="runs/demo", help="where everything goes")
    p.add_argument(
        "--steps", type=int, default=1200, help="optimizer steps in total (stop at half)"
    )
    p.add_argument("--ranks", type=int, default=2, help="local DeepSpeed ranks")
    p.add_argument("--model", default="tiny", help="model preset")
    p.add_argument(
        "--ds_config",
        type=Path,
        default=REPO / "ds_configs" / "cpu.json",
        help="DeepSpeed config (ZeRO-2 on CPU)",
    )
    p.add_argument("--global_batch_size", type=int, default=32, help="sequences per step")
    p.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    p.add_argument("--warmup_steps", type=int, default=30, help="linear warmup, then constant lr")
    p.add_argument("--eval_interval", type=int, default=200, help="validate every N steps")
    p.add_argument("--vocab_size", type=int, default=4000, help="WordPiece vocabulary to train")
    p.add_argument("--plan", action="store_true", help="print the step commands and exit")
    p.add_argument(
        "--fill_mask",
        type=Path,
        metavar="HF_DIR",
        help="only run the fill-mask step on an exported folder",
    )
    p.add_argument(
        "--sentences",
        type=Path,
        metavar="FILE",
        help="with --fill_mask: your sentences, one per line with one [MASK] (default: the demo's)",
    )
    p.add_argument("--top_k", type=int, default=3, help="with --fill_mask: predictions shown")
    p.add_argument("--fill_mask_out", type=Path, help=argparse.SUPPRESS)
    return p


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Clear errors before anything runs."""
    if args.steps < 2:
        p.error(f"--steps must be at least 2 (it stops at half and resumes), got {args.steps}")
    if args.ranks < 1 or args.global_batch_size % args.ranks:
        p.error(
            f"--global_batch_size {args.global_batch_size} must be a multiple of --ranks "
            f"{args.ranks}"
        )
    if not args.ds_config.is_file():
        p.error(f"--ds_config {args.ds_config}: no such file (run from a clone of the repository)")


def main(argv: list[str] | None = None) -> int:
    """Run the demo (or one of its helper steps); 0 on success, 1 when a step failed, 2 on
    bad input."""
    p = build_parser()
    args = p.parse_args(argv)
    try:
        if args.fill_mask:
            quiet_libraries()
            quiet_transformers()
            sentences = read_sentences(args.sentences) if args.sentences else SENTENCES
            fill_mask(args.fill_mask, args.fill_mask_out, tuple(sentences), args.top_k)
            return 0
        if args.sentences:
            p.error("--sentences goes with --fill_mask HF_DIR")
        check_args(p, args)
        summary = run_demo(args)
    except UserError as e:
        log.error(str(e))
        return USER_ERROR_EXIT
    except StepFailed as e:
        log.error(str(e))
        return 1
    if summary:
        report(summary_lines(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
