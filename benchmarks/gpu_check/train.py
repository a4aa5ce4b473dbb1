"""The training parts of the GPU check: throughput of the real trainer
(pretrain/main.py, one GPU, ZeRO-2), the HF baseline beside it, and a save + exact resume.

Each part function takes (plan, out, result, deadline), fills result.rows / details / status and
may raise (gpu_check records the exception as the part's error).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.gpu_check.common import (
    PartResult,
    Plan,
    engine_flags,
    part_file,
    run_logged,
    run_name,
    save_part,
    seconds_left,
    shards_dir,
)
from bertforge.pretrain.config import command_line


def train_steps(plan: Plan, config: tuple[str, int, str]) -> tuple[int, int]:
    """(max_steps, save_interval): the resume part's run also saves after the measured steps."""
    measured = plan.warmup_steps + plan.measured_steps
    if config == plan.resume_config:
        return measured + plan.resume_steps, measured
    return measured, 0


def trainer_cmd(
    plan: Plan,
    out: Path,
    run_dir: Path,
    config: tuple[str, int, str],
    resume: bool = False,
    **flags,
) -> list[str]:
    """The real trainer, one process (one GPU), ZeRO-2, no gradient accumulation (`flags`: more
    of the trainer's flags, e.g. ``arch="modernbert"``)."""
    model, seq, precision = config
    max_steps, save_interval = train_steps(plan, config)
    cmd = command_line.trainer(
        **engine_flags(plan, precision),
        data=shards_dir(out, seq),
        model=model,
        output_dir=run_dir,
        max_steps=max_steps,
        global_batch_size=plan.micro_batch[seq],
        micro_batch_size=plan.micro_batch[seq],
        lr="1e-4",
        warmup_steps=plan.warmup_steps,
        save_interval=save_interval,
        keep_last=2,
        save_final=False,
        progress=False,
        eval_interval=0,
        eval_batches=1,
        num_workers=2,
        **flags,
    )
    if plan.dry_run:  # CPUs without bf16 train in fp32; the code path is the same
        cmd.append("--allow_precision_fallback")
    if resume:
        cmd += ["--resume", "auto"]
    return cmd


def throughput_row(plan: Plan, run_dir: Path, config: tuple[str, int, str]) -> dict:
    """Rates over the measured steps (after the warm-up): sums of tokens / sums of step times."""
    from bertforge.pretrain.components.metrics import device_peak_tflops, read_metrics

    model, seq, _ = config
    first, last = plan.warmup_steps + 1, plan.warmup_steps + plan.measured_steps
    recs = [r for r in read_metrics(run_dir / "metrics.jsonl") if first <= r["step"] <= last]
    if len(recs) < plan.measured_steps:
        raise RuntimeError(f"{run_dir}/metrics.jsonl has {len(recs)} of steps {first}..{last}")
    secs = sum(r["step_time_s"] for r in recs)
    tflops = sum(r.get("tflops", 0.0) * r["step_time_s"] for r in recs) / secs
    peak = device_peak_tflops("bf16")  # MFU against the dense bf16 peak, for fp16 runs too
    mem = [r.get("mem_peak_gib", r.get("mem_rss_gib")) for r in recs]
    resolved = json.loads((run_dir / "config.json").read_text()).get("precision_resolved")
    return {
        "run": run_name(*config),
        "model": model,
        "seq": seq,
        "precision": resolved,
        "micro_batch": plan.micro_batch[seq],
        "steps": len(recs),
        "tokens/s": round(sum(r["tokens"] for r in recs) / secs),
        "seq/s": round(sum(r["samples"] for r in recs) / secs, 1),
        "TFLOP/s": float(f"{tflops:.3g}"),  # 3 significant figures: a CPU dry run is ~1e-3
        "MFU": None if not peak else round(tflops / peak, 3),
        "peak mem GiB": None if None in mem else round(max(mem), 2),
        "skipped steps": sum(bool(r.get("skipped")) for r in recs),
        "loss": round(recs[-1]["loss"], 4),
    }


def part_train(plan: Plan, out: Path, res: PartResult, deadline: float) -> None:
    """Each configuration of the matrix in turn (:func:`run_matrix`)."""
    run_matrix(plan, out, res, deadline, "train", plan.train_matrix)


