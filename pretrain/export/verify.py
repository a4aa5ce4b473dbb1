"""The export's own check: reload the written folder with transformers (every key accounted
for) and show what it predicts, each prediction with the sentence it was made on.

The text is the probe (:mod:`pretrain.export.probe`: held-out text of the run by default).

- A masked LM (and BERT's NSP model): fill-mask on the probe with one word masked, and the word.
- A replaced-token-detection export: the discriminator is no masked LM, so its check is the
  detection itself: one token of the probe replaced by another token of it, and the probability
  of "replaced" it gives each token. Fill-mask runs on the generator (``GENERATOR_DIR``) where
  the arch's generator is exported, and says so.

Imports inside functions here: transformers takes seconds to import; only writing and checking a
folder needs it, not ``--help``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bertforge.logs import transformers_errors_only
from bertforge.pretrain.export.hf_extras import POOLER_KEYS
from bertforge.pretrain.export.probe import FALLBACK_TEXT, mask_one_word
from bertforge.pretrain.run_folder.run_checkpoints import CheckpointError

#: where an RTD export puts its generator (ElectraForMaskedLM), inside the export folder
GENERATOR_DIR = "generator"


def load_problems(auto, out: Path, allowed: tuple[str, ...] = ()) -> dict[str, Any]:
    """The missing, unexpected and mismatched keys of loading ``out`` as ``auto`` (less the
    ``allowed`` unexpected ones), and the model under "model"; transformers' own report of them
    is kept quiet."""

    with transformers_errors_only():
        model, info = auto.from_pretrained(str(out), output_loading_info=True)
    info["unexpected_keys"] = {k for k in info["unexpected_keys"] if k not in allowed}
    wanted = ("missing_keys", "unexpected_keys", "mismatched_keys")
    return {k: v for k, v in info.items() if k in wanted and v} | {"model": model}


def verify_export(
    out: Path, auto_class: str, pooler: bool = False, probe: str = FALLBACK_TEXT
) -> dict[str, Any]:
    """Load ``out`` with transformers' ``auto_class`` (the objective's: a masked LM's, or
    BERT's NSP model's; strict key check; with ``pooler``, a masked-LM BERT's
    added pooler is the only key its masked-LM class does not use, and ``AutoModel`` misses
    nothing) and run fill-mask on ``probe`` with one word masked; returns the architecture and
    ``fill_mask``: a list of ``{"sentence", "answer", "predictions"}`` (the top 3)."""
    import transformers

    bad = load_problems(getattr(transformers, auto_class), out, POOLER_KEYS if pooler else ())
    model = bad.pop("model")
    if pooler:
        base = load_problems(transformers.AutoModel, out)
        base.pop("model")
        bad.update({f"AutoModel {k}": v for k, v in base.items() if k == "missing_keys"})
    if bad:
        raise CheckpointError(f"exported folder {out} does not load cleanly: {bad}")
    with transformers_errors_only():  # the pooler's report: checked above
        fill = transformers.pipeline("fill-mask", model=str(out), tokenizer=str(out), device="cpu")
    sentence, answer = mask_one_word(fill.tokenizer, probe)
    fills = [{"sentence": sentence, "answer": answer, "predictions": fill(sentence, top_k=3)}]
    return {"architecture": type(model).__name__, "fill_mask": fills}


def verify_detector(
    out: Path, architecture: str, generator: bool, probe: str = FALLBACK_TEXT
) -> dict[str, Any]:
    """Load an RTD export with transformers (strict key check): the discriminator with its class
    and its replaced-token detection (:func:`detect_replaced`), the generator (if exported) with
    AutoModelForMaskedLM and its fill-mask."""
    import transformers

    bad = load_problems(getattr(transformers, architecture), out)
    model = bad.pop("model")
    if bad:
        raise CheckpointError(f"exported folder {out} does not load cleanly: {bad}")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    generated = out / GENERATOR_DIR
    res = verify_export(generated, "AutoModelForMaskedLM", probe=probe) if generator else {}
    return {
        "architecture": type(model).__name__,
        "detection": detect_replaced(model, tokenizer, probe),
        "fill_mask": res.get("fill_mask", []),
    }


def detect_replaced(model, tokenizer, sentence: str) -> dict[str, Any]:
    """Replace the middle word piece of ``sentence`` by its first one (or the next piece that
    differs) and ask the discriminator ``model`` which tokens were replaced: the corrupted
    pieces, the replaced position, and each piece's probability of "replaced"."""
    import torch

    enc = tokenizer(sentence, return_tensors="pt", return_special_tokens_mask=True)
    special = enc.pop("special_tokens_mask")[0].bool()
    ids = enc["input_ids"].clone()
    real = (~special).nonzero().squeeze(1).tolist()
    if len(real) < 2:
        raise CheckpointError(f"the tokenizer makes fewer than 2 pieces of {sentence!r}")
    at = real[len(real) // 2]
    by = next((ids[0, p] for p in real if ids[0, p] != ids[0, at]), None)
    if by is None:
        raise CheckpointError(f"every piece of {sentence!r} is the same token")
    original = tokenizer.convert_ids_to_tokens(int(ids[0, at]))
    ids[0, at] = by
    model.eval()
    with torch.no_grad():
        logits = model(**{**enc, "input_ids": ids}).logits
    probs = torch.sigmoid(logits.reshape(ids.shape)[0].float())
    pieces = tokenizer.convert_ids_to_tokens(ids[0].tolist())
    return {
        "sentence": tokenizer.decode(ids[0], skip_special_tokens=True),
        "replaced": {"position": real.index(at), "original": original, "by": pieces[at]},
        "pieces": [(pieces[p], float(probs[p])) for p in real],
    }


def check_lines(res: dict[str, Any]) -> list[str]:
    """What the export's check found (``res``: the export's result, whose "generator" is where
    an RTD export's generator went), one line per sentence, for the command's report."""
    lines = []
    if res.get("probe_source"):
        lines.append(f"  probe: {res['probe_source']} (--probe_text TEXT for another)")
    if "detection" in res:
        det = res["detection"]
        swap = det["replaced"]
        called = [f"{piece!r} {p:.2f}" for piece, p in det["pieces"] if p > 0.5]
        scores = sorted((p for _, p in det["pieces"]), reverse=True)
        mine = det["pieces"][swap["position"]][1]
        lines.append(
            f"  replaced-token detection on {det['sentence']!r} ({swap['original']!r} replaced "
            f"by {swap['by']!r}): P(replaced) of that token {mine:.2f}, rank "
            f"{scores.index(mine) + 1} of the {len(scores)} pieces; called replaced (P > 0.5): "
            + (", ".join(called) or "none")
        )
        if not res.get("fill_mask"):
            lines.append(
                "  fill-mask: none (a discriminator is no masked LM, and this arch's generator "
                "is not exported)"
            )
    generator = "detection" in res and res.get("generator")
    where = f" (the generator, {res['generator']})" if generator else ""
    for fill in res.get("fill_mask", []):
        preds = ", ".join(f"{p['token_str']!r} {p['score']:.3f}" for p in fill["predictions"])
        lines.append(
            f"  fill-mask{where} on {fill['sentence']!r} (the word: {fill['answer']!r}): {preds}"
        )
    return lines
