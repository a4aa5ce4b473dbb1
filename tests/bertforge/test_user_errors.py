"""One voice: data_prep and pretrain log warnings and errors in one format, entry points turn a
UserError into exit status 2 with one error line, and a missing path is called missing."""

from __future__ import annotations

import json
import re

from helpers.commands import run_cli

from bertforge.data_prep.inputs import DropCounter
from bertforge.pretrain.data.shard_check import _read_record
from bertforge.pretrain.plot import main as plot_main

LINE = re.compile(r"^\[(data_prep|pretrain)\] (WARNING|ERROR): \S")


def test_data_prep_and_pretrain_warnings_share_one_format(tmp_path, capsys):
    DropCounter().drop("not_utf8", "a.txt:3", "invalid start byte")
    unreadable = tmp_path / "verified_shards.json"
    unreadable.write_text("{not json")
    assert _read_record(unreadable) == {}
    out = capsys.readouterr().out.splitlines()  # warnings go to stdout, beside the progress
    assert out == [
        "[data_prep] WARNING: skipped a.txt:3: invalid start byte [not_utf8]",
        f"[pretrain] WARNING: {unreadable} is unreadable; verifying the shards again",
    ]
    assert all(LINE.match(line) for line in out)


def test_an_entry_point_turns_a_user_error_into_one_error_line_and_status_2(tmp_path, capsys):
    assert plot_main([str(tmp_path / "metrics.jsonl")]) == 2
    got = capsys.readouterr()
    assert got.out == ""
    (line,) = got.err.splitlines()
    assert LINE.match(line) and line.startswith("[pretrain] ERROR: ") and "no such metrics" in line


def test_inspect_of_a_missing_folder_says_it_is_missing_and_to_run_the_build(tmp_path):
    nope = tmp_path / "NOPE"
    proc = run_cli("-m", "bertforge", "inspect", str(nope), check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{nope}: no such folder" in proc.stderr and "no manifest.json" in proc.stderr
    assert "bertforge prep build" in proc.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run_cli("-m", "bertforge", "inspect", str(empty), check=False)
    assert proc.returncode == 2 and "manifest.json not found" in proc.stderr
    assert "Rerun `bertforge prep build`" in proc.stderr


def test_export_of_a_missing_or_empty_run_says_no_complete_checkpoint_there(tmp_path):
    for run, said in ((tmp_path / "NOPE", "no such folder"), (tmp_path, "export")):
        proc = run_cli(
            "-m", "bertforge", "export", str(run), "--output", str(tmp_path / "X"), check=False
        )
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        (line,) = proc.stderr.splitlines()
        assert line.startswith(f"[pretrain] ERROR: export {run}: ") and said in line
        assert "no complete checkpoint there" in line and "RUN/checkpoints" in line
    assert not (tmp_path / "X").exists()


def test_demo_fill_mask_of_a_missing_model_folder_says_it_is_missing(tmp_path):
    nope = tmp_path / "NOPE"
    proc = run_cli("-m", "bertforge", "demo", "--fill_mask", str(nope), check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "Repo id" not in proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"[pretrain] ERROR: --fill_mask {nope}: no such folder")
    assert "bertforge export RUN --output" in line


def test_doctor_names_the_line_of_a_malformed_deepspeed_json_as_the_trainer_does(tmp_path):
    bad = tmp_path / "ds.json"
    bad.write_text('{"train_batch_size": 8,\n "zero_optimization": {"stage": 2,}}\n')
    proc = run_cli(
        "-m", "pretrain.doctor", "--ds_config", str(bad), "--data", str(tmp_path), "--json",
        check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    (row,) = json.loads(proc.stdout)
    assert row["check"] == "ds_config" and row["status"] == "FAIL"
    assert row["detail"].startswith(f"{bad}:2:35: invalid JSON")
