"""ModernBERT: our trainer (``--arch modernbert``) vs transformers' ``ModernBertForMaskedLM`` under
HF Trainer, side by side on one CPU; then BERT vs ModernBERT in our trainer at equal wall time.

Both sides: the same shards (CPython's pydoc topics with every 10th paragraph held out before
any shard is built, :mod:`benchmarks.learning.heldout`), one tokenizer, the same initial weights
(one ``ModernBertForMaskedLM`` folder, seeded, loaded by HF and by ours through ``--init_from``),
the same global batch, lr, warm-up, mask rate (30%, as ModernBERT) and precision, 2 ranks x 1
thread. Ours: ``deepspeed --num_gpus 2 pretrain/main.py`` (``ds_configs/cpu.json``, ZeRO-2, our
loader, fused masked-rows loss; ``--attention`` document and/or full). HF:
:mod:`benchmarks.training.modernbert_hf` (``sparse_prediction=True``, SDPA, the collator, fused
AdamW, DDP on gloo).

1. Throughput: at each ``--seq_lens`` the arms alternate (HF first on even repeats, ours first on
   odd ones), ``--repeats`` times: tokens/s over the steps after ``--warmup`` (non-padding input
   tokens), and each rank's peak RSS (VmHWM, polled; ranks summed; loader workers not counted).
   ``--precision auto`` first runs HF once in fp32 and once in bf16 and uses the faster for both.
2. Held-out MLM loss at equal wall time T (``--budget_s``, from the launch command, start-up
   included, save time excluded): HF, ours (ModernBERT) and ours with BERT at about the same
   parameter count (``--bert_preset``), snapshots scored afterwards by the one evaluator
   (:mod:`benchmarks.learning.evaluator`, fp32, the same masked held-out batches).

    python -m benchmarks.training.modernbert --out docs/bench/modernbert_vs_hf.json
    python -m benchmarks.training.modernbert --quick --workdir /tmp/mb   # the test: part 1, tiny
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import (
    CPU_DS_CONFIG,
    build_shards,
    json_precision,
    one_thread_env,
    precision_flags,
    run_ranks_measured,
    vocab_size,
    write_results,
)
from benchmarks.learning.evaluator import build_masked_batches, plot_curves, value_at
from benchmarks.learning.heldout import split_corpus
from benchmarks.learning.per_hour import (
    export_ours,
    launch,
    ours_command,
    ours_snapshots,
    score_all,
)
from benchmarks.learning.per_hour import parse_args as per_hour_args
from benchmarks.training.modernbert_hf import hf_command
from bertforge.pretrain.config import command_line

LEARN_ARMS = ("hf", "ours-modernbert", "ours-bert")  # part 2's arms, in their default order


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.training.modernbert",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--preset", default="modernbert-tiny", help="our ModernBERT preset (shape)")
    p.add_argument("--bert_preset", default="tiny", help="the BERT arm of part 2 (similar size)")
    p.add_argument("--vocab_size", type=int, default=8000, help="WordPiece vocabulary cap")
    p.add_argument("--seq_lens", type=int, nargs="+", default=[512, 1024])
    p.add_argument("--batch_tokens", type=int, default=4096, help="global batch = this / seq")
    p.add_argument("--steps", type=int, default=40, help="optimizer steps per throughput run")
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the timing")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--attention", nargs="+", default=["document", "full"], help="ours' modes")
    p.add_argument(
        "--compile",
        nargs="+",
        default=["off", "on"],
        choices=("off", "on"),
        help="ours eager (off) and/or with --compile (on): part 1's arms; part 2 uses the last",
    )
    p.add_argument(
        "--ds_config", type=Path, default=CPU_DS_CONFIG, help="ours' DeepSpeed JSON (ZeRO stage)"
    )
    p.add_argument(
        "--hf_compile",
        nargs="+",
        default=["off"],
        choices=("off", "on"),
        help="HF eager (off) and/or with TrainingArguments(torch_compile=True): part 1's arms",
    )
    p.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"))
    p.add_argument("--mask_prob", type=float, default=0.3)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--warmup_steps", type=int, default=20, help="lr warm-up, then constant")
    p.add_argument("--budget_s", type=float, default=180.0, help="T of part 2 (0: skip it)")
    p.add_argument("--snapshots", type=int, default=3, help="HF's snapshots at k*T/S")
    p.add_argument("--learn_seq", type=int, default=512, help="sequence length of part 2")
    p.add_argument("--learn_order", nargs="+", default=list(LEARN_ARMS), choices=LEARN_ARMS)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--port", type=int, default=29890)
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--out", type=Path, default=None, help="result JSON (+ .png of part 2)")
    p.add_argument("--quick", action="store_true", help="tiny sizes, one repeat (the test)")
    p.add_argument(
        "--report",
        type=Path,
        nargs="+",
        default=None,
        help="print the tables of result JSONs (several: their part-1 runs pooled)",
    )
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.seq_lens, args.learn_seq, args.batch_tokens = [64], 64, 256
        args.steps, args.warmup, args.repeats, args.attention = 3, 1, 1, ["document"]
        args.compile, args.hf_compile = ["off"], ["off"]
        # part 1 only: part 2 needs T to be long against the ~15 s start-up of each launch
        args.precision, args.budget_s, args.warmup_steps = "fp32", 0.0, 2
    enabled = json_precision(args.ds_config)  # a JSON's own precision is both sides'
    if enabled and args.precision not in ("auto", enabled):
        p.error(f"--ds_config {args.ds_config} enables {enabled}; --precision {args.precision}")
    args.precision = enabled or args.precision
    return args


def prepare(args, work: Path) -> dict:
    """Held-out split, shards at every length with one tokenizer, the held-out batches of part 2,
    and the shared initial ModernBERT weights."""
    import torch

    train_txt, heldout_txt, stats = split_corpus(None, work)
    shards, tokenizer = {}, None
    for seq in sorted({*args.seq_lens, args.learn_seq}):
        vocab = {"tokenizer": tokenizer} if tokenizer else {"vocab_size": args.vocab_size}
        shards[seq] = build_shards(
            train_txt, work / f"shards_{seq}", max_seq_len=seq, validation_fraction=0.01, **vocab
        )
        tokenizer = tokenizer or shards[seq] / "tokenizer"
    batches = build_masked_batches(
        tokenizer, heldout_txt.read_text(encoding="utf-8"), seq_len=args.learn_seq, seed=0
    )
    torch.save(batches, work / "heldout_batches.pt")
    stats["vocab_size"] = vocab_size(shards[args.learn_seq])
    stats["heldout_sequences"] = len(batches["input_ids"])
    init = init_weights(args, tokenizer, work / "init", max(shards))
    return {"shards": shards, "batches": batches, "init": init, "stats": stats}


def init_weights(args, tokenizer: Path, out: Path, max_len: int) -> Path:
    """One seeded ``ModernBertForMaskedLM`` of the preset's shape (the tokenizer's vocabulary,
    unpadded) saved with the tokenizer: both sides start from these weights."""
    import torch
    from transformers import AutoTokenizer, ModernBertForMaskedLM

    from bertforge.pretrain.model.modernbert.adapter import set_tokenizer_ids
    from bertforge.pretrain.model.modernbert.model import modernbert_config
    from bertforge.pretrain.model.registry import preset

    if (out / "config.json").is_file():
        return out
    tok = AutoTokenizer.from_pretrained(str(tokenizer))
    shape = dataclasses.replace(
        preset(args.preset), vocab_multiple=1, max_position_embeddings=max_len
    )
    conf = modernbert_config(shape, len(tok))
    set_tokenizer_ids(conf, tok)
    torch.manual_seed(0)
    ModernBertForMaskedLM(conf).save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out


def ours_train_cmd(
    args,
    shards: Path,
    init: Path,
    run: Path,
    seq: int,
    attention: str,
    script: Path | None = None,
    compile_: bool = False,
) -> list:
    """Our trainer for a throughput run (no saves, no evaluation); ``script``: another entry that
    wraps the trainer (benchmarks.training.step_profile's timers); ``compile_``: --compile."""
    batch = args.batch_tokens // seq
    return command_line.trainer(
        **({"script": script} if script else {}),
        ranks=args.ranks,
        master_port=args.port,
        **precision_flags(args.ds_config, args.precision),
        data=shards,
        arch="modernbert",
        model=args.preset,
        init_from=init,
        attention=attention,
        output_dir=run,
        max_steps=args.steps,
        global_batch_size=batch,
        micro_batch_size=batch // args.ranks,
        lr=args.lr,
        warmup_steps=args.warmup_steps,
        decay="constant",
        mask_prob=args.mask_prob,
        num_workers=1,
        progress=False,
        save_final=False,
        eval_interval=0,
        eval_batches=1,
        compile=compile_,
    )


def run_ours(args, data: dict, seq: int, attention: str, run: Path, compile_: bool) -> dict:
    """One throughput run of ours: tokens/s after the warm-up (metrics.jsonl), peak RSS, the
    attention mode the trainer resolved (its config.json) and the first step's seconds (with
    --compile: the compilation)."""
    from bertforge.pretrain.components.metrics import read_metrics

    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    cmd = ours_train_cmd(
        args, data["shards"][seq], data["init"], run, seq, attention, compile_=compile_
    )
    wall, peaks = run_ranks_measured(cmd, run / "train.log", one_thread_env())
    every = read_metrics(run / "metrics.jsonl")
    recs = every[args.warmup :]
    resolved = json.loads((run / "config.json").read_text())["model_cfg"]["attention"]
    secs = sum(r["step_time_s"] for r in recs)
    return {
        "tokens_per_s": sum(r["tokens"] for r in recs) / secs,
        "steps": len(recs),
        "attention": resolved,
        "peak_rss_bytes": peaks,
        "wall_s": wall,
        "first_step_s": every[0]["step_time_s"],
    }


def run_hf(args, data: dict, seq: int, out: Path, compile_: bool = False) -> dict:
    """One throughput run of HF Trainer (its rank 0 measures tokens/s); ``compile_``:
    TrainingArguments(torch_compile=True)."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    ns = argparse.Namespace(
        **{**vars(args), "global_batch": args.batch_tokens // seq, "hf_compile": compile_}
    )
    cmd = hf_command(
        data["shards"][seq], data["init"], out, ns, steps=args.steps, warmup=args.warmup
    )
    wall, peaks = run_ranks_measured(cmd, out / "train.log", one_thread_env())
    result = json.loads((out / "result.json").read_text())
    return {**result, "attention": "full (packed, sdpa)", "peak_rss_bytes": peaks, "wall_s": wall}


def choose_precision(args, data: dict, work: Path) -> dict:
    """--precision auto: HF once in fp32 and once in bf16 at the first length; the faster one
    is used by both sides."""
    if args.precision != "auto":
        return {"chosen": args.precision, "probe": None}
    probe = {}
    for precision in ("fp32", "bf16"):
        args.precision = precision
        probe[precision] = run_hf(args, data, args.seq_lens[0], work / f"probe_{precision}")
        print(f"precision probe: HF {precision} {probe[precision]['tokens_per_s']:,.0f} tokens/s")
    args.precision = max(probe, key=lambda k: probe[k]["tokens_per_s"])
    return {"chosen": args.precision, "probe": {k: v["tokens_per_s"] for k, v in probe.items()}}


def throughput(args, data: dict, work: Path) -> list[dict]:
    """Every run of part 1, arms alternating within each repeat; one record per run."""
    hf = ["hf" + ("-compiled" if c == "on" else "") for c in args.hf_compile]
    ours = [
        f"ours-{mode}" + ("-compiled" if c == "on" else "")
        for mode in args.attention
        for c in args.compile
    ]
    arms = hf + ours
    runs = []
    for seq in args.seq_lens:
        for rep in range(args.repeats):
            order = arms if rep % 2 == 0 else arms[::-1]
            for arm in order:
                folder = work / "throughput" / f"{arm}_{seq}_{rep}"
                load = os.getloadavg()[0]
                compiled = arm.endswith("-compiled")
                if arm.startswith("hf"):
                    rec = run_hf(args, data, seq, folder, compiled)
                else:
                    mode = arm.removeprefix("ours-").removesuffix("-compiled")
                    rec = run_ours(args, data, seq, mode, folder, compiled)
                rec.update(arm=arm, seq=seq, repeat=rep, load_before=round(load, 2))
                runs.append(rec)
                print(
                    f"seq {seq} repeat {rep} {arm:23s} {rec['tokens_per_s']:8,.0f} tokens/s, "
                    f"peak RSS {sum(rec['peak_rss_bytes']) / 2**20:6.0f} MiB "
                    f"({len(rec['peak_rss_bytes'])} ranks), load {load:.1f}",
                    flush=True,
                )
    return runs


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def throughput_summary(runs: list[dict]) -> list[dict]:
    """Per (seq, arm): tokens/s and summed peak RSS as median [min, max], ratios to HF's median,
    and the median [min, max] of the per-repeat ratios to HF's run of the same repeat."""
    rows = []
    for seq in dict.fromkeys(r["seq"] for r in runs):
        hf = None
        for arm in dict.fromkeys(r["arm"] for r in runs):
            mine = [r for r in runs if r["seq"] == seq and r["arm"] == arm]
            row = {
                "seq": seq,
                "arm": arm,
                "attention": mine[0]["attention"],
                "runs": len(mine),
                "tokens_per_s": spread([r["tokens_per_s"] for r in mine]),
                "peak_rss_mib": spread([sum(r["peak_rss_bytes"]) / 2**20 for r in mine]),
                "ranks_seen": [len(r["peak_rss_bytes"]) for r in mine],
            }
            hf = hf or row
            row["tokens_per_s_vs_hf"] = row["tokens_per_s"]["median"] / hf["tokens_per_s"]["median"]
            row["peak_rss_vs_hf"] = row["peak_rss_mib"]["median"] / hf["peak_rss_mib"]["median"]
            # each repeat's runs are neighbours in time: their ratio cancels slow load drifts
            row["paired_vs_hf"] = spread(
                [
                    r["tokens_per_s"] / h["tokens_per_s"]
                    for r in mine
                    for h in runs
                    if h["seq"] == seq and h["arm"] == hf["arm"] and h["repeat"] == r["repeat"]
                ]
            )
            rows.append(row)
    return rows


def parameters(model_dir: str) -> int:
    """Distinct parameters of an HF folder (a tied decoder counted once)."""
    from transformers import AutoModelForMaskedLM

    return sum(p.numel() for p in AutoModelForMaskedLM.from_pretrained(model_dir).parameters())


def train_for_budget(args, data: dict, work: Path, arm: str) -> list[dict]:
    """One arm of part 2 trained for T from its launch command: its snapshots (HF folders)."""
    shards = data["shards"][args.learn_seq]
    # per_hour's command builders read its flags: its defaults under ours, so a flag it gains
    # cannot break part 2 (dropout: each model's own). init_model None: per_hour's from-scratch
    # mode (ours-modernbert takes the shared seeded folder through --init_from in ours_args, HF
    # through --init), no step-0 snapshot
    base = {
        **vars(per_hour_args([])),
        **vars(args),
        "global_batch": args.batch_tokens // args.learn_seq,
        "ours_args": "",
        "init_model": None,
    }
    out = work / "learn" / arm
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)  # its log goes there, whichever arm runs first
    launched = time.time()
    if arm == "hf":
        ns = argparse.Namespace(**base)
        cmd = hf_command(
            shards,
            data["init"],
            out,
            ns,
            budget_s=args.budget_s,
            snapshots=args.snapshots,
            launched=launched,
        )
        out.mkdir(parents=True)
        launch(cmd, ns, work / "learn" / "hf.log")
        return json.loads((out / "snapshots.json").read_text())
    if arm == "ours-modernbert":  # the shared initial weights, as HF
        model = args.preset
        extra = f"--arch modernbert --init_from {data['init']}"
        extra += f" --max_position_embeddings {max(data['shards'])}"
    else:
        model, extra = args.bert_preset, ""
    if args.compile[-1] == "on":
        extra += " --compile true"
    ns = argparse.Namespace(
        **{**base, "model": model, "ours_args": f"{extra} --mask_prob {args.mask_prob}"}
    )
    env = {"BERTFORGE_LAUNCHED_AT": repr(launched)}
    launch(ours_command(shards, out, ns), ns, work / "learn" / f"{arm}.log", env)
    records = ours_snapshots(out, launched)
    export_ours(records, out, work / "learn" / f"{arm}_hf")
    return records


