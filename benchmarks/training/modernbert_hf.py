"""The HF side of ``benchmarks.training.modernbert``: transformers' ``ModernBertForMaskedLM`` under
``transformers.Trainer`` as its best users configure it (``sparse_prediction=True``, SDPA,
``DataCollatorForLanguageModeling``, torch's fused AdamW, one persistent loader worker, bf16
autocast with ``--precision bf16``, DDP on gloo), one rank's body under ``torchrun``.

Two modes: ``--steps N`` (throughput: a step clock, rank 0 writes tokens/s over the steps after
``--warmup``) or ``--budget_s T`` (learning: the wall-clock snapshot callback of
:mod:`benchmarks.learning.hf_side`, which saves the model at k*T/S and stops at T).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from benchmarks.learning.hf_side import hf_training_args, snapshot_clock
from bertforge.files import write_json_atomic


def hf_command(shards: Path, init: Path, out: Path, args, **mode) -> list[str]:
    """``torchrun --nproc_per_node R -m benchmarks.training.modernbert_hf ...``; `mode`:
    ``steps=N, warmup=W`` or ``budget_s=T, snapshots=S, launched=UNIX``."""
    extra = [x for k, v in mode.items() for x in (f"--{k}", repr(v) if k == "launched" else str(v))]
    return [
        *(sys.executable, "-m", "torch.distributed.run"),
        *("--nproc_per_node", str(args.ranks), "--master_port", str(args.port + 1)),
        *("-m", "benchmarks.training.modernbert_hf"),
        *("--shards", str(shards), "--init", str(init), "--hf_out", str(out)),
        *("--precision", args.precision, "--global_batch", str(args.global_batch)),
        *("--lr", str(args.lr), "--warmup_steps", str(args.warmup_steps)),
        *("--mask_prob", str(args.mask_prob)),
        *(["--torch_compile"] if getattr(args, "hf_compile", False) else []),
        *extra,
    ]


def load_model(init: Path):
    """The shared initial weights as ``ModernBertForMaskedLM``, sparse prediction and SDPA on."""
    import torch
    from transformers import ModernBertForMaskedLM

    model = ModernBertForMaskedLM.from_pretrained(
        str(init), attn_implementation="sdpa", sparse_prediction=True, dtype=torch.float32
    )
    assert model.config._attn_implementation == "sdpa", model.config._attn_implementation
    assert model.sparse_prediction
    return model


def step_clock(times: list[float]):
    """A TrainerCallback that notes the time at the end of every optimizer step."""
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def on_step_end(self, *_a, **_k):
            times.append(time.perf_counter())

    return StepClock()


def worker(args) -> None:
    """One rank: train on the shards' sequences from the shared init; rank 0 writes the result."""
    import numpy as np
    import transformers
    from transformers import DataCollatorForLanguageModeling, Trainer

    from bertforge.data_prep.reader import ShardReader

    reader = ShardReader(args.shards, "train")
    tok = transformers.AutoTokenizer.from_pretrained(str(reader.tokenizer_path))
    data = [{"input_ids": np.asarray(reader[i].input_ids).tolist()} for i in range(len(reader))]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    targs = hf_training_args(args, world)
    if args.torch_compile:  # the whole model, as HF Trainer compiles it (post-init: backend too)
        targs.torch_compile, targs.torch_compile_backend = True, "inductor"
    times: list[float] = []
    if args.budget_s is not None:
        callback = snapshot_clock(args)
    else:
        targs.max_steps = args.steps
        callback = step_clock(times)
    collator = DataCollatorForLanguageModeling(
        tok, mlm_probability=args.mask_prob, pad_to_multiple_of=8
    )
    trainer = Trainer(
        model=load_model(args.init),
        args=targs,
        train_dataset=data,
        data_collator=collator,
        callbacks=[callback],
    )
    trainer.train()
    if int(os.environ.get("RANK", "0")) != 0:
        return
    if args.budget_s is not None:
        write_json_atomic(Path(args.hf_out, "snapshots.json"), callback.records)
        return
    mean_len = float(np.mean([len(d["input_ids"]) for d in data]))
    steps = times[args.warmup :]
    secs = steps[-1] - times[args.warmup - 1]
    write_json_atomic(
        Path(args.hf_out, "result.json"),
        {
            "tokens_per_s": mean_len * args.global_batch * len(steps) / secs,
            "steps": len(steps),
            "seconds": secs,
        },
    )


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m benchmarks.training.modernbert_hf")
    for name in ("--shards", "--init", "--hf_out", "--precision"):
        p.add_argument(name, required=True)
    p.add_argument("--global_batch", type=int, required=True)
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--warmup_steps", type=int, required=True)
    p.add_argument("--mask_prob", type=float, required=True)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--torch_compile", action="store_true", help="TrainingArguments.torch_compile")
    # hf_side's snapshot clock reads init_model (its continued mode saves a step-0 snapshot); the
    # seeded initial weights here come through --init and the curve starts at the first snapshot
    p.set_defaults(init_model=None)
    p.add_argument("--warmup", type=int, default=1, help="steps left out of the timing")
    p.add_argument("--budget_s", type=float, default=None)
    p.add_argument("--snapshots", type=int, default=2)
    p.add_argument("--launched", type=float, default=None)
    worker(p.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