def run_matrix(
    plan: Plan,
    out: Path,
    res: PartResult,
    deadline: float,
    part: str,
    configs: tuple[tuple[str, int, str], ...],
    extra_row: Callable[[Path], dict] | None = None,
    **flags,
) -> None:
    """Train each configuration in turn into OUT/PART/NAME (`flags`: more trainer flags) and
    fill a throughput row each (`extra_row(run_dir)` adds columns); a run that fails or runs out
    of time is a row that says so, and the next one still runs while time is left."""
    failed = []
    per_run = plan.boxes[part][0] / 2  # no single run may eat the whole part
    for config in configs:
        name = run_name(*config)
        run_dir = out / part / name
        shutil.rmtree(run_dir, ignore_errors=True)
        timeout = min(per_run, seconds_left(deadline) - 2)
        if timeout < 10:
            res.rows.append({"run": name, "status": "not run: part's time box spent"})
            continue
        log = f"logs/{part}.{name}.log"
        try:
            cmd = trainer_cmd(plan, out, run_dir, config, **flags)
            rc = run_logged(cmd, out / log, timeout)
            row = (
                {
                    **throughput_row(plan, run_dir, config),
                    **(extra_row(run_dir) if extra_row else {}),
                }
                if rc == 0
                else {"run": name, "status": f"failed: trainer exit {rc} ({log})"}
            )
        except subprocess.TimeoutExpired:
            row = {"run": name, "status": f"timed out after {timeout:.0f} s"}
        except (OSError, RuntimeError, KeyError, ValueError) as exc:
            row = {"run": name, "status": f"failed: {type(exc).__name__}: {exc}"}
        row.setdefault("status", "ok")
        failed += [name] if row["status"] != "ok" else []
        res.rows.append(row)
        save_part(out, res)
    res.status = "failed" if failed else "ok"
    res.error = f"runs not measured: {', '.join(failed)}" if failed else ""


def hf_model(preset: str, vocab_size: int):
    """transformers' BertForMaskedLM at our preset's size, SDPA attention."""
    from transformers import BertConfig, BertForMaskedLM

    from bertforge.pretrain.model.registry import PRESETS

    p = PRESETS[preset]
    conf = BertConfig(
        vocab_size=vocab_size,
        hidden_size=p.hidden_size,
        num_hidden_layers=p.num_hidden_layers,
        num_attention_heads=p.num_attention_heads,
        intermediate_size=p.intermediate_size,
        max_position_embeddings=p.max_position_embeddings,
        attn_implementation="sdpa",
    )
    return BertForMaskedLM(conf)


def hf_throughput(shards: Path, preset: str, micro: int, warmup: int, steps: int) -> dict:
    """A careful user's loop: DataCollatorForLanguageModeling in 2 loader workers, bf16 autocast,
    SDPA, fused AdamW (lr 1e-4, clipping 1.0 as ours); tokens = non-padding input tokens."""
    import torch
    from transformers import AutoTokenizer, DataCollatorForLanguageModeling

    from bertforge.data_prep.reader import ShardReader
    from bertforge.pretrain.components.metrics import memory_stats

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    reader = ShardReader(shards, "train")
    tok = AutoTokenizer.from_pretrained(str(reader.tokenizer_path))
    data = [{"input_ids": reader[i].input_ids.tolist()} for i in range(len(reader))]
    torch.manual_seed(0)
    model = hf_model(preset, len(tok)).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    collator = DataCollatorForLanguageModeling(tok, mlm_probability=0.15, pad_to_multiple_of=8)
    loader = torch.utils.data.DataLoader(
        data,
        batch_size=micro,
        shuffle=True,
        drop_last=True,
        collate_fn=collator,
        num_workers=2,
        persistent_workers=True,
        pin_memory=dev.type == "cuda",
    )
    batches, tokens, samples, done, t0 = _endless(loader), 0, 0, 0, 0.0
    while done < warmup + steps:
        if done == warmup:
            _sync(dev)
            t0, tokens, samples = time.perf_counter(), 0, 0
        batch = next(batches)
        tokens += int(batch["attention_mask"].sum())
        samples += batch["input_ids"].shape[0]
        batch = {k: v.to(dev, non_blocking=True) for k, v in batch.items()}
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        done += 1
    _sync(dev)
    secs = time.perf_counter() - t0
    mem = memory_stats()
    return {
        "run": f"hf-{preset}",
        "attention": model.config._attn_implementation,
        "micro_batch": micro,
        "steps": steps,
        "tokens/s": round(tokens / secs),
        "seq/s": round(samples / secs, 1),
        "peak mem GiB": round(mem.get("mem_peak_gib", mem.get("mem_rss_gib", 0.0)), 2),
        "loss": round(float(loss), 4),
    }


