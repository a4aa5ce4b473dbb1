"""Attention maps of a BERT or ModernBERT: PNG heatmaps per layer and head, per-head statistics.

    bertforge attention MODEL --text "..." --out DIR [--layers 0,1] [--heads 0-3]

MODEL is a Hugging Face folder, a run folder (newest complete checkpoint) or ``RUN@STEP``; a
run's checkpoint is exported to DIR/model first (``pretrain.export``). The model runs with eager
attention (the fused kernels return no weights). Layers and heads are numbered from 0.
Writes DIR/layerLL_headHH.png (rows: the attending token, columns: the attended one) and
DIR/attention_stats.json: the tokens and, per head, averaged over the attending tokens:
``entropy`` (nats; ``entropy_max`` = log of the token count is uniform attention), ``to_cls``,
``to_sep`` (attention mass on [CLS] / on all [SEP]), ``to_prev``, ``to_next``, ``to_self``, and
``reach`` (the mean distance |q - k| weighted by attention). ``layer_kinds`` says what each layer
attends to: ``full`` for BERT and ModernBERT's global layers, ``window W`` for ModernBERT's
sliding-window layers (a token sees the W tokens around it, itself included: nothing outside
that band, as the heatmaps show).
Chinese tokens are drawn with a CJK-capable font when matplotlib finds one; otherwise a warning
says so and the axis labels become ``id:escaped`` (e.g. ``1234:\\u7ea2``), never empty boxes.
"""

from __future__ import annotations

import math
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.cli import command_parser
from bertforge.errors import USER_ERROR_EXIT, UserError
from bertforge.files import write_json_atomic
from bertforge.logs import get_logger, transformers_errors_only

log = get_logger(__name__)

PROBE_CHAR = "中"
# fonts that claim every code point but draw boxes (matplotlib ships "Last Resort")
NOT_REAL_GLYPHS = ("Last Resort",)


@lru_cache(maxsize=1)
def cjk_font() -> str | None:
    """The name of a font known to matplotlib that has Chinese glyphs, or None."""
    # Imports inside functions here: matplotlib, torch, transformers (and evaluate.models, which
    # imports torch) only when a map is drawn, so --help and a bad argument answer at once.
    from matplotlib import font_manager, ft2font

    for entry in font_manager.fontManager.ttflist:
        if entry.name.startswith(NOT_REAL_GLYPHS):
            continue
        try:
            if ord(PROBE_CHAR) in ft2font.FT2Font(entry.fname).get_charmap():
                return entry.name
        except (OSError, RuntimeError):
            continue
    return None


@lru_cache(maxsize=1)
def _default_charmap() -> frozenset[int]:
    # Lazy: matplotlib (see cjk_font).
    from matplotlib import font_manager, ft2font

    return frozenset(ft2font.FT2Font(font_manager.findfont("DejaVu Sans")).get_charmap())


def token_labels(tokens: list[str], ids: list[int]) -> tuple[list[str], str | None]:
    """Axis labels and the font to draw them with (see the module doc for the fallback)."""
    drawable = _default_charmap()
    if all(ord(c) in drawable for tok in tokens for c in tok):
        return tokens, None
    font = cjk_font()
    if font is not None:
        return tokens, font
    log.warning(
        "no font with Chinese glyphs found by matplotlib (install one, e.g. Debian's "
        "fonts-noto-cjk, then remove ~/.cache/matplotlib); labelling tokens as id:escaped"
    )
    escaped = [tok.encode("ascii", "backslashreplace").decode("ascii") for tok in tokens]
    return [f"{i}:{e}" for i, e in zip(ids, escaped)], None


class AttentionError(UserError, ValueError):
    """A --layers/--heads selection or a model argument that cannot be used."""


def parse_indices(spec: str | None, count: int, what: str) -> list[int]:
    """``"0,2"`` / ``"1-3"`` / None (all) -> indices, checked against ``count``."""
    if not spec:
        return list(range(count))
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.strip().partition("-")
        try:
            rng = range(int(lo), int(hi or lo) + 1)
        except ValueError as e:
            raise AttentionError(f"--{what} {spec!r}: use numbers like 0,2 or 1-3") from e
        out += rng
    bad = [i for i in out if not 0 <= i < count]
    if bad:
        raise AttentionError(f"--{what} {bad}: the model has {count} {what} (0..{count - 1})")
    return sorted(set(out))


def load_model(spec: str, workdir: Path):
    """(model with eager attention, tokenizer, HF folder) for a model argument."""
    # Lazy: transformers and torch (see cjk_font).
    import transformers

    from bertforge.pretrain.evaluate.models import materialize, resolve

    refs = resolve(spec)
    if len(refs) != 1:
        raise AttentionError(f"{spec}: name one model (RUN@STEP or RUN), not {len(refs)}")
    hf_dir = materialize(refs[0], workdir)
    transformers.logging.disable_progress_bar()
    with transformers_errors_only():  # the MLM head is unused here
        model = transformers.AutoModel.from_pretrained(str(hf_dir), attn_implementation="eager")
    tok = transformers.AutoTokenizer.from_pretrained(str(hf_dir))
    return model.eval(), tok, hf_dir


def attention_weights(model, tokenizer, text: str) -> tuple[list[int], np.ndarray]:
    """Token ids and the attention probabilities [layers, heads, T, T] (float64)."""
    # Lazy: torch (see cjk_font).
    import torch

    enc = tokenizer(
        text, return_tensors="pt", truncation=True, max_length=model.config.max_position_embeddings
    )
    with torch.no_grad():
        out = model(**enc, output_attentions=True)
    att = torch.stack([a[0] for a in out.attentions]).double().numpy()
    return enc["input_ids"][0].tolist(), att


