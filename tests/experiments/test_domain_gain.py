"""experiments.domain_gain (experiment B): the quick form runs the stages of the arms it
is given from a small base model the test writes, prints the main table (every arm against the
base) and the tips table (the tips whose two arms ran), and a finished experiment is not redone.

The experiment runs in this process (``main``, what ``python -m experiments.domain_gain`` runs):
its stages are still processes of their own, and a fresh interpreter for the experiment itself
would only add seconds of imports."""

from __future__ import annotations

import json

import pytest
from helpers.tiny_bert import build_tiny_bert

from experiments.domain_gain import REFERENCE, TIPS, main

pytestmark = pytest.mark.slow

ARMS = ("d_vocab_mean", "e_vocab_random")  # new vocabulary: mean-of-pieces vs random rows


def _table_rows(printed: str) -> list[str]:
    return [line for line in printed.splitlines() if line.startswith("| ")]


def test_quick_experiment_prints_both_tables_and_resumes(tmp_path, capsys):
    base = build_tiny_bert(tmp_path / "base")
    out = tmp_path / "gain"
    cmd = ["--out", str(out), "--base", str(base), "--quick", "--arms", REFERENCE, *ARMS]
    assert main(cmd) == 0
    rows = _table_rows(capsys.readouterr().out)
    assert [r.split(" | ")[0][2:] for r in rows[1:4]] == [REFERENCE, *ARMS]
    assert rows[1].count("; ") == 0  # the reference row has no difference to itself
    assert all(r.count("; ") == 1 for r in rows[2:4])
    tips = [r for r in rows if " - " in r.split(" | ")[1] and not r.startswith("| tip |")]
    ran = {REFERENCE, *ARMS}
    assert len(tips) == sum(arm in ran and other in ran for _, arm, other in TIPS) == 1

    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["reference"] == REFERENCE and len(summary["tips"]) == 1
    assert set(summary["pretraining"]) == set(ARMS)
    assert {r["steps"] for r in summary["pretraining"].values()} == {4}
    assert summary["terms"] and (out / "gain.png").stat().st_size > 0
    # the extended vocabulary changes the token count, nothing else does
    tokens = {arm: r["tokens"] for arm, r in summary["pretraining"].items()}
    assert tokens["d_vocab_mean"] == tokens["e_vocab_random"]

    assert main(cmd) == 0  # finished: nothing runs again, the same tables come out
    again = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert again["seconds"] == {} and again["tasks"] == summary["tasks"]


def test_random_rows_replace_unused_slots_and_appended_tokens(tmp_path):
    """Arm (e)'s base: every token the extension added (in an [unused*] slot or appended) gets
    a random row; every old token keeps its row. A published BertModel has no prefix."""
    import torch
    import transformers
    from helpers.vocab import vocab_with_unused
    from safetensors.torch import load_file

    from bertforge.data_prep.extend_tokenizer import ExtendConfig, extend_tokenizer
    from bertforge.data_prep.sample_corpus import pydoc_documents
    from bertforge.data_prep.tokenizer import train_wordpiece
    from experiments.new_tokens import random_rows_folder

    train_wordpiece(pydoc_documents()[:40], 800, True, tmp_path / "trained")
    base = tmp_path / "base"
    base.mkdir()
    vocab_with_unused(tmp_path / "trained", base / "vocab.txt", unused=2)
    tok = transformers.BertTokenizerFast(str(base / "vocab.txt"))
    tok.save_pretrained(str(base))
    conf = transformers.BertConfig(
        vocab_size=len(tok),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
    )
    transformers.BertModel(conf).save_pretrained(str(base))
    terms = tmp_path / "terms.txt"
    terms.write_text("hypertension\ncholecystectomy\nthrombocytopenia\n", encoding="utf-8")
    ext = tmp_path / "ext"
    text = tmp_path / "text.txt"
    text.write_text("\n\n".join(pydoc_documents()[:5]), encoding="utf-8")
    extend_tokenizer(ExtendConfig(tokenizer=base, inputs=(str(text),), output=ext, terms=terms))

    out = random_rows_folder(base, ext, tmp_path / "random_rows")
    key = "embeddings.word_embeddings.weight"
    old = load_file(str(base / "model.safetensors"))[key]
    new = load_file(str(out / "model.safetensors"))[key]
    ext_vocab = transformers.AutoTokenizer.from_pretrained(str(ext)).get_vocab()
    added = sorted(ext_vocab[t] for t in ("hypertension", "cholecystectomy", "thrombocytopenia"))
    assert added[:2] == [1, 2] and added[2] >= len(old)  # two [unused*] slots, then appended
    old_vocab = transformers.AutoTokenizer.from_pretrained(str(base)).get_vocab()
    kept = sorted(i for t, i in ext_vocab.items() if old_vocab.get(t) == i)
    assert len(kept) == len(old) - 2 and new.shape[0] == len(ext_vocab)
    assert torch.equal(new[kept], old[kept])
    assert not torch.allclose(new[added[:2]], old[added[:2]])
    assert new[len(old) :].abs().min() > 0  # appended rows are drawn, not zeros