def _endless(loader):
    while True:
        yield from loader


def _sync(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize()


def part_hf_baseline(plan: Plan, out: Path, res: PartResult, deadline: float) -> None:
    """HF on the BERT-base seq-128 batch, beside our bf16 run of the same size from `train`."""
    preset, seq = plan.hf_config
    row = hf_throughput(
        shards_dir(out, seq), preset, plan.micro_batch[seq], plan.warmup_steps, plan.measured_steps
    )
    row["run"] = f"hf-{preset}-{seq}-bf16-autocast"
    res.rows.append(row)
    ours_file = part_file(out, "train")
    if ours_file.is_file():
        ours = next(
            (
                r
                for r in json.loads(ours_file.read_text())["rows"]
                if r.get("run") == run_name(preset, seq, "bf16") and r["status"] == "ok"
            ),
            None,
        )
        if ours:
            res.rows.insert(
                0,
                {
                    k: ours[k]
                    for k in (
                        "run",
                        "micro_batch",
                        "steps",
                        "tokens/s",
                        "seq/s",
                        "peak mem GiB",
                        "loss",
                    )
                },
            )
            res.details["ours_over_hf_tokens_per_s"] = round(ours["tokens/s"] / row["tokens/s"], 2)
    res.status = "ok"


def part_resume(plan: Plan, out: Path, res: PartResult, deadline: float) -> None:
    """Copy the resume configuration's run (checkpoint after the measured steps), resume it with
    --resume auto, and compare every later step's loss with the uninterrupted run's."""
    from bertforge.pretrain.components.metrics import read_metrics
    from bertforge.pretrain.run_folder.run_checkpoints import list_complete

    src = out / "train" / run_name(*plan.resume_config)
    saved_at = plan.warmup_steps + plan.measured_steps
    if not (src / "metrics.jsonl").is_file() or saved_at not in dict(
        list_complete(src / "checkpoints")
    ):
        raise RuntimeError(
            f"needs the train part's run {src} with its checkpoint at step {saved_at}"
        )
    dst = out / "resume" / "run"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    log = out / "logs" / "resume.train.log"
    rc = run_logged(
        trainer_cmd(plan, out, dst, plan.resume_config, resume=True),
        log,
        seconds_left(deadline) - 2,
    )
    if rc != 0:
        raise RuntimeError(f"resumed trainer exit {rc} (logs/resume.train.log)")
    resumed_from = f"at step {saved_at} " in log.read_text(errors="replace")
    ref = {r["step"]: r["loss"] for r in read_metrics(src / "metrics.jsonl")}
    got = {r["step"]: r["loss"] for r in read_metrics(dst / "metrics.jsonl")}
    after = range(saved_at + 1, saved_at + plan.resume_steps + 1)
    for step in after:
        res.rows.append(
            {
                "step": step,
                "uninterrupted loss": ref.get(step),
                "resumed loss": got.get(step),
                "abs diff": None
                if step not in got or step not in ref
                else abs(got[step] - ref[step]),
            }
        )
    diffs = [r["abs diff"] for r in res.rows]
    # The first step after the checkpoint must be bit-identical (same weights, data, masks and
    # RNG); later steps on a GPU may differ in the last bits where backward kernels use atomics.
    first_exact = diffs[0] == 0.0
    tol = 0.0 if plan.dry_run else 1e-2 * max(abs(ref[s]) for s in after)
    res.details.update(
        {
            "resumed_from_step": saved_at,
            "log_says_resumed": resumed_from,
            "first_step_bit_identical": first_exact,
            "tolerance_later_steps": tol,
        }
    )
    ok = resumed_from and first_exact and None not in diffs and max(diffs) <= tol
    res.status = "ok" if ok else "failed"
    res.error = "" if ok else "resumed losses differ from the uninterrupted run (see rows)"