def learning(args, data: dict, work: Path) -> dict:
    """Part 2: HF, ours (ModernBERT) and ours (BERT) each for T of wall time, one after the other
    in ``--learn_order``, then scored by the one evaluator."""
    sides, loads = {}, {}
    for arm in args.learn_order:
        loads[arm] = os.getloadavg()[0]
        sides[arm] = train_for_budget(args, data, work, arm)
    score_all(sides, data["batches"])
    rows = []
    for arm, recs in sides.items():
        curve = [(r["time_s"], r["loss"]) for r in recs]
        rows.append(
            {
                "arm": arm,
                "parameters": parameters(recs[-1]["model"]),
                "load_before": round(loads[arm], 2),
                "loss_at_half": value_at(curve, args.budget_s / 2),
                "loss_at_end": recs[-1]["loss"],
                "time_at_end": recs[-1]["time_s"],
                "steps_at_end": recs[-1]["step"],
            }
        )
    return {"order": list(args.learn_order), "sides": sides, "rows": rows}


def pooled(paths: list[Path]) -> dict:
    """The first result with its part-1 summary recomputed from the runs of every result (the
    repeats of later files numbered after the earlier ones, so pairs stay within one file)."""
    results = [json.loads(Path(p).read_text()) for p in paths]
    runs, offset = [], 0
    for res in results:
        runs += [{**r, "repeat": r["repeat"] + offset} for r in res["throughput_runs"]]
        offset += 1 + max(r["repeat"] for r in res["throughput_runs"])
    return {**results[0], "throughput": throughput_summary(runs)}


