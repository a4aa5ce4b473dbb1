"""data_prep inputs and build lifecycle: formats, bad input, protected terms, resume, refusals."""

from __future__ import annotations

import csv
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers.commands import REPO

from bertforge.data_prep import ShardError, ShardReader
from bertforge.data_prep.__main__ import main
from bertforge.data_prep.sample_corpus import pydoc_documents


@pytest.fixture(scope="module")
def tok(english_shards) -> str:
    """A trained HF tokenizer folder (so that these builds skip training)."""
    return str(english_shards / "tokenizer")


@pytest.fixture(scope="module")
def docs() -> list[str]:
    """20 real documents, inner blank lines removed (so blank lines separate documents)."""
    return ["\n".join(ln for ln in d.splitlines() if ln.strip()) for d in pydoc_documents()[:20]]


def build(capsys, inputs, out: Path, *extra: str, tokenizer: str | None = None) -> tuple[int, str]:
    """Run `python -m data_prep build` in-process; returns (exit status, stdout + stderr)."""
    args = [
        "build",
        "--input",
        *map(str, inputs),
        "--output",
        str(out),
        "--workers",
        "1",
        "--validation_fraction",
        "0.1",
        *extra,
    ]
    if tokenizer:
        args += ["--tokenizer", tokenizer]
    rc = main(args)
    got = capsys.readouterr()  # warnings and notes on stdout, errors on stderr
    return rc, got.out + got.err


def all_tokens(out: Path) -> list[np.ndarray]:
    r = [ShardReader(out, s) for s in ("train", "validation")]
    return [np.concatenate([x[i].input_ids for i in range(len(x))]) for x in r]


def manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def test_every_input_format_gives_the_same_shards(tmp_path, capsys, tok, docs):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    text = "".join(d + "\n\n" for d in docs).encode()
    jsonl = "".join(json.dumps({"id": k, "text": d}) + "\n" for k, d in enumerate(docs)).encode()
    (tmp_path / "a.txt").write_bytes(text)
    (tmp_path / "b.jsonl").write_bytes(jsonl)
    (tmp_path / "c.jsonl.gz").write_bytes(gzip.compress(jsonl))
    half = len(text) // 2  # two zstd frames back to back, as `cat a.zst b.zst` makes
    (tmp_path / "d.txt.zst").write_bytes(
        zstandard.ZstdCompressor().compress(text[:half])
        + zstandard.ZstdCompressor().compress(text[half:])
    )
    pq.write_table(pa.table({"text": docs, "n": list(range(len(docs)))}), tmp_path / "e.parquet")
    datasets.Dataset.from_dict({"text": docs}).save_to_disk(str(tmp_path / "f_dataset"))
    # CSV as spreadsheets and csv writers make it: a header, quoted fields holding newlines and
    # commas (and TSV, gzipped)
    for name, sep in (("i.csv", ","), ("j.tsv", "\t")):
        with open(tmp_path / name, "w", newline="", encoding="utf-8") as f:
            rows = csv.writer(f, delimiter=sep)
            rows.writerow(["id", "text"])
            rows.writerows(enumerate(docs))
    (tmp_path / "j.tsv.gz").write_bytes(gzip.compress((tmp_path / "j.tsv").read_bytes()))
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "1.txt").write_text("".join(d + "\n\n" for d in docs[:8]))
    (tmp_path / "g" / "2.txt.gz").write_bytes(
        gzip.compress("".join(d + "\n\n" for d in docs[8:]).encode())
    )
    (tmp_path / "g" / "notes.bin").write_bytes(b"\x00\x01 ignored: unknown extension")
    (tmp_path / "h").mkdir()
    for k, d in enumerate(docs):
        (tmp_path / "h" / f"{k:02d}.jsonl").write_text(json.dumps({"text": d}) + "\n")
    (tmp_path / "one_per_line.txt").write_text("".join(d.replace("\n", " ") + "\n" for d in docs))

    rc, err = build(capsys, [tmp_path / "a.txt"], tmp_path / "ref", tokenizer=tok)
    assert rc == 0, err
    ref = all_tokens(tmp_path / "ref")
    assert len(ref[0]) > 1000 and len(ref[1]) > 0
    for name, inputs in {
        "jsonl": [tmp_path / "b.jsonl"],
        "jsonl_gz": [tmp_path / "c.jsonl.gz"],
        "zstd": [tmp_path / "d.txt.zst"],
        "parquet": [tmp_path / "e.parquet"],
        "hf_dataset": [tmp_path / "f_dataset"],
        "csv": [tmp_path / "i.csv"],
        "tsv_gz": [tmp_path / "j.tsv.gz"],
        "folder": [tmp_path / "g"],
        "glob": [str(tmp_path / "h" / "*.jsonl")],
    }.items():
        rc, err = build(capsys, inputs, tmp_path / name, tokenizer=tok)
        assert rc == 0, f"{name}: {err}"
        got = all_tokens(tmp_path / name)
        for a, b in zip(ref, got):
            np.testing.assert_array_equal(a, b, err_msg=name)
        assert (
            manifest(tmp_path / name)["splits"]["train"]["documents"]
            == manifest(tmp_path / "ref")["splits"]["train"]["documents"]
        )
    # One document per line: the same documents (newlines inside became spaces: same tokens).
    rc, err = build(
        capsys,
        [tmp_path / "one_per_line.txt"],
        tmp_path / "lines",
        "--one_doc_per_line",
        tokenizer=tok,
    )
    assert rc == 0, err
    assert sum(
        manifest(tmp_path / "lines")["splits"][s]["documents"] for s in ("train", "validation")
    ) == len(docs)


