"""data_prep shards: round trip, word-start bits, split, nsp structure, reader, inspect, verify."""

from __future__ import annotations

import hashlib
import json
import pickle
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers.commands import run_cli
from helpers.shards import content_stream
from transformers import AutoTokenizer

from bertforge.data_prep import ShardError, ShardReader
from bertforge.data_prep.__main__ import main

CJK = re.compile(r"^[\u4e00-\u9fff\u3400-\u4dbf]$")


def blank_line_documents(path: Path) -> list[str]:
    """Reference reading of a blank-line-separated corpus, independent of data_prep.inputs."""
    return [b.strip() for b in re.split(r"\n\s*\n", path.read_text(encoding="utf-8")) if b.strip()]


def assign_documents(doc_ids: list[list[int]], train: np.ndarray, val: np.ndarray) -> list[str]:
    """Walk the documents in order; each must continue exactly one of the two split streams."""
    pos = {"train": 0, "validation": 0}
    streams = {"train": train, "validation": val}
    sides = []
    for k, ids in enumerate(doc_ids):
        hits = [s for s in streams if streams[s][pos[s] : pos[s] + len(ids)].tolist() == ids]
        assert hits, f"document {k} is in neither split at the expected position"
        side = hits[0]  # an identical document would be in both places only if duplicated
        pos[side] += len(ids)
        sides.append(side)
    assert pos["train"] == len(train) and pos["validation"] == len(val), "extra tokens in shards"
    return sides


def test_packed_round_trip_every_token_in_order(english_shards, english_corpus):
    docs = blank_line_documents(english_corpus)
    hf = AutoTokenizer.from_pretrained(english_shards / "tokenizer")
    doc_ids = [hf(d, add_special_tokens=False)["input_ids"] for d in docs]
    train, val = ShardReader(english_shards, "train"), ShardReader(english_shards, "validation")
    sides = assign_documents(doc_ids, content_stream(train), content_stream(val))
    m = train.manifest
    assert m["splits"]["train"]["documents"] == sides.count("train")
    assert m["splits"]["validation"]["documents"] == sides.count("validation") > 0
    assert m["splits"]["train"]["corpus_tokens"] == sum(
        len(i) for i, s in zip(doc_ids, sides) if s == "train"
    )
    # Sequence structure: [CLS] ... [SEP], never longer than max_seq_len, and nearly all full.
    lengths = train.sequence_lengths()
    assert lengths.max() <= 128 and (lengths >= 126).mean() > 0.99
    for i in range(len(train)):
        ids = train[i].input_ids
        assert ids[0] == train.special_tokens["cls"] and ids[-1] == train.special_tokens["sep"]
    assert m["tokenizer"]["vocab_size"] == 2000 and m["token_dtype"] == "uint16"
    assert m["command"][:3] == ["bertforge", "prep", "build"]