def fmt(s: dict, digits: int = 0) -> str:
    return f"{s['median']:,.{digits}f} [{s['min']:,.{digits}f}, {s['max']:,.{digits}f}]"


def print_tables(result: dict) -> None:
    """The two markdown tables docs/benchmarks.md keeps."""
    print(
        "| seq | arm | attention | runs | tokens/s median [min, max] | vs HF "
        "| per-repeat ratio [min, max] | peak RSS MiB, ranks summed | vs HF |"
    )
    print("|---:|---|---|---:|---|---:|---|---|---:|")
    for r in result["throughput"]:
        print(
            f"| {r['seq']} | {r['arm']} | {r['attention']} | {r['runs']} "
            f"| {fmt(r['tokens_per_s'])} | {r['tokens_per_s_vs_hf']:.2f}x "
            f"| {fmt(r['paired_vs_hf'], 2)} "
            f"| {fmt(r['peak_rss_mib'])} | {r['peak_rss_vs_hf']:.2f}x |"
        )
    if not result.get("learning"):
        return
    print()
    print("| arm | parameters | load at launch | held-out loss at T/2 | at T (s, steps) |")
    print("|---|---:|---:|---:|---|")
    for r in result["learning"]["rows"]:
        half = "-" if r["loss_at_half"] is None else f"{r['loss_at_half']:.3f}"
        print(
            f"| {r['arm']} | {r['parameters']:,} | {r['load_before']} | {half} | "
            f"{r['loss_at_end']:.3f} ({r['time_at_end']:.0f} s, {r['steps_at_end']}) |"
        )