def head_stats(
    att: np.ndarray, ids: list[int], cls_id: int | None, sep_id: int | None
) -> dict[str, float]:
    """Statistics of one head's [T, T] attention (rows attend, columns are attended)."""
    n = att.shape[0]
    ent = -(att * np.log(np.clip(att, 1e-30, None))).sum(-1)
    cls_cols = [i for i, t in enumerate(ids) if t == cls_id]
    sep_cols = [i for i, t in enumerate(ids) if t == sep_id]
    idx = np.arange(n)
    return {
        "entropy": float(ent.mean()),
        "entropy_max": math.log(n),
        "to_cls": float(att[:, cls_cols].sum(-1).mean()) if cls_cols else 0.0,
        "to_sep": float(att[:, sep_cols].sum(-1).mean()) if sep_cols else 0.0,
        "to_prev": float(att[idx[1:], idx[1:] - 1].mean()) if n > 1 else 0.0,
        "to_next": float(att[idx[:-1], idx[:-1] + 1].mean()) if n > 1 else 0.0,
        "to_self": float(np.diag(att).mean()),
        "reach": float((att * np.abs(idx[:, None] - idx[None, :])).sum(-1).mean()),
    }


def layer_kinds(config, num_layers: int) -> list[str]:
    """``full`` or ``window W`` per layer (ModernBERT's ``layer_types``; BERT: all full)."""
    types = getattr(config, "layer_types", None) or ["full_attention"] * num_layers
    window = getattr(config, "local_attention", None)
    return ["full" if t == "full_attention" else f"window {window}" for t in types]


def draw(att: np.ndarray, labels: list[str], font: str | None, title: str, path: Path) -> None:
    """One heatmap PNG."""
    # Lazy: matplotlib (pyplot) only when a figure is drawn.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(labels)
    size = max(4.0, 0.35 * n + 2)
    fig, ax = plt.subplots(figsize=(size + 1, size))
    im = ax.imshow(att, cmap="viridis", vmin=0.0, vmax=float(att.max()))  # per-head contrast
    fontdict = {"family": [font, "DejaVu Sans"]} if font else None  # Latin falls back
    ax.set_xticks(range(n), labels, rotation=90, fontsize=8, fontdict=fontdict)
    ax.set_yticks(range(n), labels, fontsize=8, fontdict=fontdict)
    ax.set_xlabel("attended token")
    ax.set_ylabel("attending token")
    ax.set_title(title)
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def attention_maps(
    spec: str, text: str, out: str | Path, layers: str | None = None, heads: str | None = None
) -> dict[str, Any]:
    """Write the heatmaps and attention_stats.json into ``out``; returns the statistics."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model, tok, hf_dir = load_model(spec, out / "model")
    ids, att = attention_weights(model, tok, text)
    tokens = tok.convert_ids_to_tokens(ids)
    labels, font = token_labels(tokens, ids)
    kinds = layer_kinds(model.config, att.shape[0])
    stats = []
    for layer in parse_indices(layers, att.shape[0], "layers"):
        for head in parse_indices(heads, att.shape[1], "heads"):
            png = out / f"layer{layer:02d}_head{head:02d}.png"
            draw(
                att[layer, head],
                labels,
                font,
                f"{Path(hf_dir).name}: layer {layer} ({kinds[layer]}), head {head}",
                png,
            )
            stats.append(
                {
                    "layer": layer,
                    "head": head,
                    "kind": kinds[layer],
                    "png": png.name,
                    **head_stats(att[layer, head], ids, tok.cls_token_id, tok.sep_token_id),
                }
            )
    result = {
        "model": spec,
        "hf_dir": str(hf_dir),
        "text": text,
        "tokens": tokens,
        "token_ids": ids,
        "labels": labels,
        "font": font,
        "num_layers": att.shape[0],
        "num_heads": att.shape[1],
        "layer_kinds": kinds,
        "heads": stats,
    }
    write_json_atomic(out / "attention_stats.json", result)
    return result


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = command_parser("bertforge attention", __doc__)
    p.add_argument("model", help="HF folder, run folder or RUN@STEP")
    p.add_argument("--text", required=True, help="the sentence to look at")
    p.add_argument("--out", required=True, help="folder for the PNGs and attention_stats.json")
    p.add_argument("--layers", default=None, help="e.g. 0,2 or 0-3 (default: all)")
    p.add_argument("--heads", default=None, help="e.g. 0,2 or 0-3 (default: all)")
    args = p.parse_args(argv)
    try:
        res = attention_maps(args.model, args.text, args.out, args.layers, args.heads)
    except UserError as e:
        log.error(str(e))
        return USER_ERROR_EXIT
    print(f"{len(res['tokens'])} tokens: {' '.join(res['tokens'])}")
    print("layer head entropy  to_cls to_sep to_prev to_next reach kind")
    for h in res["heads"]:
        print(
            f"{h['layer']:5d} {h['head']:4d} {h['entropy']:7.3f} {h['to_cls']:6.3f} "
            f"{h['to_sep']:6.3f} {h['to_prev']:7.3f} {h['to_next']:7.3f} {h['reach']:5.2f} "
            f"{h['kind']}"
        )
    print(Path(args.out) / "attention_stats.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
