"""Vocabulary files for the --init_from and tokenizer tests."""

from __future__ import annotations

import json
from pathlib import Path


def vocab_with_unused(trained: Path, out: Path, unused: int = 8) -> Path:
    """A BERT-style vocab.txt: [PAD], [unused0..], then the trained vocabulary."""
    spec = json.loads((trained / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = [t for t, _ in sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])]
    vocab = vocab[:1] + [f"[unused{i}]" for i in range(unused)] + vocab[1:]
    out.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return out