def test_bad_files_are_skipped_counted_and_named(tmp_path, capsys, tok, docs):
    good = tmp_path / "good.txt"
    good.write_text("".join(d + "\n\n" for d in docs[:5]))
    (tmp_path / "empty.txt").write_bytes(b"")
    rng = np.random.default_rng(0)
    (tmp_path / "junk.txt").write_bytes(b"\x00" + rng.integers(0, 256, 5000, np.uint8).tobytes())
    (tmp_path / "bad_utf8.txt").write_bytes(b"A fine first line.\nbroken \xff\xfe bytes\nlast.\n")
    (tmp_path / "long.txt").write_bytes(b"short line\n" + b"word " * 400_000 + b"\nafter it\n")
    rc, err = build(
        capsys,
        [
            good,
            tmp_path / "empty.txt",
            tmp_path / "junk.txt",
            tmp_path / "bad_utf8.txt",
            tmp_path / "long.txt",
        ],
        tmp_path / "out",
        "--max_line_bytes",
        "100000",
        "--max_invalid_utf8_share",  # 1 of bad_utf8.txt's 3 lines: skipped, not failed
        "0.5",
        tokenizer=tok,
    )
    assert rc == 0, err
    m = manifest(tmp_path / "out")
    assert m["dropped"] == {
        "binary_file": 1,
        "empty_file": 1,
        "invalid_utf8_line": 1,
        "line_too_long": 1,
    }
    for where in ("empty.txt", "junk.txt", "bad_utf8.txt:2", "long.txt:2"):
        assert where in err, f"{where} not named in: {err}"
    # 5 good documents, bad_utf8.txt's remaining lines, long.txt's two short lines.
    assert sum(m["splits"][s]["documents"] for s in ("train", "validation")) == 7


def test_jsonl_bad_lines(tmp_path, capsys, tok):
    path = tmp_path / "x.jsonl"
    path.write_text(
        "\n".join(
            [
                json.dumps({"text": "The first good document is here."}),
                "{not json",
                json.dumps({"title": "no text field"}),
                json.dumps({"text": 5}),
                json.dumps({"text": "   "}),
                json.dumps(["a", "list"]),
                json.dumps({"text": "The second good document."}),
            ]
        )
        + "\n"
    )
    rc, err = build(capsys, [path], tmp_path / "out", tokenizer=tok)
    assert rc == 0, err
    m = manifest(tmp_path / "out")
    assert m["dropped"] == {
        "jsonl_invalid_json": 1,
        "jsonl_missing_field": 1,
        "jsonl_not_object": 1,
        "jsonl_field_not_text": 1,
        "empty_document": 1,
    }
    for where in ("x.jsonl:2", "x.jsonl:3", "x.jsonl:4", "x.jsonl:5", "x.jsonl:6"):
        assert where in err
    assert sum(m["splits"][s]["documents"] for s in ("train", "validation")) == 2