def main(argv: list[str] | None = None) -> int:
    """Prepare, measure throughput and memory, then the equal-wall-time losses; write JSON."""
    args = parse_args(argv)
    if args.report:
        print_tables(pooled(args.report))
        return 0
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench_modernbert_"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    data = prepare(args, work)
    print(f"data: {json.dumps(data['stats'])}; work folder {work}", flush=True)
    precision = choose_precision(args, data, work)
    print(f"precision: {precision}", flush=True)
    runs = throughput(args, data, work)
    result = {
        "started": started,
        "finished": None,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "data": data["stats"],
        "precision": precision,
        "throughput": throughput_summary(runs),
        "throughput_runs": runs,
    }
    if args.budget_s > 0:
        result["learning"] = learning(args, data, work)
    result["finished"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    out = args.out or work / "modernbert.json"
    write_results(out, result, run=work, indent=1)
    if result.get("learning"):
        curves = {
            a: [(r["time_s"], r["loss"]) for r in recs]
            for a, recs in result["learning"]["sides"].items()
        }
        title = f"{args.preset} (ours, HF) and {args.bert_preset} (BERT, ours)"
        title += f", seq {args.learn_seq}, {args.precision}, T={args.budget_s:.0f} s"
        plot_curves(curves, title, out.with_suffix(".png"))
    print_tables(result)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
