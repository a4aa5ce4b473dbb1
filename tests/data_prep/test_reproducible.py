"""The same shards from the same text (issue 53.5): two `data_prep build` runs over one corpus with
the same arguments give the same files, byte for byte, tokenizer included; the manifests differ
only in the build's time. Once as one build, once split into two parts run as separate processes
(as on two machines). The upstream WordPiece trainer alone still varies (huggingface/tokenizers
#1794): the canary test says when the workaround in data_prep/tokenizer.py can go."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from helpers.commands import REPO, run_cli
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

from bertforge.data_prep.tokenizer import SPECIAL_TOKENS, continuation_pieces, train_wordpiece
from bertforge.pretrain.config import command_line

# A vocabulary the corpus fills (the merges of equal count at its end are where runs differed).
ARGS = {"vocab_size": 3000, "max_seq_len": 128, "validation_fraction": 0.05, "workers": 2}


def files(root: Path) -> dict[str, bytes]:
    """Every file of a finished build, by its path inside the folder."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def same_build(a: Path, b: Path) -> None:
    """Byte-identical folders, except the manifest's `created` (the time of the build)."""
    fa, fb = files(a), files(b)
    assert fa.keys() == fb.keys()
    assert [name for name in fa if fa[name] != fb[name]] in ([], ["manifest.json"])
    ma, mb = json.loads(fa["manifest.json"]), json.loads(fb["manifest.json"])
    ma.pop("created"), mb.pop("created")
    assert ma == mb


def build_twice(tmp: Path, build) -> tuple[Path, Path]:
    """Run ``build(out)`` twice into the same --output (the arguments stay the same), keeping the
    first result aside."""
    out = tmp / "shards"
    build(out)
    first = out.rename(tmp / "first")
    build(out)
    return first, out


@pytest.mark.slow  # builds as processes
def test_two_builds_of_one_corpus_are_byte_identical(english_corpus, tmp_path):
    def build(out: Path) -> None:
        run_cli(*command_line.data_prep_build(english_corpus, out, **ARGS)[1:])

    first, second = build_twice(tmp_path, build)
    same_build(first, second)
    vocab = json.loads((second / "tokenizer" / "tokenizer.json").read_text())
    # Only BERT's five specials are added tokens: the ## pieces are plain vocabulary entries.
    assert [t["content"] for t in vocab["added_tokens"]] == list(SPECIAL_TOKENS)


@pytest.mark.slow
def test_two_builds_split_into_parts_are_byte_identical(english_corpus, tmp_path):
    """`prepare`, then two parts started side by side as separate processes (two machines
    sharing the folder), the last to finish merging; twice."""
    part_args = {**ARGS, "workers": 1, "shard_docs": 20, "num_partitions": 2}

    def build(out: Path) -> None:
        prepare = command_line.data_prep_build(english_corpus, out, **ARGS, shard_docs=20)
        prepare[prepare.index("build")] = "prepare"
        run_cli(*prepare[1:])
        parts = [
            subprocess.Popen(
                command_line.data_prep_build(english_corpus, out, **part_args, partition=k),
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for k in range(2)
        ]
        for p in parts:
            out_text, _ = p.communicate(timeout=300)
            assert p.returncode == 0, out_text
        assert (out / "manifest.json").is_file()

    first, second = build_twice(tmp_path, build)
    same_build(first, second)
    assert json.loads((second / "manifest.json").read_text())["partitions"] == 2


def _upstream_vocab(texts: list[str]) -> dict[str, int]:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=2000,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        continuing_subword_prefix="##",
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok.get_vocab()


def test_canary_the_upstream_trainer_alone_still_varies(english_corpus):
    """When this fails, tokenizers trains the same vocabulary from the same text by itself
    (huggingface/tokenizers#1794 fixed): `continuation_pieces` and the special-token detour in
    `train_wordpiece` can go (docs/data.md, "What is reproducible")."""
    texts = english_corpus.read_text(encoding="utf-8").split("\n\n")
    vocabs = {tuple(sorted(_upstream_vocab(texts).items())) for _ in range(4)}
    assert len(vocabs) > 1, (
        "tokenizers' WordPiece trainer is deterministic now: drop the workaround"
    )


def test_the_trained_tokenizer_encodes_as_upstream_would(tmp_path):
    """The ## pieces passed as special tokens leave no trace: text that spells one ("##ing") is
    split as punctuation and letters, not matched as a token, and decodes back."""
    texts = ["the running runner runs", "a singing singer sings", "##ing is not a token"] * 3
    words = re.findall(r"[a-z]+", " ".join(texts))
    assert continuation_pieces(texts, lowercase=True) == sorted(
        {f"##{c}" for w in words for c in w[1:]}
    )
    train_wordpiece(texts, 200, True, tmp_path / "tok", min_frequency=1)
    tok = Tokenizer.from_file(str(tmp_path / "tok" / "tokenizer.json"))
    enc = tok.encode("##ing runs")
    assert enc.tokens[:3] == ["[CLS]", "#", "#"]
    assert tok.decode(enc.ids) == "# # ing runs"


def test_a_one_pass_iterator_is_refused(tmp_path):
    with pytest.raises(TypeError, match="reads the texts twice"):
        train_wordpiece(iter(["a b c"]), 100, True, tmp_path / "tok")
