"""The one evaluator of ``benchmarks.learning.per_hour``: held-out masked-LM loss of saved models.

Contract: :func:`build_masked_batches` packs held-out text into ``seq_len`` sequences
([CLS] ... [SEP]) and masks 15% of the non-special tokens (80% [MASK], 10% random, 10% kept)
with one seeded generator, once; every model is then scored on exactly those batches by
:func:`heldout_loss` (``transformers.AutoModelForMaskedLM`` in fp32, mean cross-entropy over all
masked tokens). :func:`time_to_reach` reads a loss-vs-time curve; :func:`plot_curves` draws it.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from bertforge.kernels.constants import IGNORE_INDEX


def build_masked_batches(
    tokenizer_dir: str | Path,
    text: str,
    *,
    seq_len: int = 128,
    max_sequences: int = 64,
    mask_prob: float = 0.15,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """input_ids, attention_mask, labels [n, seq_len] of held-out ``text``; fixed masks."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tok.model_max_length = 10**9  # the whole text at once, cut into sequences below
    ids = tok(text, add_special_tokens=False)["input_ids"]
    body = seq_len - 2
    n = min(max_sequences, len(ids) // body)
    if n < 1:
        raise ValueError(
            f"held-out text has {len(ids)} tokens: fewer than one {seq_len}-token sequence"
        )
    rows = [[tok.cls_token_id, *ids[i * body : (i + 1) * body], tok.sep_token_id] for i in range(n)]
    input_ids = torch.tensor(rows, dtype=torch.long)
    special = (input_ids == tok.cls_token_id) | (input_ids == tok.sep_token_id)
    gen = torch.Generator().manual_seed(seed)
    chosen = (torch.rand(input_ids.shape, generator=gen) < mask_prob) & ~special
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    draw = torch.rand(input_ids.shape, generator=gen)
    random_ids = torch.randint(len(tok), input_ids.shape, generator=gen)
    masked = input_ids.clone()
    masked[chosen & (draw < 0.8)] = tok.mask_token_id
    swap = chosen & (draw >= 0.8) & (draw < 0.9)
    masked[swap] = random_ids[swap]
    return {
        "input_ids": masked,
        "attention_mask": torch.ones_like(masked),
        "labels": labels,
    }


@torch.no_grad()
def heldout_loss(model_dir: str | Path, batches: dict[str, torch.Tensor], micro: int = 16) -> dict:
    """Mean masked-LM loss and accuracy of the HF folder ``model_dir`` on ``batches`` (fp32): a
    BERT folder as ``BertForMaskedLM``, a ModernBERT one as ``ModernBertForMaskedLM`` (logits at
    every position: no labels are passed, so sparse prediction never applies)."""
    from transformers import AutoModelForMaskedLM

    model = AutoModelForMaskedLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    loss_sum, correct, count = 0.0, 0, 0
    for i in range(0, len(batches["input_ids"]), micro):
        part = {k: v[i : i + micro] for k, v in batches.items()}
        logits = model(input_ids=part["input_ids"], attention_mask=part["attention_mask"]).logits
        keep = part["labels"] != IGNORE_INDEX
        rows, gold = logits[keep].float(), part["labels"][keep]
        loss_sum += float(torch.nn.functional.cross_entropy(rows, gold, reduction="sum"))
        correct += int((rows.argmax(-1) == gold).sum())
        count += int(keep.sum())
    return {"loss": loss_sum / count, "accuracy": correct / count, "masked_tokens": count}


def time_to_reach(points: list[tuple[float, float]], target: float) -> float | None:
    """First time a (seconds, loss) curve, linear between its points, gets down to ``target``;
    None when it never does."""
    points = sorted(points)
    for i, (t, loss) in enumerate(points):
        if loss <= target:
            if i == 0:
                return t
            t0, l0 = points[i - 1]
            return t0 + (t - t0) * (l0 - target) / (l0 - loss)
    return None


def value_at(points: list[tuple[float, float]], t: float) -> float | None:
    """The curve's value at time ``t``, linear between its points; None outside them."""
    points = sorted(points)
    for (t0, v0), (t1, v1) in zip(points, points[1:]):
        if t0 <= t <= t1:
            return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    return points[0][1] if len(points) == 1 and points[0][0] == t else None


def plot_curves(sides: dict[str, list[tuple[float, float]]], title: str, out: Path) -> Path:
    """held-out loss against wall-clock seconds, one line per side; writes ``out`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, points in sides.items():
        points = sorted(p for p in points if math.isfinite(p[1]))
        ax.plot([t for t, _ in points], [v for _, v in points], "o-", label=name, markersize=4)
    ax.set_xlabel("wall-clock seconds from the launch command (save time excluded)")
    ax.set_ylabel("held-out MLM loss (same masks)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
