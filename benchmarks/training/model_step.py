"""Forward+backward step on CPU: pretrain.model.bert vs transformers' BertForMaskedLM, side by side.

    python -m benchmarks.training.model_step [--models tiny small] [--batch 32] [--seq_len 128]
                                          [--vocab_size 30522] [--steps 5] [--threads N]
                                          [--dropout 0.1 0] [--precision fp32|bf16|bf16-autocast]
                                          [--count_flops]

Both models have the same architecture and vocabulary (30522, BERT's) and run on the SAME batch:
full-length sequences masked by HF's DataCollatorForLanguageModeling (15%, 80/10/10). HF computes
the decoder and the loss at every position; ours gathers the masked rows first and runs the head
and `kernels.masked_lm_loss` on them only. Steps alternate between the two models so background
load hits both alike; the median step time is reported. Target: ours >= 1.5x HF's tokens/s.

``--dropout P [P ...]``: one pair of models per rate (hidden and attention dropout both P; the
weights are the same), all in the same alternation, to price dropout on either side.
``--precision bf16``: both models' weights in bf16 (what DeepSpeed's bf16 mode computes in);
``bf16-autocast``: fp32 weights, forward under ``torch.autocast`` in bf16 (HF Trainer's
``bf16=True``).

A ``--models`` entry is a preset name or a BERT folder (an HF ``config.json``: e.g. the
all-MiniLM-L6-v2 that ``benchmarks.learning.per_hour --init_from minilm`` continues), whose shape
is used with fresh weights. ``--count_flops``: also count each model's floating-point operations
in one forward + backward on the batch (``torch.utils.flop_counter.FlopCounterMode``: matmuls and
attention, what dominates), and print their ratio: at equal learning per step and equal FLOPs
per second, ours would reach a loss HF reaches after t seconds of training after t / ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path


def bert_tokenizer(vocab_size: int, folder: Path):
    """A BERT-layout WordPiece tokenizer with `vocab_size` entries (what HF's collator needs)."""
    from transformers import BertTokenizerFast

    words = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words += [f"w{i}" for i in range(vocab_size - len(words))]
    (folder / "vocab.txt").write_text("\n".join(words) + "\n")
    return BertTokenizerFast.from_pretrained(str(folder))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.training.model_step",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    p.add_argument("--models", nargs="+", default=["tiny", "small"])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--vocab_size", type=int, default=30522)
    p.add_argument(
        "--steps", type=int, default=3, help="measured steps per model (after 1 warm-up)"
    )
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--dropout", type=float, nargs="+", default=[0.1], help="dropout rates to run")
    p.add_argument("--precision", choices=("fp32", "bf16", "bf16-autocast"), default="fp32")
    p.add_argument(
        "--count_flops", action="store_true", help="count each side's FLOPs per step, and the ratio"
    )
    args = p.parse_args(argv)

    import numpy as np
    import torch
    from transformers import DataCollatorForLanguageModeling

    from bertforge.kernels.constants import IGNORE_INDEX

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        tok = bert_tokenizer(args.vocab_size, Path(tmp))
    assert len(tok) == args.vocab_size, len(tok)
    rng = np.random.default_rng(0)
    seqs = rng.integers(999, args.vocab_size, size=(args.batch, args.seq_len))
    seqs[:, 0], seqs[:, -1] = tok.cls_token_id, tok.sep_token_id
    collator = DataCollatorForLanguageModeling(tok, mlm_probability=0.15)
    batch = collator([{"input_ids": s.tolist()} for s in seqs])
    batch["token_type_ids"] = torch.zeros_like(batch["input_ids"])
    batch["attention_mask"] = torch.ones_like(batch["input_ids"])
    tokens = batch["input_ids"].numel()
    masked = int((batch["labels"] != IGNORE_INDEX).sum())
    print(
        f"batch {args.batch} x {args.seq_len} = {tokens} tokens, {masked} masked; vocab "
        f"{args.vocab_size}; torch threads {torch.get_num_threads()}; CPU, {args.precision}"
    )
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    autocast = torch.autocast("cpu", torch.bfloat16, enabled=args.precision == "bf16-autocast")

    rows = []
    for name in args.models:
        shape = model_shape(name, args.vocab_size)
        pairs = {p: model_pair(shape, p, args.vocab_size, dtype) for p in args.dropout}
        if args.count_flops:
            report_flops(name, pairs[args.dropout[0]], batch, autocast, tokens)

        def step(model):
            model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            forward_backward(model, batch, autocast)
            return time.perf_counter() - t0

        times = {(p, side): [] for p in pairs for side in ("ours", "hf")}
        for key in times:  # warm-up
            step(pairs[key[0]][key[1]])
        for _ in range(args.steps):
            for key in times:
                times[key].append(step(pairs[key[0]][key[1]]))
        for p, pair in pairs.items():
            med = {side: statistics.median(times[(p, side)]) for side in pair}
            params = pair["ours"].num_parameters()
            rows.append((name, p, params, tokens / med["ours"], tokens / med["hf"]))

    rows = [(Path(name).name, *rest) for name, *rest in rows]  # a folder by its name
    w = max(8, *(len(name) for name, *_ in rows))
    head = f"{'model':<{w}} {'dropout':>8} {'params':>12} {'ours tok/s':>12} {'HF tok/s':>12}"
    print(f"\n{head} {'speed-up':>9}")
    for name, p, params, a, b in rows:
        print(f"{name:<{w}} {p:>8g} {params:>12,} {a:>12,.0f} {b:>12,.0f} {a / b:>8.2f}x")
    worst = min(a / b for *_, a, b in rows)
    print(f"\ntarget ours >= 1.5x HF: {'met' if worst >= 1.5 else 'NOT met'} (lowest {worst:.2f}x)")
    return 0


