"""Forward+backward step on CPU: pretrain.model.bert vs transformers' BertForMaskedLM, side by side.

    python -m benchmarks.training.model_step [--models tiny small] [--batch 32] [--seq_len 128]
                                          [--vocab_size 30522] [--steps 5] [--threads N]

Both models have the same architecture and vocabulary (30522, BERT's) and run on the SAME batch:
full-length sequences masked by HF's DataCollatorForLanguageModeling (15%, 80/10/10). HF computes
the decoder and the loss at every position; ours gathers the masked rows first and runs the head
and `kernels.masked_lm_loss` on them only. Steps alternate between the two models so background
load hits both alike; the median step time is reported. Target: ours >= 1.5x HF's tokens/s.
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
    args = p.parse_args(argv)

    import numpy as np
    import torch
    from transformers import BertForMaskedLM, DataCollatorForLanguageModeling

    from bertforge.kernels.constants import IGNORE_INDEX
    from bertforge.pretrain.model.registry import PRESETS, build_model

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
        f"{args.vocab_size}; torch threads {torch.get_num_threads()}; CPU, fp32"
    )

    rows = []
    for name in args.models:
        ours = build_model(dataclasses.replace(PRESETS[name], loss_impl="auto"), args.vocab_size)
        hf = BertForMaskedLM(ours.hf_config(unpad_vocab=True))
        hf.config._attn_implementation = "sdpa"
        hf.load_state_dict(ours.hf_state_dict(unpad_vocab=True), strict=True)
        ours.train()
        hf.train()

        def step(model, key):
            model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            out = model(**batch)
            loss = out["loss"] if isinstance(out, dict) else out.loss
            loss.backward()
            return time.perf_counter() - t0, loss.item()

        times = {"ours": [], "hf": []}
        step(ours, "ours"), step(hf, "hf")  # warm-up
        for _ in range(args.steps):
            for key, model in (("ours", ours), ("hf", hf)):
                times[key].append(step(model, key)[0])
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append((name, ours.num_parameters(), tokens / med["ours"], tokens / med["hf"]))

    print(f"\n{'model':<8} {'params':>12} {'ours tok/s':>12} {'HF tok/s':>12} {'speed-up':>9}")
    for name, params, a, b in rows:
        print(f"{name:<8} {params:>12,} {a:>12,.0f} {b:>12,.0f} {a / b:>8.2f}x")
    worst = min(a / b for _, _, a, b in rows)
    print(f"\ntarget ours >= 1.5x HF: {'met' if worst >= 1.5 else 'NOT met'} (lowest {worst:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
