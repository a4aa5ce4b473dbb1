"""Habits on the data side (issue 17): `data_prep build` logs plain lines when not on a terminal,
and `data_prep inspect` marks units and protected terms and counts each term's occurrences."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from helpers.commands import run_cli

from bertforge.data_prep.progress import Progress, resolve_mode

TERMS = ["floating point", "keyword argument", "namespace", "quantum chromodynamics"]


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_auto_mode_is_a_bar_on_a_terminal_and_lines_elsewhere():
    assert resolve_mode("auto", _Tty()) == "bar"
    assert resolve_mode("auto", io.StringIO()) == "lines"
    assert resolve_mode("false", _Tty()) == "off" and resolve_mode("true", _Tty()) == "bar"
    with pytest.raises(ValueError, match="--progress must be one of"):
        resolve_mode("sometimes")


def test_lines_every_n_steps_and_every_t_seconds(monkeypatch):
    out = io.StringIO()
    p = Progress(10, desc="train", unit="step", mode="lines", every_steps=3, stream=out)
    for _ in range(10):
        p.update(1, loss=2.5)
    p.close()
    text = out.getvalue()
    assert "\r" not in text
    assert [int(m) for m in re.findall(r"^train (\d+)/10 step", text, re.M)] == [3, 6, 9, 10]
    assert "loss 2.5" in text and "ETA" in text

    clock = [0.0]
    monkeypatch.setattr("bertforge.data_prep.progress.time.monotonic", lambda: clock[0])
    out = io.StringIO()
    p = Progress(None, desc="data_prep", unit="shard", mode="lines", every_s=30.0, stream=out)
    for _ in range(7):
        clock[0] += 10.0
        p.update(1)
    p.close()  # the last unit (7) comes after the line at 6: close adds it
    assert [int(m) for m in re.findall(r"^data_prep (\d+) shard", out.getvalue(), re.M)] == [
        3,
        6,
        7,
    ]


def test_a_forced_bar_still_draws_a_bar():
    out = io.StringIO()
    p = Progress(3, desc="train", unit="step", mode="bar", stream=out)
    p.update(3, loss=1.0)
    p.close()
    assert "\r" in out.getvalue() and "3/3" in out.getvalue()


@pytest.fixture(scope="module")
def termed_build(english_corpus, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("habits_terms")
    terms = tmp / "terms.txt"
    terms.write_text("\n".join(TERMS) + "\n", encoding="utf-8")
    out = tmp / "shards"
    proc = run_cli(
        "-m",
        "data_prep",
        "build",
        "--input",
        str(english_corpus),
        "--output",
        str(out),
        "--vocab_size",
        "2000",
        "--max_seq_len",
        "128",
        "--workers",
        "1",
        "--shard_docs",
        "20",
        "--validation_fraction",
        "0.05",
        "--protected_terms",
        str(terms),
        "--progress",
        "lines",
        "--progress_interval_s",
        "0",
    )
    return out, terms, proc


def test_build_logs_one_plain_line_per_shard(termed_build):
    out, _, proc = termed_build
    assert "\r" not in proc.stderr
    units = len(json.loads((out / "manifest.json").read_text())["splits"]["train"]["shards"])
    lines = re.findall(r"^data_prep (\d+) shard \| tokens ([\d,]+)", proc.stderr, re.M)
    assert [int(n) for n, _ in lines] == list(range(1, units + 1))


def _reference_counts(root: Path) -> dict[str, int]:
    """Occurrences by the build's own regex on each decoded sequence (an independent count)."""
    from tokenizers import Tokenizer

    from bertforge.data_prep.reader import ShardReader
    from bertforge.data_prep.wordstart import _term_pattern

    tok = Tokenizer.from_file(str(root / "tokenizer" / "tokenizer.json"))
    counts = dict.fromkeys(TERMS, 0)
    for split in ("train", "validation"):
        for s in ShardReader(root, split):
            text = tok.decode(s.input_ids.tolist())
            for t in TERMS:
                counts[t] += len(re.findall(_term_pattern(t), text, re.IGNORECASE))
    return counts


def test_inspect_counts_and_marks_protected_terms(termed_build):
    out, _, _ = termed_build
    s = json.loads(run_cli("-m", "data_prep", "inspect", str(out), "--json").stdout)
    pt = s["protected_terms"]
    ref = _reference_counts(out)
    assert {t: c["occurrences"] for t, c in pt["terms"].items()} == ref
    assert ref["floating point"] > 0 and pt["not_found"] == ["quantum chromodynamics"]
    # The build used these terms: every occurrence is one whole-word unit.
    assert all(c["whole"] == c["occurrences"] for c in pt["terms"].values())
    text = run_cli("-m", "data_prep", "inspect", str(out)).stdout
    assert "not found: quantum chromodynamics" in text
    assert re.search(
        rf"{ref['floating point']:>8,} \({ref['floating point']:,}\)  floating point", text
    )


def test_inspect_shows_a_lexicon_the_build_did_not_use(english_shards, termed_build, tmp_path):
    """Shards built without terms: multi-token terms are split over units, and inspect says so."""
    from bertforge.data_prep.reader import ShardReader
    from bertforge.data_prep.unit_marks import TermMatcher, mark_tokens

    _, terms, _ = termed_build
    s = json.loads(
        run_cli(
            "-m",
            "data_prep",
            "inspect",
            str(english_shards),
            "--json",
            "--protected_terms",
            str(terms),
        ).stdout
    )
    assert "built without protected terms" in s["protected_terms_warning"]
    fp = s["protected_terms"]["terms"]["floating point"]
    assert fp["occurrences"] > 0 and fp["whole"] < fp["occurrences"]

    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(english_shards / "tokenizer" / "tokenizer.json"))
    matcher = TermMatcher(TERMS, tok)
    for smp in ShardReader(english_shards, "train"):
        found = [
            o
            for o in matcher.find(smp.input_ids.astype("int64"))
            if TERMS[o[0]] == "floating point"
        ]
        if found:
            tokens = [tok.id_to_token(int(t)) for t in smp.input_ids]
            marked = mark_tokens(tokens, smp.word_start, found)
            # "floating" and "point" are two units here: the mark shows where the second starts.
            assert "«floating ¦point»" in marked
            break
    else:
        pytest.fail("no 'floating point' in the corpus")


def test_trainer_flags_keep_the_old_progress_spelling(english_shards, capsys):
    from bertforge.pretrain.config.cli import parse_args

    base = ["--data", str(english_shards)]
    assert parse_args([*base, "--progress", "false"]).log.progress == "off"
    assert parse_args([*base, "--progress", "lines"]).log.progress == "lines"
    assert parse_args(base).log.progress == "auto"
    for bad in (["--progress", "loud"], ["--show_masks", "4"]):  # show_masks needs --dry-run
        with pytest.raises(SystemExit):
            parse_args([*base, *bad])
    assert "--show_masks N" in capsys.readouterr().err
