"""Bad task input gets a clear error naming the file and the line (or the key)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertforge.pretrain.data.downstream_tasks import TaskError, TaskSpec, load_task, load_task_file
from bertforge.pretrain.evaluate.__main__ import main


def _spec(tmp_path: Path, name: str, text: str, **kw) -> TaskSpec:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    kind = "token_classification" if name.endswith(".conll") else "classification"
    return TaskSpec(name="t", type=kind, train=str(path), **kw)


def _rows(*pairs: tuple[str, str]) -> str:
    return "".join(json.dumps({"text": t, "label": lab}) + "\n" for t, lab in pairs)


def test_unknown_label_in_test_file(tmp_path):
    (tmp_path / "test.jsonl").write_text(_rows(("good", "pos"), ("meh", "neutral")), "utf-8")
    spec = _spec(
        tmp_path,
        "train.jsonl",
        _rows(*[(f"t{i}", "pos" if i % 2 else "neg") for i in range(30)]),
        test=str(tmp_path / "test.jsonl"),
    )
    with pytest.raises(TaskError, match=r"test\.jsonl:2: label 'neutral' does not occur"):
        load_task(spec)


def test_empty_line_jsonl_and_csv(tmp_path):
    spec = _spec(tmp_path, "a.jsonl", _rows(("x", "a")) + "\n" + _rows(("y", "b")))
    with pytest.raises(TaskError, match=r"a\.jsonl:2: empty line"):
        load_task(spec)
    spec = _spec(tmp_path, "b.csv", "text,label\nx,a\n\ny,b\n")
    with pytest.raises(TaskError, match=r"b\.csv:3: empty line"):
        load_task(spec)


def test_unknown_column(tmp_path):
    spec = _spec(tmp_path, "a.jsonl", _rows(("x", "a")), text_column="sentence")
    with pytest.raises(TaskError, match=r"a\.jsonl:1: no column 'sentence'; columns present"):
        load_task(spec)
    spec = _spec(tmp_path, "b.tsv", "text\tlabel\nx\ta\n", label_column="gold")
    with pytest.raises(TaskError, match=r"b\.tsv:2: no column 'gold'"):
        load_task(spec)


def test_csv_row_with_another_field_count(tmp_path):
    spec = _spec(tmp_path, "c.csv", "text,label\nx,a\ny,b,extra\n")
    with pytest.raises(TaskError, match=r"c\.csv:3: 3 fields, the header has 2"):
        load_task(spec)


def test_conll_mismatched_columns(tmp_path):
    spec = _spec(tmp_path, "n.conll", "EU NNP B-ORG\nrejects VBZ O\n\nPeter B-PER\n")
    with pytest.raises(TaskError, match=r"n\.conll:4: 2 columns where the file's first line has 3"):
        load_task(spec)


def test_tasks_file_unknown_key(tmp_path):
    path = tmp_path / "tasks.json"
    path.write_text(
        json.dumps(
            {
                "tasks": [
                    {"name": "a", "type": "classification", "train": "a.jsonl", "text_col": "x"}
                ]
            }
        )
    )
    with pytest.raises(
        TaskError, match=r"tasks\.json: tasks\[0\] has unknown key\(s\) \['text_col'\]"
    ):
        load_task_file(path)


def test_cli_reports_bad_input_with_exit_status_2(tmp_path, capsys):
    (tmp_path / "a.jsonl").write_text(_rows(("x", "a")) + "\n", encoding="utf-8")
    code = main(
        [
            "--models",
            str(tmp_path),
            "--out",
            str(tmp_path / "out"),
            "--type",
            "classification",
            "--train",
            str(tmp_path / "a.jsonl"),
        ]
    )
    assert code == 2
    assert "a.jsonl:2: empty line" in capsys.readouterr().err


def test_not_utf8_names_the_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(
        _rows(("x", "a")).encode() + '{"text": "caf\xe9", "label": "b"}\n'.encode("latin-1")
    )
    with pytest.raises(TaskError, match=r"latin1\.jsonl:2: not UTF-8"):
        load_task(TaskSpec(name="t", type="classification", train=str(path)))