def test_split_is_by_document_and_deterministic(tmp_path, english_shards):
    """Duplicated documents land on the same side; the split ignores unit boundaries."""
    docs = [f"Document number {k} talks about topic {k % 7} in plain words." for k in range(200)]
    corpus = tmp_path / "dup.txt"
    corpus.write_text("\n\n".join(docs + docs[:50]) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    assert (
        main(
            [
                "build",
                "--input",
                str(corpus),
                "--output",
                str(out),
                "--tokenizer",
                str(english_shards / "tokenizer"),
                "--validation_fraction",
                "0.2",
                "--shard_docs",
                "17",
                "--workers",
                "1",
            ]
        )
        == 0
    )
    hf = AutoTokenizer.from_pretrained(out / "tokenizer")
    doc_ids = [hf(d, add_special_tokens=False)["input_ids"] for d in docs + docs[:50]]
    sides = assign_documents(
        doc_ids,
        content_stream(ShardReader(out, "train")),
        content_stream(ShardReader(out, "validation")),
    )
    assert sides[:50] == sides[200:], "a duplicated document landed on both sides"
    assert 0.1 < sides.count("validation") / len(sides) < 0.3


def test_english_word_start_follows_wordpiece_continuations(english_shards):
    reader = ShardReader(english_shards, "train")
    hf = AutoTokenizer.from_pretrained(english_shards / "tokenizer")
    n_cont = 0
    for i in range(len(reader)):
        s = reader[i]
        toks = hf.convert_ids_to_tokens(s.input_ids.tolist())
        expected = np.array([not t.startswith("##") for t in toks])
        expected[[0, 1, -1]] = True  # [CLS], the first piece of a sequence, [SEP]
        np.testing.assert_array_equal(s.word_start, expected)
        n_cont += int((~expected).sum())
    assert n_cont > 1000  # a 2000-word vocabulary splits many words


def test_chinese_word_start_from_segmenter(chinese_shards, chinese_corpus):
    import rjieba

    docs = [
        line.strip()
        for line in chinese_corpus.read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    hf = AutoTokenizer.from_pretrained(chinese_shards / "tokenizer")
    expected_by_doc = []
    for d in docs:
        word_starts, pos = set(), 0
        for w in rjieba.cut(d):
            word_starts.add(pos)
            pos += len(w)
        enc = hf(d, add_special_tokens=False, return_offsets_mapping=True)
        toks = hf.convert_ids_to_tokens(enc["input_ids"])
        expected_by_doc.append(
            [
                (
                    tid,
                    (s in word_starts)
                    if CJK.match(d[s:e]) and e - s == 1
                    else not t.startswith("##"),
                )
                for tid, t, (s, e) in zip(enc["input_ids"], toks, enc["offset_mapping"])
            ]
        )
    # Order the reference documents as the shards hold them, then compare bit by bit.
    train, val = ShardReader(chinese_shards, "train"), ShardReader(chinese_shards, "validation")
    sides = assign_documents(
        [[t for t, _ in e] for e in expected_by_doc], content_stream(train), content_stream(val)
    )
    for split, reader in (("train", train), ("validation", val)):
        want = [b for e, s in zip(expected_by_doc, sides) if s == split for _, b in e]
        got, first = [], []
        special = {reader.special_tokens["cls"], reader.special_tokens["sep"]}
        for i in range(len(reader)):
            smp = reader[i]
            keep = ~np.isin(smp.input_ids, list(special))
            got.extend(smp.word_start[keep].tolist())
            first.extend([k == 0 for k in range(int(keep.sum()))])
        got_a, want_a, first_a = np.array(got), np.array(want), np.array(first)
        assert len(got_a) == len(want_a)
        # The first piece of each sequence always starts a unit; everything else follows jieba.
        np.testing.assert_array_equal(got_a[~first_a], want_a[~first_a])
        if split == "train":
            assert (~want_a).mean() > 0.2  # multi-character words are really merged


def find_aligned(hay: bytes, needle: bytes, start: int = 0) -> int:
    """Byte offset of `needle` in `hay` at a multiple of 4 (uint32 token boundary), or -1."""
    p = hay.find(needle, start)
    while p != -1 and p % 4:
        p = hay.find(needle, p + 1)
    return p


def test_nsp_labels_balanced_and_segments_structured(english_nsp_shards, english_corpus):
    reader = ShardReader(english_nsp_shards, "train")
    assert reader.format == "nsp"
    hf = AutoTokenizer.from_pretrained(english_nsp_shards / "tokenizer")
    docs = [
        np.array(hf(d, add_special_tokens=False)["input_ids"], dtype=np.uint32).tobytes()
        for d in blank_line_documents(english_corpus)
    ]
    cls, sep = reader.special_tokens["cls"], reader.special_tokens["sep"]
    labels, follows, random_elsewhere, n_actual, n_random = [], 0, 0, 0, 0
    for i in range(len(reader)):
        s = reader[i]
        ids, a_len = s.input_ids, s.segment_a_len
        assert len(ids) <= 128 and ids[0] == cls and ids[a_len - 1] == sep and ids[-1] == sep
        assert 2 < a_len < len(ids) - 1, "segment A or B is empty"
        assert list(np.flatnonzero(ids == sep)) == [a_len - 1, len(ids) - 1]
        assert s.word_start[[0, a_len - 1, a_len, len(ids) - 1]].all()
        labels.append(s.is_random_next)
        if i >= 300:
            continue
        a = ids[1 : a_len - 1].astype(np.uint32).tobytes()
        b = ids[a_len:-1].astype(np.uint32).tobytes()
        home = [d for d in docs if find_aligned(d, a) >= 0]
        assert home, "segment A is not a contiguous piece of any document"
        after_a = any(find_aligned(d, b, find_aligned(d, a) + len(a)) >= 0 for d in home)
        if s.is_random_next:
            if len(home) == 1:  # B must come from another document
                n_random += 1
                random_elsewhere += any(find_aligned(d, b) >= 0 for d in docs if d is not home[0])
        else:
            n_actual += 1
            follows += after_a
    assert set(labels) == {0, 1} and 0.4 <= np.mean(labels) <= 0.6
    assert follows == n_actual, "an actual-next B is not from A's document"
    assert n_random > 50 and random_elsewhere == n_random


def test_reader_api_zero_copy_and_errors(english_shards, tmp_path):
    reader = ShardReader(english_shards)
    s = reader[3]
    assert s.input_ids.dtype == np.uint16 and not s.input_ids.flags.owndata
    assert not s.input_ids.flags.writeable
    assert s.word_start.dtype == np.bool_ and s.word_start.shape == s.input_ids.shape
    assert s.segment_a_len is None and s.is_random_next is None
    np.testing.assert_array_equal(reader[-1].input_ids, reader[len(reader) - 1].input_ids)
    with pytest.raises(IndexError):
        reader[len(reader)]
    clone = pickle.loads(pickle.dumps(reader))
    np.testing.assert_array_equal(clone[3].input_ids, s.input_ids)
    assert reader.tokenizer_path == english_shards / "tokenizer" and reader.max_seq_len == 128
    assert reader.vocab_size == 2000 and set(reader.special_tokens) == {
        "cls",
        "sep",
        "pad",
        "mask",
        "unk",
    }
    assert sum(reader.sequence_lengths()) == reader.num_tokens
    small = ShardReader(english_shards, max_open_shards=1)
    assert len(small[0].input_ids) > 0
    with pytest.raises(ShardError, match="split 'test' not present"):
        ShardReader(english_shards, "test")
    with pytest.raises(ShardError, match="not a finished data_prep build"):
        ShardReader(tmp_path)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_corruption_detected_by_verify_and_reader(english_shards, tmp_path, capsys):
    assert main(["verify", str(english_shards)]) == 0
    bad = _copy(english_shards, tmp_path / "flipped")
    victim = min((bad / "train").glob("*.tokens"))
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    assert main(["verify", str(bad)]) != 0
    assert victim.name in capsys.readouterr().err
    ShardReader(bad, verify="size")  # same size: only the checksum can tell
    with pytest.raises(ShardError, match=f"{victim.name}.*sha256"):
        ShardReader(bad, verify="full")

    short = _copy(english_shards, tmp_path / "truncated")
    victim = min((short / "validation").glob("*.wordstart"))
    victim.write_bytes(victim.read_bytes()[:-1])
    with pytest.raises(ShardError, match=f"{victim.name}.*bytes"):
        ShardReader(short, "validation")
    assert main(["verify", str(short)]) == 2

    old = _copy(english_shards, tmp_path / "version")
    m = json.loads((old / "manifest.json").read_text())
    m["format_version"] = 99
    (old / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ShardError, match="format_version 99"):
        ShardReader(old)

    swapped = _copy(english_shards, tmp_path / "tokenizer")
    tj = swapped / "tokenizer" / "tokenizer.json"
    spec = json.loads(tj.read_text())
    spec["model"]["vocab"]["zzzz_new_token"] = len(spec["model"]["vocab"])
    tj.write_text(json.dumps(spec))
    assert main(["verify", str(swapped)]) == 2
    assert "fingerprint" in capsys.readouterr().err


def test_inspect_json_and_text(english_nsp_shards):
    proc = run_cli("-m", "data_prep", "inspect", str(english_nsp_shards), "--json")
    s = json.loads(proc.stdout)
    m = json.loads((english_nsp_shards / "manifest.json").read_text())
    for split in ("train", "validation"):
        e = s["splits"][split]
        assert e["sequences"] == m["splits"][split]["sequences"]
        assert sum(h["sequences"] for h in e["length_histogram"]) == e["sequences"]
        assert e["samples"] and e["samples"][0]["text"].startswith("[CLS]")
    assert 0.4 <= s["splits"]["train"]["random_next_share"] <= 0.6
    text = run_cli("-m", "data_prep", "inspect", str(english_nsp_shards)).stdout
    assert "[train]" in text and "is_random_next share" in text


def test_sliding_window_covers_each_document(tmp_path, english_shards, english_corpus):
    out = tmp_path / "win"
    assert (
        main(
            [
                "build",
                "--input",
                str(english_corpus),
                "--output",
                str(out),
                "--tokenizer",
                str(english_shards / "tokenizer"),
                "--max_seq_len",
                "64",
                "--stride",
                "40",
                "--validation_fraction",
                "0",
                "--workers",
                "1",
            ]
        )
        == 0
    )
    reader = ShardReader(out)
    hf = AutoTokenizer.from_pretrained(out / "tokenizer")
    docs = [
        hf(d, add_special_tokens=False)["input_ids"] for d in blank_line_documents(english_corpus)
    ]
    i = 0
    for ids in docs:  # windows of 62 tokens every 40, the last one flush with the end
        starts = list(range(0, max(len(ids) - 62, 0) + 1, 40))
        if starts[-1] + 62 < len(ids):
            starts.append(len(ids) - 62)
        for st in starts:
            assert reader[i].input_ids[1:-1].tolist() == ids[st : st + 62]
            i += 1
    assert i == len(reader)


def test_large_vocabulary_uses_uint32(tmp_path, english_shards):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(english_shards / "tokenizer" / "tokenizer.json"))
    vocab = [t for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]
    vocab += [f"zzfiller{k}" for k in range(70000 - len(vocab))]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    corpus = tmp_path / "c.txt"
    corpus.write_text("zzfiller67000 is a rare word.\n\nPlain words here.\n", encoding="utf-8")
    out = tmp_path / "out"
    assert (
        main(
            [
                "build",
                "--input",
                str(corpus),
                "--output",
                str(out),
                "--tokenizer",
                str(tmp_path / "vocab.txt"),
                "--validation_fraction",
                "0",
                "--workers",
                "1",
            ]
        )
        == 0
    )
    reader = ShardReader(out)
    assert reader.manifest["token_dtype"] == "uint32" and reader.vocab_size == 70000
    assert reader[0].input_ids.dtype == np.uint32
    assert vocab.index("zzfiller67000") in reader[0].input_ids.tolist()


def _many_shards(tmp_path: Path, english_corpus: Path, english_shards: Path, fmt: str) -> Path:
    out = tmp_path / f"many_{fmt}"
    assert (
        main(
            [
                "build",
                "--input",
                str(english_corpus),
                "--output",
                str(out),
                "--tokenizer",
                str(english_shards / "tokenizer"),
                "--format",
                fmt,
                "--shard_docs",
                "3",
                "--validation_fraction",
                "0",
                "--workers",
                "2",
            ]
        )
        == 0
    )
    return out


def assert_batch_matches_items(reader: ShardReader, idx: np.ndarray, multiple: int) -> None:
    """get_batch(idx) row by row against reader[i] (the per-sequence path)."""
    b = reader.get_batch(idx, pad_to_multiple_of=multiple)
    pad = reader.special_tokens["pad"]
    assert b.input_ids.dtype == np.int64 and b.input_ids.shape[0] == len(idx)
    T = b.input_ids.shape[1]
    assert T % multiple == 0 and (len(idx) == 0 or T - multiple < b.lengths.max() <= T)
    for r, i in enumerate(idx):
        s = reader[int(i)]
        L = len(s.input_ids)
        assert b.lengths[r] == L
        np.testing.assert_array_equal(b.input_ids[r, :L], s.input_ids)
        assert (b.input_ids[r, L:] == pad).all()
        np.testing.assert_array_equal(b.word_start[r, :L], s.word_start)
        assert not b.word_start[r, L:].any()
        if reader.format == "nsp":
            assert (b.segment_a_len[r], b.is_random_next[r]) == (s.segment_a_len, s.is_random_next)
        else:
            assert b.segment_a_len is None and b.is_random_next is None


@pytest.mark.parametrize("fmt", ["packed", "nsp"])
def test_get_batch_equals_per_sequence_reads(
    fmt, tmp_path, english_corpus, english_shards, english_nsp_shards, monkeypatch
):
    import bertforge.data_prep.reader as reader_mod

    one = english_shards if fmt == "packed" else english_nsp_shards
    many = _many_shards(tmp_path, english_corpus, english_shards, fmt)
    rng = np.random.default_rng(7)
    for root, max_open in ((one, None), (many, None), (many, 2)):
        reader = ShardReader(root, max_open_shards=max_open)
        assert root == one or len(reader.manifest["splits"]["train"]["shards"]) > 20
        # Both gather strategies: per shard (the default for these batch sizes) and per sequence.
        for min_group in (1, 10**9):
            monkeypatch.setattr(reader_mod, "_MIN_GROUP", min_group)
            for B in (1, 5, 64, 300):  # random order, repeats, negative indices
                assert_batch_matches_items(
                    reader, rng.integers(-len(reader), len(reader), B), multiple=8 if B % 2 else 1
                )
            assert_batch_matches_items(reader, np.arange(len(reader)), multiple=8)
    empty = reader.get_batch([])
    assert empty.input_ids.shape == (0, 0) and len(empty.lengths) == 0
    only_ids = reader.get_batch([0, 1], word_start=False, dtype=np.int32)
    assert only_ids.word_start is None and only_ids.input_ids.dtype == np.int32
    with pytest.raises(IndexError, match=f"sequence {len(reader)} out of range"):
        reader.get_batch([0, len(reader)])
    with pytest.raises(ValueError, match="pad_to_multiple_of"):
        reader.get_batch([0], pad_to_multiple_of=0)


def test_offsets_uint32_in_version_2_and_version_1_still_read(english_shards, tmp_path):
    m = json.loads((english_shards / "manifest.json").read_text())
    assert m["format_version"] == 2
    stored = 0
    for split in ("train", "validation"):
        for shard in m["splits"][split]["shards"]:
            assert shard["offsets_dtype"] == "uint32"
            offsets = english_shards / split / f"{shard['name']}.offsets"
            assert offsets.stat().st_size == 4 * (shard["sequences"] + 1)
            stored += sum(f["bytes"] for f in shard["files"].values())
    tokens = sum(m["splits"][s]["tokens"] for s in ("train", "validation"))
    seqs = sum(m["splits"][s]["sequences"] for s in ("train", "validation"))
    # 2-byte ids, one word-start bit per token (padded to whole bytes per shard), 4 bytes an offset.
    n_shards = sum(len(m["splits"][s]["shards"]) for s in ("train", "validation"))
    assert stored <= 2 * tokens + tokens / 8 + 4 * (seqs + n_shards) + n_shards
    assert stored / tokens < 2.2

    # The same shards written as format_version 1 (uint64 offsets, no offsets_dtype key).
    old = _copy(english_shards, tmp_path / "v1")
    m1 = json.loads((old / "manifest.json").read_text())
    m1["format_version"] = 1
    for split in ("train", "validation"):
        for shard in m1["splits"][split]["shards"]:
            del shard["offsets_dtype"]
            path = old / split / f"{shard['name']}.offsets"
            data = np.fromfile(path, dtype="<u4").astype("<u8").tobytes()
            path.write_bytes(data)
            shard["files"][path.name] = {
                "bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
    (old / "manifest.json").write_text(json.dumps(m1))
    assert main(["verify", str(old)]) == 0
    new_r, old_r = ShardReader(english_shards), ShardReader(old, verify="full")
    assert len(old_r) == len(new_r)
    np.testing.assert_array_equal(old_r.sequence_lengths(), new_r.sequence_lengths())
    for i in (0, 7, len(new_r) - 1):
        np.testing.assert_array_equal(old_r[i].input_ids, new_r[i].input_ids)
    idx = np.arange(len(new_r))[::-1]
    a, b = old_r.get_batch(idx), new_r.get_batch(idx)
    np.testing.assert_array_equal(a.input_ids, b.input_ids)
    np.testing.assert_array_equal(a.word_start, b.word_start)

    bad = _copy(english_shards, tmp_path / "bad_dtype")
    m2 = json.loads((bad / "manifest.json").read_text())
    m2["splits"]["train"]["shards"][0]["offsets_dtype"] = "float16"
    (bad / "manifest.json").write_text(json.dumps(m2))
    with pytest.raises(ShardError, match="offsets_dtype 'float16'.*rebuild"):
        ShardReader(bad)


def test_unverified_truncated_shard_gives_shard_error(english_shards, tmp_path):
    short = _copy(english_shards, tmp_path / "short")
    victim = min((short / "train").glob("*.tokens"))
    victim.write_bytes(victim.read_bytes()[:100])
    reader = ShardReader(short, verify="none")  # trusts the folder until a shard is opened
    with pytest.raises(ShardError, match=f"{victim.name}.*verify"):
        reader.get_batch([0])