def test_unusable_inputs_fail_clearly_and_leave_no_manifest(tmp_path, capsys, tok):
    rc, err = build(capsys, [tmp_path / "nope.txt"], tmp_path / "o1", tokenizer=tok)
    assert rc == 2 and "nope.txt" in err and "does not exist" in err
    rc, err = build(capsys, [str(tmp_path / "*.missing")], tmp_path / "o1", tokenizer=tok)
    assert rc == 2 and "matches no file" in err

    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text("".join(json.dumps({"body": f"doc {k}"}) + "\n" for k in range(3)))
    rc, err = build(capsys, [wrong], tmp_path / "o2", tokenizer=tok)
    assert rc == 2 and "--text_field" in err and "'body'" in err
    assert not (tmp_path / "o2").exists()  # the failed build removed the folder it created
    rc, err = build(capsys, [wrong], tmp_path / "o2", "--text_field", "body", tokenizer=tok)
    assert rc == 0, err
    assert ShardReader(tmp_path / "o2").manifest["splits"]["train"]["documents"] >= 1

    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"content": ["a b c"]}), tmp_path / "p.parquet")
    rc, err = build(capsys, [tmp_path / "p.parquet"], tmp_path / "o3", tokenizer=tok)
    assert rc == 2 and "p.parquet" in err and "content" in err

    # a CSV is a table, not text: its header names the column, a row of the wrong width is one
    # counted bad record (before: read as text, header and quotes into the shards)
    (tmp_path / "t.csv").write_text('id,body\n1,"a b, c"\n2,x,y\n3,"d\ne f"\n')
    rc, err = build(capsys, [tmp_path / "t.csv"], tmp_path / "o5", tokenizer=tok)
    assert rc == 2 and "t.csv" in err and "no column 'text'" in err and "'body'" in err
    rc, err = build(
        capsys, [tmp_path / "t.csv"], tmp_path / "o5", "--text_field", "body", tokenizer=tok
    )
    assert rc == 0, err
    bad = manifest(tmp_path / "o5")["bad_records"]
    assert bad["by_reason"] == {"csv_bad_row": 1} and "2,x,y" in bad["examples"][0]["detail"]
    reader = ShardReader(tmp_path / "o5")
    splits = manifest(tmp_path / "o5")["splits"]
    assert splits["train"]["documents"] + splits["validation"]["documents"] == 2
    assert all(reader[i].input_ids.size for i in range(len(reader)))

    (tmp_path / "empty.txt").write_text("")
    rc, err = build(capsys, [tmp_path / "empty.txt"], tmp_path / "o4", tokenizer=tok)
    assert rc == 2 and "no usable document" in err and "empty.txt" in err
    assert not (tmp_path / "o4" / "manifest.json").exists()

    # A compressed file cut in the middle: the documents before the cut are kept, the cut is
    # reported with its line and counted (tests/data_prep/test_build_fuzz.py checks which ones).
    import zstandard

    text = "\n\n".join(pydoc_documents()).encode()  # zstd decodes whole 128 KiB blocks only
    for name, packed in (
        ("cut.txt.gz", gzip.compress(text)),
        ("cut.txt.zst", zstandard.ZstdCompressor().compress(text)),
    ):
        (tmp_path / name).write_bytes(packed[: len(packed) // 2])
        rc, err = build(capsys, [tmp_path / name], tmp_path / f"o5{name}", tokenizer=tok)
        assert rc == 0 and re.search(rf"{name}:\d+: compressed stream cut short", err), err
        assert manifest(tmp_path / f"o5{name}")["bad_records"]["by_reason"] == {"truncated_file": 1}

    (tmp_path / "ok.txt").write_text("A good term here.\n")
    rc, err = build(capsys, [tmp_path / "ok.txt"], tmp_path / "o7", "--no_lowercase", tokenizer=tok)
    assert rc == 2 and "--no_lowercase conflicts" in err

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="[UNK]"))
    bpe.pre_tokenizer = pre_tokenizers.Whitespace()
    bpe.train_from_iterator(
        ["a good term here"] * 10,
        trainers.BpeTrainer(
            vocab_size=60, special_tokens=["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
        ),
    )
    PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        mask_token="[MASK]",
    ).save_pretrained(str(tmp_path / "bpe"))
    rc, err = build(capsys, [tmp_path / "ok.txt"], tmp_path / "o8", tokenizer=str(tmp_path / "bpe"))
    assert rc == 2 and "BPE tokenizer" in err and "WordPiece" in err

    terms = tmp_path / "terms.txt"
    terms.write_bytes(b"good term\n\xff\xfe\n")
    rc, err = build(
        capsys,
        [tmp_path / "ok.txt"],
        tmp_path / "o6",
        "--protected_terms",
        str(terms),
        tokenizer=tok,
    )
    assert rc == 2 and "terms.txt:2" in err