def model_shape(name: str, vocab_size: int):
    """The ModelConfig of a preset name, or of a BERT folder's config.json (its architecture on
    the ``small`` preset's other settings; its vocabulary must be ``vocab_size`` entries, the
    batch's)."""
    import json

    from bertforge.pretrain.model.bert.adapter import fields_from_hf
    from bertforge.pretrain.model.registry import PRESETS

    if Path(name).is_dir():
        config = json.loads((Path(name) / "config.json").read_text())
        if config.get("vocab_size", vocab_size) != vocab_size:
            raise SystemExit(
                f"error: {Path(name) / 'config.json'} has vocab_size {config['vocab_size']} and "
                f"--vocab_size is {vocab_size}: pass --vocab_size {config['vocab_size']}"
            )
        return dataclasses.replace(PRESETS["small"], **fields_from_hf(Path(name), config))
    if name not in PRESETS:
        raise SystemExit(f"error: --models {name!r}: a preset ({', '.join(PRESETS)}) or a folder")
    return PRESETS[name]


def forward_backward(model, batch: dict, autocast) -> None:
    """One forward (under ``autocast``) and backward of either side's model on ``batch``."""
    with autocast:
        out = model(**batch)
    (out["loss"] if isinstance(out, dict) else out.loss).backward()


def step_flops(model, batch: dict, autocast) -> int:
    """Floating-point operations of one forward + backward of ``model`` on ``batch``."""
    from torch.utils.flop_counter import FlopCounterMode

    model.zero_grad(set_to_none=True)
    with FlopCounterMode(display=False) as counter:
        forward_backward(model, batch, autocast)
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def report_flops(name: str, pair: dict, batch: dict, autocast, tokens: int) -> dict:
    """Print (and return) each side's FLOPs per step and HF's over ours'."""
    flops = {side: step_flops(model, batch, autocast) for side, model in pair.items()}
    ratio = flops["hf"] / flops["ours"]
    print(
        f"{name}: FLOPs per forward + backward of {tokens} tokens: ours {flops['ours'] / 1e9:,.1f} "
        f"G, HF {flops['hf'] / 1e9:,.1f} G; HF / ours {ratio:.2f}x (at equal learning per step "
        f"and FLOPs/s, ours reaches HF's loss in 1/{ratio:.2f} = {1 / ratio:.2f} of its time)"
    )
    return {**flops, "ratio": ratio}


def model_pair(shape, dropout: float, vocab_size: int, dtype) -> dict:
    """Ours of ``shape`` and transformers' BertForMaskedLM with its weights (SDPA), both with
    hidden and attention dropout ``dropout``, in ``dtype``, in training mode."""
    import torch
    from transformers import BertForMaskedLM

    from bertforge.pretrain.model.registry import build_model

    torch.manual_seed(0)  # the same weights for every rate
    cfg = dataclasses.replace(
        shape,
        loss_impl="auto",
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )
    ours = build_model(cfg, vocab_size)
    hf = BertForMaskedLM(ours.hf_config(unpad_vocab=True))
    hf.config._attn_implementation = "sdpa"
    hf.load_state_dict(ours.hf_state_dict(unpad_vocab=True), strict=True)
    return {"ours": ours.to(dtype).train(), "hf": hf.to(dtype).train()}


if __name__ == "__main__":
    sys.exit(main())
