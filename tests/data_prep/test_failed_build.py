"""A failed `python -m data_prep build` leaves --output as it was (or absent, if it was new); an
interruption keeps the resumable state and says so; --overwrite never costs the earlier build."""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers.commands import REPO

from bertforge.data_prep import ShardReader, units
from bertforge.data_prep.__main__ import main
from bertforge.data_prep.report import verify
from bertforge.data_prep.sample_corpus import pydoc_documents


@pytest.fixture(scope="module")
def tok(english_shards) -> str:
    """A trained tokenizer folder, so that these builds skip training."""
    return str(english_shards / "tokenizer")


@pytest.fixture
def corpus(tmp_path) -> Path:
    """30 documents: 6 work units of 5 with --shard_docs 5."""
    docs = ["\n".join(ln for ln in d.splitlines() if ln.strip()) for d in pydoc_documents()[:30]]
    path = tmp_path / "corpus.txt"
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def no_field(tmp_path) -> Path:
    """A jsonl file without the text field: bad configuration found mid-build (read after the
    units of the corpus before it were written)."""
    path = tmp_path / "zz_no_field.jsonl"
    path.write_text("".join(json.dumps({"body": f"doc {k}"}) + "\n" for k in range(3)))
    return path


def run(capsys, inputs, out: Path, *extra: str, tok: str) -> tuple[int, str]:
    args = ["build", "--input", *map(str, inputs), "--output", str(out), "--tokenizer", tok]
    rc = main([*args, "--workers", "1", "--shard_docs", "5", *extra])
    got = capsys.readouterr()
    return rc, got.out + got.err


def tree(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (relative path -> sha256): what "as it was" means."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def siblings(out: Path) -> list[str]:
    """What a build left beside OUT, the lock files excepted."""
    return sorted(p.name for p in out.parent.iterdir() if not p.name.endswith(".lock"))


def test_bad_input_mid_build_removes_a_new_output(tmp_path, capsys, corpus, no_field, tok):
    out = tmp_path / "new"
    rc, err = run(capsys, [corpus, no_field], out, tok=tok)
    assert rc == 2 and "--text_field" in err and "zz_no_field.jsonl" in err
    assert not out.exists(), "a failed build must not create its output folder"
    assert "removed (this command created it)" in err
    assert siblings(out) == sorted(p.name for p in (corpus, no_field))


def test_bad_input_leaves_an_empty_output_empty(tmp_path, capsys, corpus, no_field, tok):
    out = tmp_path / "empty"
    out.mkdir()
    rc, _ = run(capsys, [corpus, no_field], out, tok=tok)
    assert rc == 2 and out.is_dir() and not any(out.iterdir())


def test_failed_overwrite_keeps_the_earlier_build(tmp_path, capsys, corpus, no_field, tok):
    out = tmp_path / "shards"
    assert run(capsys, [corpus], out, tok=tok)[0] == 0
    before = tree(out)
    rc, err = run(capsys, [corpus, no_field], out, "--overwrite", tok=tok)
    assert rc == 2 and "--text_field" in err
    assert tree(out) == before, "the earlier complete build must be untouched"
    assert siblings(out) == sorted(["shards", corpus.name, no_field.name])
    verify(out)


def test_overwrite_replaces_the_build_once_complete(tmp_path, capsys, corpus, tok):
    out = tmp_path / "shards"
    assert run(capsys, [corpus], out, tok=tok)[0] == 0
    rc, err = run(capsys, [corpus], out, "--overwrite", "--max_seq_len", "64", tok=tok)
    assert rc == 0, err
    m = ShardReader(out, "train").manifest
    assert m["build_key"]["sequences"]["max_seq_len"] == 64 and not (out / ".work").exists()
    assert siblings(out) == sorted(["shards", corpus.name])  # no staging or old folder left
    verify(out)


def _interrupt_at_unit(monkeypatch, stop_at: int) -> None:
    """Ctrl-C while work unit ``stop_at`` is being built (in-process: --workers 1)."""
    real = units.run_unit

    def run_unit(job):
        if job[0] == stop_at:
            raise KeyboardInterrupt
        return real(job)

    monkeypatch.setattr(units, "run_unit", run_unit)


def test_interruption_keeps_the_resumable_state_and_says_so(
    tmp_path, capsys, corpus, tok, monkeypatch
):
    out = tmp_path / "shards"
    _interrupt_at_unit(monkeypatch, 3)
    rc, err = run(capsys, [corpus], out, tok=tok)
    assert rc == 130
    assert "interrupted" in err and "3 finished work unit(s)" in err and "resume" in err
    assert len(list((out / ".work").glob("unit-*.json"))) == 3
    assert not (out / "manifest.json").exists()
    monkeypatch.undo()
    rc, err = run(capsys, [corpus], out, tok=tok)
    assert rc == 0 and "resumed, 3 finished shard(s) kept" in err
    fresh = tmp_path / "fresh"
    assert run(capsys, [corpus], fresh, tok=tok)[0] == 0
    shards = {k: v for k, v in tree(out).items() if k != "manifest.json"}  # it names its folder
    assert shards == {k: v for k, v in tree(fresh).items() if k != "manifest.json"}


def test_interrupted_overwrite_resumes_beside_the_earlier_build(
    tmp_path, capsys, corpus, tok, monkeypatch
):
    out = tmp_path / "shards"
    assert run(capsys, [corpus], out, tok=tok)[0] == 0
    before = tree(out)
    _interrupt_at_unit(monkeypatch, 2)
    rc, err = run(capsys, [corpus], out, "--overwrite", "--max_seq_len", "64", tok=tok)
    assert rc == 130 and "the earlier build in" in err
    assert tree(out) == before
    monkeypatch.undo()
    rc, err = run(capsys, [corpus], out, "--overwrite", "--max_seq_len", "64", tok=tok)
    assert rc == 0 and "resumed, 2 finished shard(s) kept" in err
    assert ShardReader(out, "train").manifest["build_key"]["sequences"]["max_seq_len"] == 64
    assert siblings(out) == sorted(["shards", corpus.name])


def test_a_killed_worker_ends_the_build_instead_of_hanging(tmp_path, capsys, corpus, tok):
    """A worker killed (as the kernel's OOM killer does) must not leave the build waiting for
    its unit forever; the finished units stay for a resume."""
    out = tmp_path / "shards"

    def kill_first_worker() -> None:
        for _ in range(600):
            children = mp.active_children()
            if children:
                os.kill(children[0].pid, signal.SIGKILL)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_first_worker, daemon=True)
    killer.start()
    args = ["build", "--input", str(corpus), "--output", str(out), "--tokenizer", tok]
    with pytest.raises(RuntimeError, match="worker process died"):
        main([*args, "--workers", "2", "--shard_docs", "5"])
    killer.join()
    got = capsys.readouterr()
    assert "rerun the same command to resume" in got.out + got.err
    assert (out / ".work" / "build.json").is_file() and not (out / "manifest.json").exists()


