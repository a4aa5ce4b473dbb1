"""The GPU check's budget part (issue 52): the standard BERT recipe and ``recipes/budget.yaml``
each given the same wall-clock budget (``--max_time_hours``; 10 minutes each on a GPU, a few
seconds in the dry run) on a BERT-base-shaped model at 128 tokens, bf16, one GPU: tokens trained,
optimizer steps, held-out masked-LM loss at 15% masking (``--eval_mask_prob 0.15``, the same
masks for both), tokens/s and MFU over the whole budget (start-up included, as the budget
counts it) and over the training steps alone.

The text is the data part's pydoc shards (about 0.1 M tokens): at GPU rates ten minutes are
hundreds of epochs of it, so the held-out loss measures memorisation as much as learning, and
dropout (which the standard recipe keeps) counts for more than it would on a real corpus; the
tokens and MFU are the numbers that carry over. The CPU measurement on a 3 M-token corpus is
``python -m experiments.budget`` (docs/benchmarks.md).
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.common import REPO
from benchmarks.gpu_check.common import (
    PartResult,
    Plan,
    engine_flags,
    run_logged,
    save_part,
    seconds_left,
    shards_dir,
)
from bertforge.pretrain.config import command_line

RECIPE = REPO / "recipes" / "budget.yaml"
# The standard BERT recipe (Devlin et al. 2019) laid over the budget: lr 1e-4, 1% warmup and a
# linear decay ending with the budget, 15% masking, dropout 0.1, batch 256.
STANDARD = {
    "lr": "1e-4",
    "schedule": "warmup_decay",
    "decay": "linear",
    "schedule_clock": "time",
    "warmup_ratio": "0.01",
    "mask_prob": "0.15",
    "hidden_dropout_prob": "0.1",
    "attention_probs_dropout_prob": "0.1",
}


def arm_flags(plan: Plan, arm: str) -> dict:
    """The flags of one arm besides the shared ones. On the GPU the recipe's own batches (4,096
    ramped from 512; the standard's 256) at the GPU's micro-batch; in the dry run a fraction."""
    micro = plan.micro_batch[plan.seq_lens[0]]
    if arm == "standard":
        batch = micro * 2 if plan.dry_run else 256
        return {**STANDARD, "global_batch_size": batch, "micro_batch_size": micro}
    flags = {"recipe": RECIPE, "micro_batch_size": micro}
    if plan.dry_run:  # tiny: a ramp micro -> 4 micro
        flags.update(global_batch_size=4 * micro, batch_ramp_start=micro)
    return flags


def budget_row(arm: str, run_dir: Path, budget_s: float) -> dict:
    """Tokens, steps, held-out loss and rates of one finished arm."""
    from bertforge.pretrain.components.metrics import device_peak_tflops, read_metrics

    train = read_metrics(run_dir / "metrics.jsonl")
    vals = read_metrics(run_dir / "metrics.jsonl", "validation")
    tokens = sum(r["tokens"] for r in train)
    secs = sum(r["step_time_s"] for r in train)
    tflops = sum(r.get("tflops", 0.0) * r["step_time_s"] for r in train) / secs if secs else 0.0
    peak = device_peak_tflops("bf16")
    elapsed = train[-1]["elapsed_s"]
    return {
        "arm": arm,
        "budget s": round(budget_s, 1),
        "steps": train[-1]["step"],
        "tokens": int(tokens),
        "held-out loss @15%": round(vals[-1]["val_loss"], 4) if vals else None,
        "tokens/s (budget)": round(tokens / elapsed),
        "tokens/s (steps)": round(tokens / secs) if secs else None,
        "MFU (steps)": None if not peak else round(tflops / peak, 3),
        "MFU (budget)": None if not peak else round(tflops * secs / elapsed / peak, 3),
        "last global batch": train[-1].get("global_batch", train[-1]["samples"]),
    }


def part_budget(plan: Plan, out: Path, res: PartResult, deadline: float) -> None:
    """Both arms in turn, each ended by the same budget; a row each, and the budget recipe's
    held-out loss and tokens beside the standard's."""
    model = plan.train_matrix[0][0] if plan.dry_run else "base"
    seq = plan.seq_lens[0]
    for arm in ("standard", "budget"):
        run_dir = out / "budget" / arm
        cmd = command_line.trainer(
            **engine_flags(plan, "bf16"),
            data=shards_dir(out, seq),
            model=model,
            output_dir=run_dir,
            max_time_hours=plan.budget_arm_s / 3600.0,
            max_steps=100_000_000,
            eval_mask_prob=0.15,
            eval_interval=0,
            eval_batches=4,
            save_interval_minutes=0,
            save_final=False,
            progress=False,
            num_workers=2,
            **arm_flags(plan, arm),
        )
        if plan.dry_run:  # CPUs without bf16 train in fp32; the code path is the same
            cmd.append("--allow_precision_fallback")
        log = out / "logs" / f"budget.{arm}.log"
        rc = run_logged(cmd, log, max(10.0, seconds_left(deadline) - 5))
        if rc != 0:
            res.status, res.error = "failed", f"{arm}: trainer exit {rc} (logs/budget.{arm}.log)"
            return
        res.rows.append(budget_row(arm, run_dir, plan.budget_arm_s))
        save_part(out, res)
    std, bud = res.rows
    if std["held-out loss @15%"] is not None and bud["held-out loss @15%"] is not None:
        res.details["budget - standard held-out loss"] = round(
            bud["held-out loss @15%"] - std["held-out loss @15%"], 4
        )
    res.details["budget / standard tokens"] = round(bud["tokens"] / max(std["tokens"], 1), 3)
    res.status = "ok"
