"""Vocabulary files for the --init_from and tokenizer tests."""

from __future__ import annotations

import json
from pathlib import Path

from helpers.commands import DATA


def vocab_with_unused(trained: Path, out: Path, unused: int = 8) -> Path:
    """A BERT-style vocab.txt: [PAD], [unused0..], then the trained vocabulary."""
    spec = json.loads((trained / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = [t for t, _ in sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])]
    vocab = vocab[:1] + [f"[unused{i}]" for i in range(unused)] + vocab[1:]
    out.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return out


def extend_with_domain_terms(base: Path, tmp: Path, max_new: int = 12) -> Path:
    """`base`'s tokenizer extended (data_prep extend-tokenizer) by two English medical terms,
    one Chinese one and up to `max_new` tokens mined from the 《红楼梦》 sample; in tmp/ext_tok."""
    from bertforge.data_prep.extend_tokenizer import ExtendConfig, extend_tokenizer

    terms = tmp / "terms.txt"
    terms.write_text("hypertension\nheart failure\n高血压\n", encoding="utf-8")
    out = tmp / "ext_tok"
    extend_tokenizer(
        ExtendConfig(
            tokenizer=base,
            inputs=(str(DATA / "zh_hongloumeng_sample.txt"),),
            output=out,
            terms=terms,
            max_new=max_new,
        )
    )
    return out