def test_a_failed_part_removes_only_its_own_units(
    tmp_path, capsys, corpus, no_field, tok, monkeypatch
):
    """Part 1 of 2 fails on bad input: its own unit files go, while a file another part wrote
    meanwhile (here: unit 0's, written during part 1's run) and `prepare`'s tokenizer stay."""
    out = tmp_path / "shards"
    args = ["--input", str(corpus), str(no_field), "--output", str(out), "--tokenizer", tok]
    assert main(["prepare", *args, "--shard_docs", "5"]) == 0
    prepared = tree(out)
    real = units.run_unit

    def beside_another_part(job):
        (out / "train").mkdir(exist_ok=True)
        (out / "train" / "shard-00000.tokens").write_bytes(b"part 0's")
        return real(job)

    monkeypatch.setattr(units, "run_unit", beside_another_part)
    rc, err = run(
        capsys, [corpus, no_field], out, "--num_partitions", "2", "--partition", "1", tok=tok
    )
    assert rc == 2 and "--text_field" in err
    assert tree(out) == {
        **prepared,
        "train/shard-00000.tokens": hashlib.sha256(b"part 0's").hexdigest(),
    }


def test_sigterm_keeps_the_resumable_state_and_says_so(tmp_path, tok):
    """A batch system's SIGTERM (a SLURM time limit) is an interruption like Ctrl-C."""
    docs = pydoc_documents()
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join("\n".join(d.splitlines()) + "\n\n" for d in docs * 2))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "bertforge.data_prep", "build", "--input", str(corpus)]
    cmd += ["--output", str(out), "--tokenizer", tok, "--workers", "1", "--shard_docs", "3"]
    proc = subprocess.Popen(
        cmd, cwd=REPO, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if len(list((out / ".work").glob("unit-*.json"))) >= 2:
            break
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, "the build finished before it could be stopped"
    assert "Traceback" not in stderr
    assert (
        "interrupted" in stdout + stderr and "rerun the same command to resume" in stdout + stderr
    )
    assert (out / ".work" / "build.json").is_file() and not (out / "manifest.json").exists()
