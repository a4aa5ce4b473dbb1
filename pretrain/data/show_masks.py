"""Training sequences with their masks made visible (``--dry-run --show_masks N``).

The sequences are the training loader's first ones, masked exactly as a run masks them (the same
dataset object and batch plans). Each selected position is marked by what the model sees there:

    [M:word]        replaced by [MASK]; ``word`` is the label
    [R:word>other]  replaced by a random token ``other``
    [K:word]        kept as it is (still predicted)

A whole-word unit of several tokens with a selected token is wrapped in ``⟦ ⟧`` (not braces:
those occur in text), so a word or a
protected term masked whole reads ``⟦[M:hyper] [M:##param] [M:##eter]⟧``. A random draw that
happens to hit the original token looks like (and is counted here as) kept; the realised
statistics count it as random, so the two may differ by such draws (about 1 in the vocabulary
size of random replacements).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bertforge.pretrain.data.masking import IGNORE_INDEX, unit_starts


def render_sequence(
    orig: np.ndarray,
    seen: np.ndarray,
    labels: np.ndarray,
    word_start: np.ndarray | None,
    special: np.ndarray,
    id_to_token,
) -> dict:
    """One sequence's marked text and its counts (selected, mask, random, kept, units)."""
    ws = None if word_start is None else np.asarray(word_start)[None]
    starts = unit_starts(~special[orig][None], ws)[0]  # as the masker draws them
    selected = labels != IGNORE_INDEX
    pieces: list[str] = []
    counts = {"selected": 0, "mask": 0, "random": 0, "kept": 0, "units": 0}
    t, n = 0, len(orig)
    while t < n:
        end = t + 1
        while end < n and not starts[end] and not special[orig[end]]:
            end += 1  # [t, end) is one unit (a single token without whole-word masking)
        marks = []
        for i in range(t, end):
            word = id_to_token(int(orig[i]))
            if not selected[i]:
                marks.append(word)
                continue
            counts["selected"] += 1
            counts["units"] += int(starts[i])
            if seen[i] == orig[i]:
                counts["kept"] += 1
                marks.append(f"[K:{word}]")
            elif special[seen[i]]:
                counts["mask"] += 1
                marks.append(f"[M:{word}]")
            else:
                counts["random"] += 1
                marks.append(f"[R:{word}>{id_to_token(int(seen[i]))}]")
        text = " ".join(marks)
        pieces.append(f"⟦{text}⟧" if end - t > 1 and selected[t:end].any() else text)
        t = end
    return {"text": " ".join(pieces), **counts}


def show_masks(loader, n: int, tokenizer_file: str) -> list[dict[str, Any]]:
    """The first ``n`` training sequences of ``loader`` (a :func:`pretrain.data.loader.build_loader`
    loader), each with its marked text and counts; ``index`` is its dataset index."""
    # Lazy: tokenizers only when sequences are shown (--show_masks N of a dry run).
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_file)
    ds = loader.dataset
    special = np.zeros(ds.vocab_size, dtype=bool)
    special[list(ds.masker.special)] = True
    out: list[dict[str, Any]] = []
    for plan in loader.batch_sampler:
        got = ds.read(plan)
        batch = ds.__getitems__(plan)
        seen, labels = batch["input_ids"].numpy(), batch["labels"].numpy()
        for row in range(len(plan.indices)):
            if len(out) == n:
                return out
            L = int(got.lengths[row])
            ws = got.word_start[row, :L] if ds.masker.cfg.whole_word else None
            rec = render_sequence(
                got.input_ids[row, :L], seen[row, :L], labels[row, :L], ws, special, tok.id_to_token
            )
            out.append({"index": int(plan.indices[row]), "length": L, **rec})
        if len(out) == n:
            break
    return out


def format_shown(shown: list[dict[str, Any]]) -> str:
    """Text block: legend, each sequence, and the totals over the shown sequences."""
    lines = ["masks   [M:x] [MASK]  [R:x>y] random  [K:x] kept  ⟦...⟧ one whole-word unit"]
    for s in shown:
        lines.append(
            f"  #{s['index']} ({s['length']} tokens, {s['selected']} selected): {s['text']}"
        )
    tot = {k: sum(s[k] for s in shown) for k in ("selected", "mask", "random", "kept", "units")}
    sel = max(tot["selected"], 1)
    lines.append(
        f"  shown: {tot['selected']} selected in {tot['units']} units; [MASK] "
        f"{tot['mask'] / sel:.4f}, random {tot['random'] / sel:.4f}, kept "
        f"{tot['kept'] / sel:.4f}"
    )
    return "\n".join(lines) + "\n"
