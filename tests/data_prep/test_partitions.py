"""Builds split across machines: N parts built one after another = one build of the whole."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers.commands import REPO

from bertforge.data_prep.__main__ import main


def build_args(corpus: Path, tokenizer: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--input",
        str(corpus),
        "--output",
        str(out),
        "--tokenizer",
        str(tokenizer),
        "--validation_fraction",
        "0.05",
        "--shard_docs",
        "9",
        "--workers",
        "1",
        *extra,
    ]


def shard_files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for split in ("train", "validation")
        for p in sorted((root / split).iterdir())
    }


def test_parts_give_the_shards_of_one_build_and_merge_waits_for_all(
    tmp_path, english_corpus, english_shards, capsys
):
    tok = english_shards / "tokenizer"
    whole, parted = tmp_path / "whole", tmp_path / "parted"

    def args(out: Path, *extra: str) -> list[str]:  # decontaminating: `prepare` makes the index
        return build_args(english_corpus, tok, out, "--decontaminate", *extra)

    assert main(["build", *args(whole)]) == 0
    n = 3
    part = ["--num_partitions", str(n), "--partition"]

    # A part before `prepare` is refused and says what to run.
    assert main(["build", *args(parted), *part, "0"]) == 2
    assert "bertforge prep prepare" in capsys.readouterr().err
    assert main(["prepare", *args(parted)]) == 0
    # Another part's unfinished file (unit 0 belongs to part 0) survives part 1's start.
    (parted / "train").mkdir()
    foreign = parted / "train" / "shard-00000.tokens.tmp-99999"
    foreign.write_bytes(b"being written by part 0")
    assert main(["build", *args(parted), *part, "1"]) == 0
    assert foreign.is_file()
    foreign.unlink()
    # A part run with other arguments is refused; merge refuses while parts are missing.
    assert main(["build", *args(parted, "--seed", "7"), *part, "2"]) == 2
    assert "seed" in capsys.readouterr().err
    assert main(["build", *args(parted), *part, "2"]) == 0
    assert not (parted / "manifest.json").exists()
    assert main(["merge", str(parted)]) == 2
    assert "part(s) [0] of 3 not finished" in capsys.readouterr().err

    records = {
        k: json.loads((parted / ".work" / f"part-{k}-of-{n}.json").read_text()) for k in (1, 2)
    }
    assert main(["build", *args(parted), *part, "0"]) == 0  # merges
    assert (parted / "manifest.json").is_file() and not (parted / ".work").exists()

    # Every unit in exactly one part, and the shards byte for byte those of the whole build.
    whole_m = json.loads((whole / "manifest.json").read_text())
    parted_m = json.loads((parted / "manifest.json").read_text())
    total = records[1]["total_units"]
    owned = sorted(u for r in records.values() for u in r["units"])
    assert owned == sorted(u for u in range(total) if u % n != 0)
    assert total == len(whole_m["splits"]["train"]["shards"]) > n
    assert shard_files(parted) == shard_files(whole)
    assert parted_m["splits"] == whole_m["splits"] and parted_m["dropped"] == whole_m["dropped"]
    assert parted_m["partitions"] == n
    assert parted_m["decontamination"] == whole_m["decontamination"]
    assert whole_m["decontamination"]["train_documents_checked"] > 0
    # A rerun of a part after the merge has nothing to do.
    assert main(["build", *args(parted), *part, "1"]) == 0


def test_merge_refuses_parts_of_another_build(tmp_path, english_corpus, english_shards, capsys):
    tok = english_shards / "tokenizer"
    out = tmp_path / "out"
    assert main(["prepare", *build_args(english_corpus, tok, out)]) == 0
    for k in (0, 1):
        assert (
            main(
                [
                    "build",
                    *build_args(english_corpus, tok, out),
                    "--num_partitions",
                    "2",
                    "--partition",
                    str(k),
                ]
            )
            == 0
        )
        if k == 0:  # tamper with part 0's record before part 1 finishes (and would merge)
            rec_path = out / ".work" / "part-0-of-2.json"
            rec = json.loads(rec_path.read_text())
            rec["build_key"]["seed"] = 99
            rec_path.write_text(json.dumps(rec))
    assert not (out / "manifest.json").exists()
    assert main(["merge", str(out)]) == 2
    err = capsys.readouterr().err
    assert "part 0 was built with other arguments" in err and "seed" in err
    assert (
        main(
            [
                "build",
                *build_args(english_corpus, tok, out),
                "--num_partitions",
                "2",
                "--partition",
                "2",
            ]
        )
        == 2
    )
    assert "--partition must be in [0, --num_partitions)" in capsys.readouterr().err


def test_parts_running_at_once_merge_once(tmp_path, english_corpus, english_shards):
    """Two parts started together on one folder (as an array job does): the last to finish
    writes the manifest, and the shards are those of one build of the whole."""
    tok = english_shards / "tokenizer"
    whole, parted = tmp_path / "whole", tmp_path / "parted"
    assert main(["build", *build_args(english_corpus, tok, whole)]) == 0
    assert main(["prepare", *build_args(english_corpus, tok, parted)]) == 0
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "data_prep",
                "build",
                *build_args(english_corpus, tok, parted),
                "--num_partitions",
                "2",
                "--partition",
                str(k),
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for k in range(2)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert sum("wrote" in out for out in outputs) >= 1
    assert shard_files(parted) == shard_files(whole)
    assert not (parted / ".work").exists()