def test_output_folder_guards(tmp_path, capsys, tok, docs):
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(d + "\n\n" for d in docs[:6]))
    out = tmp_path / "out"
    assert build(capsys, [corpus], out, tokenizer=tok)[0] == 0
    first = manifest(out)
    corpus.write_text(corpus.read_text())  # rewritten with the same content: same build
    rc, err = build(capsys, [corpus], out, tokenizer=tok)
    assert rc == 0 and "nothing to do" in err and manifest(out)["created"] == first["created"]
    with open(corpus, "a") as f:
        f.write("One more document.\n")
    rc, err = build(capsys, [corpus], out, tokenizer=tok)
    assert rc == 2 and "inputs" in err and "--overwrite" in err

    rc, err = build(capsys, [corpus], out, "--max_seq_len", "64", tokenizer=tok)
    assert rc == 2 and "max_seq_len" in err and "--overwrite" in err

    # Another tokenizer: the same vocabulary plus one word.
    from tokenizers import Tokenizer

    vocab = sorted(
        Tokenizer.from_file(f"{tok}/tokenizer.json").get_vocab().items(), key=lambda kv: kv[1]
    )
    (tmp_path / "vocab.txt").write_text("".join(t + "\n" for t, _ in vocab) + "zzznewword\n")
    rc, err = build(capsys, [corpus], out, tokenizer=str(tmp_path / "vocab.txt"))
    assert rc == 2 and "another tokenizer" in err and "--overwrite" in err
    rc, err = build(capsys, [corpus], out, "--overwrite", tokenizer=str(tmp_path / "vocab.txt"))
    assert rc == 0, err
    # A folder whose build trained its own vocabulary, then another tokenizer is given.
    trained = shutil.copytree(Path(tok).parent, tmp_path / "trained")
    rc, err = build(capsys, [corpus], trained, tokenizer=str(tmp_path / "vocab.txt"))
    assert rc == 2 and "another tokenizer" in err
    assert manifest(out)["tokenizer"]["fingerprint"] != first["tokenizer"]["fingerprint"]
    assert manifest(out)["tokenizer"]["vocab_size"] == len(vocab) + 1

    stranger = tmp_path / "stranger"
    stranger.mkdir()
    (stranger / "thesis.tex").write_text("precious")
    rc, err = build(capsys, [corpus], stranger, tokenizer=tok)
    assert rc == 2 and "not empty" in err
    rc, err = build(capsys, [corpus], stranger, "--overwrite", tokenizer=tok)
    assert rc == 2 and (stranger / "thesis.tex").exists()


