"""Tokens/s of our DeepSpeed trainer vs HF Trainer (BertForMaskedLM +
DataCollatorForLanguageModeling).

Both sides: two local CPU ranks (one thread each), the same shards' token sequences, the same
model size (preset, e.g. ``small``), sequence length, global batch and optimizer (torch AdamW).
Ours: ``deepspeed --num_gpus 2 pretrain/main.py`` (ZeRO-2, fp32, masked-rows-only MLM head);
HF: ``torchrun --nproc_per_node 2`` running ``transformers.Trainer`` (DDP on gloo).
Throughput counts non-padding input tokens per second over the steps after ``--warmup``.

    python -m benchmarks.training.trainer [--corpus FILE] [--model small] [--steps 10] [--warmup 3]
"""

from __future__ import annotations

import argparse
import json
import os
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
    random_bert_mlm,
    vocab_size,
)
from bertforge.data_prep.sample_corpus import write_english_corpus
from bertforge.files import write_json_atomic
from bertforge.pretrain.config import command_line


def run_ours(shards: Path, run: Path, args) -> dict:
    """Launch our trainer; tokens/s from metrics.jsonl (sum of tokens / sum of step times)."""
    from bertforge.pretrain.components.metrics import read_metrics

    cmd = command_line.trainer(
        ranks=args.ranks,
        master_port=args.port,
        ds_config=CPU_DS_CONFIG,
        data=shards,
        model=args.model,
        output_dir=run,
        max_steps=args.steps,
        global_batch_size=args.global_batch,
        micro_batch_size=args.global_batch // args.ranks,
        num_workers=1,
        progress=False,
        save_final=False,
        eval_batches=1,
        lr="1e-4",
        warmup_steps=1,
    )
    subprocess.run(
        cmd,
        cwd=REPO,
        check=True,
        capture_output=not args.verbose,
        env=one_thread_env(),
    )
    recs = read_metrics(run / "metrics.jsonl")[args.warmup :]
    tokens = sum(r["tokens"] for r in recs)
    secs = sum(r["step_time_s"] for r in recs)
    return {
        "tokens_per_s": tokens / secs,
        "steps": len(recs),
        "seconds": secs,
        "tokens_per_step": tokens / len(recs),
        "final_loss": recs[-1]["loss"],
    }


def hf_worker(args) -> None:
    """Body of one HF Trainer rank (run under torchrun)."""
    import numpy as np
    import transformers
    from transformers import (
        DataCollatorForLanguageModeling,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from bertforge.data_prep.reader import ShardReader

    reader = ShardReader(args.shards, "train")
    tok = transformers.AutoTokenizer.from_pretrained(str(reader.tokenizer_path))
    data = [
        {"input_ids": np.asarray(reader[i].input_ids, dtype=np.int64).tolist()}
        for i in range(len(reader))
    ]
    model = random_bert_mlm(args.model, len(tok))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    targs = TrainingArguments(
        output_dir=str(args.hf_out),
        per_device_train_batch_size=args.global_batch // world,
        gradient_accumulation_steps=1,
        max_steps=args.steps,
        learning_rate=1e-4,
        warmup_steps=1,
        weight_decay=0.01,
        max_grad_norm=1.0,
        optim="adamw_torch",
        use_cpu=True,
        dataloader_num_workers=1,
        report_to=[],
        save_strategy="no",
        logging_steps=10**6,
        ddp_backend="gloo",
        disable_tqdm=True,
    )
    times = []

    class Clock(TrainerCallback):
        def on_step_end(self, *_a, **_k):
            times.append(time.perf_counter())

    collator = DataCollatorForLanguageModeling(tok, mlm_probability=0.15, pad_to_multiple_of=8)
    trainer = Trainer(
        model=model, args=targs, train_dataset=data, data_collator=collator, callbacks=[Clock()]
    )
    start = time.perf_counter()
    trainer.train()
    if int(os.environ.get("RANK", "0")) == 0:
        mean_len = float(np.mean([len(d["input_ids"]) for d in data]))
        steps = times[args.warmup :]
        secs = steps[-1] - (times[args.warmup - 1] if args.warmup else start)
        tokens = mean_len * args.global_batch * len(steps)
        result = {
            "tokens_per_s": tokens / secs,
            "steps": len(steps),
            "seconds": secs,
            "tokens_per_step": mean_len * args.global_batch,
        }
        write_json_atomic(Path(args.hf_result), result)


def run_hf(shards: Path, out: Path, args) -> dict:
    result = out / "hf_result.json"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(args.ranks),
        "--master_port",
        str(args.port + 1),
        *("-m", "benchmarks.training.trainer"),
        "--hf_worker",
        "--shards",
        str(shards),
        "--hf_out",
        str(out / "hf"),
        "--hf_result",
        str(result),
        "--model",
        args.model,
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--global_batch",
        str(args.global_batch),
    ]
    subprocess.run(
        cmd,
        cwd=REPO,
        check=True,
        capture_output=not args.verbose,
        env=one_thread_env(),
    )
    return json.loads(result.read_text())


def main() -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.training.trainer",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--corpus",
        type=Path,
        nargs="+",
        default=None,
        help="text files (default: CPython's pydoc topics, ~460 KB of English)",
    )
    p.add_argument("--vocab_size", type=int, default=30522, help="WordPiece vocabulary to train")
    p.add_argument(
        "--tokenizer",
        default=None,
        help="an existing tokenizer (HF folder or BERT vocab.txt) instead of training one",
    )
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--model", default="small")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--global_batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3, help="steps left out of the timing")
    p.add_argument("--port", type=int, default=29850)
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--hf_worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--shards", default=None, help=argparse.SUPPRESS)
    p.add_argument("--hf_out", default=None, help=argparse.SUPPRESS)
    p.add_argument("--hf_result", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.hf_worker:
        hf_worker(args)
        return 0
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench_trainer_"))
    work.mkdir(parents=True, exist_ok=True)
    corpus = args.corpus
    if corpus is None:
        corpus = [write_english_corpus(work / "pydoc_topics.txt")]
    vocab = {"tokenizer": args.tokenizer} if args.tokenizer else {"vocab_size": args.vocab_size}
    shards = build_shards(
        corpus, work / "shards", max_seq_len=args.seq_len, validation_fraction=0.02, **vocab
    )
    vocab = vocab_size(shards)
    print(
        f"corpus {' '.join(map(str, corpus))}; vocab {vocab}; model {args.model}; "
        f"seq {args.seq_len}; global batch "
        f"{args.global_batch} on {args.ranks} CPU ranks x 1 thread; {args.steps} steps, timing "
        f"after {args.warmup}",
        flush=True,
    )
    hf = run_hf(shards, work, args)
    print(
        f"HF Trainer (BertForMaskedLM + DataCollatorForLanguageModeling): "
        f"{hf['tokens_per_s']:,.0f} tokens/s",
        flush=True,
    )
    ours = run_ours(shards, work / "ours", args)
    print(
        f"ours (DeepSpeed ZeRO-2, masked-rows MLM head):                 "
        f"{ours['tokens_per_s']:,.0f} tokens/s",
        flush=True,
    )
    print(f"ratio ours / HF: {ours['tokens_per_s'] / hf['tokens_per_s']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