def test_protected_terms_are_single_units(tmp_path, capsys, tok):
    from transformers import AutoTokenizer

    texts = [
        "Machine learning is fun, and MACHINE LEARNING pays in New York.",
        "I love new\nyork; machine-learning is not the term.",
        "宝玉说通灵宝玉丢了。那通灵宝玉是一块玉。",
    ]
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n\n".join(texts) + "\n")
    terms = tmp_path / "terms.txt"
    terms.write_text("machine learning\nNew York\n\n通灵宝玉\n")
    rc, err = build(
        capsys,
        [corpus],
        tmp_path / "with",
        "--protected_terms",
        str(terms),
        "--validation_fraction",
        "0",
        tokenizer=tok,
    )
    assert rc == 0, err
    rc, err = build(
        capsys, [corpus], tmp_path / "without", "--validation_fraction", "0", tokenizer=tok
    )
    assert rc == 0, err
    hf = AutoTokenizer.from_pretrained(tok)
    with_ws = [ShardReader(tmp_path / "with")[0], ShardReader(tmp_path / "without")[0]]
    # Map every document token to its place in the single packed sequence (after [CLS];
    # documents are separated by one [SEP]).
    pos, checked = 1, 0
    for text in texts:
        enc = hf(text, add_special_tokens=False, return_offsets_mapping=True)
        starts = [s for s, _ in enc["offset_mapping"]]
        np.testing.assert_array_equal(
            with_ws[0].input_ids[pos : pos + len(starts)], enc["input_ids"]
        )
        for m in re.finditer(r"machine\s+learning|new\s+york|通灵宝玉", text, re.IGNORECASE):
            inside = [k for k, s in enumerate(starts) if m.start() <= s < m.end()]
            assert len(inside) >= 2
            bits = with_ws[0].word_start[pos + inside[0] : pos + inside[-1] + 1]
            assert bits.tolist() == [True] + [False] * (len(inside) - 1), m.group()
            plain = with_ws[1].word_start[pos + inside[0] : pos + inside[-1] + 1]
            if m.group()[0].isascii():  # without the terms each English word is its own unit
                assert plain[1:].any()
            after = inside[-1] + 1
            if after < len(starts):
                assert with_ws[0].word_start[pos + after], f"token after {m.group()!r}"
            checked += 1
        pos += len(starts) + 1
    assert checked == 6  # 3 English occurrences in doc 1, 1 in doc 2, 2 Chinese
    assert manifest(tmp_path / "with")["protected_terms"] == 3


@pytest.mark.slow
def test_killed_build_resumes_to_identical_shards(tmp_path, capsys, tok):
    docs = pydoc_documents()
    corpus = tmp_path / "c.txt"
    corpus.write_text(
        "".join("\n".join(ln for ln in d.splitlines() if ln.strip()) + "\n\n" for d in docs * 2)
    )
    args = ["--shard_docs", "3", "--validation_fraction", "0.1", "--tokenizer", tok]
    ref = tmp_path / "ref"
    assert (
        main(["build", "--input", str(corpus), "--output", str(ref), "--workers", "2", *args]) == 0
    )
    capsys.readouterr()

    out = tmp_path / "out"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "data_prep",
            "build",
            "--input",
            str(corpus),
            "--output",
            str(out),
            "--workers",
            "1",
            *args,
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if len(list((out / ".work").glob("unit-*.json"))) >= 5:
            break
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the build finished before it could be killed"
    assert not (out / "manifest.json").exists()
    with pytest.raises(ShardError, match="not a finished"):
        ShardReader(out)

    assert (
        main(["build", "--input", str(corpus), "--output", str(out), "--workers", "2", *args]) == 0
    )
    kept = re.search(r"resumed, (\d+) finished shard", capsys.readouterr().out)
    assert kept and int(kept.group(1)) >= 5
    a, b = manifest(ref), manifest(out)
    assert a["splits"] == b["splits"] and a["dropped"] == b["dropped"]
    assert len(a["splits"]["train"]["shards"]) > 20
    assert not list(out.rglob("*.tmp-*")) and not (out / ".work").exists()
    assert main(["verify", str(out)]) == 0
