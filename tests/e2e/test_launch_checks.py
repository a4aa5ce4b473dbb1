"""What a launch checks and says: shard sha256 once per run folder, a corrupt shard refused, a
missing RNG file on resume warned about, and a broken torch reported by the doctor."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.commands import REPO
from helpers.launch import ds_config

from bertforge.data_prep import shard_files as reader_module  # where the reader hashes
from bertforge.data_prep.reader import ShardError
from bertforge.pretrain.data.shard_check import verify_once
from bertforge.pretrain.run_folder.layout import RunFolder


def _train(shards: Path, run: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "pretrain/main.py", "--data", str(shards), "--output_dir", str(run)]
    cmd += ["--ds_config", str(REPO / "ds_configs" / "cpu.json"), "--model", "tiny"]
    cmd += ["--num_workers", "0", "--global_batch_size", "4", "--micro_batch_size", "4"]
    cmd += ["--eval_batches", "1", "--progress", "false", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def _shard_files(shards: Path) -> list[Path]:
    manifest = json.loads((shards / "manifest.json").read_text())
    return [
        shards / split / name
        for split, info in manifest["splits"].items()
        for shard in info["shards"]
        for name in shard["files"]
    ]


def _copy(shards: Path, dest: Path) -> Path:
    shutil.copytree(shards, dest)
    return dest


def _count_hashes(monkeypatch) -> list[Path]:
    seen: list[Path] = []
    real = reader_module.sha256_file

    def counting(path, *a, **k):
        seen.append(Path(path))
        return real(path, *a, **k)

    monkeypatch.setattr(reader_module, "sha256_file", counting)
    return seen


def test_sha256_verified_once_per_manifest(english_shards, tmp_path, monkeypatch):
    shards = _copy(english_shards, tmp_path / "shards")
    run = tmp_path / "run"
    hashed = _count_hashes(monkeypatch)
    assert verify_once([shards], run) == [shards.resolve()]
    assert sorted(hashed) == sorted(_shard_files(shards))  # every file of every split
    record = json.loads(RunFolder(run).verified_shards.read_text())["folders"]
    assert str(shards.resolve()) in record
    hashed.clear()
    assert verify_once([shards], run) == [] and hashed == []  # remembered: nothing read
    # A rebuilt folder (another manifest) is verified again.
    manifest = json.loads((shards / "manifest.json").read_text())
    manifest["created"] = "rebuilt"
    (shards / "manifest.json").write_text(json.dumps(manifest))
    assert verify_once([shards], run) == [shards.resolve()] and hashed


def test_corrupt_shard_byte_refused_at_first_launch(english_shards, tmp_path):
    shards = _copy(english_shards, tmp_path / "shards")
    victim = _shard_files(shards)[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the sha256 can tell
    victim.write_bytes(bytes(data))
    with pytest.raises(ShardError, match="sha256 differs"):
        verify_once([shards], tmp_path / "unit_run")
    proc = _train(shards, tmp_path / "run", "--max_steps", "1")
    assert proc.returncode == 2, proc.stderr
    assert f"{victim}: sha256 differs from the manifest" in proc.stderr
    assert not RunFolder(tmp_path / "run").verified_shards.exists()
    assert not RunFolder(tmp_path / "run").lock.exists()  # released on the error


def test_verified_once_stale_lock_taken_over_missing_rng_warned(english_shards, tmp_path):
    run = tmp_path / "run"
    first = _train(english_shards, run, "--max_steps", "2", "--save_interval", "2")
    assert first.returncode == 0, first.stderr
    assert "shard files in" in first.stdout and "verified (done once" in first.stdout
    assert RunFolder(run).verified_shards.is_file() and not RunFolder(run).lock.exists()
    folder = RunFolder(run)  # the files of a real run are where the one layout says
    assert all(p.exists() for p in (folder.checkpoints, folder.metrics, folder.config))
    assert folder.recipe.is_file() and folder.tokenizer.is_dir()
    rng = run / "checkpoints" / "step_00000002" / "rng" / "rank_00000.pt"
    assert rng.is_file()
    rng.unlink()
    # The previous job was killed (-9) and left its lock: the resume takes it over with a warning.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    held = {"host": socket.gethostname(), "pid": dead.pid, "started": 0, "command": []}
    (run / ".lock").write_text(json.dumps(held))
    second = _train(english_shards, run, "--max_steps", "3", "--resume", "auto")
    assert second.returncode == 0, second.stderr
    taken = f"taking over the lock of run folder {run.resolve()} from pid {dead.pid}"
    assert taken in second.stdout  # a warning: stdout, beside the progress lines
    assert not (run / ".lock").exists()
    assert "verified (done once" not in second.stdout  # the resume skipped the sha256 pass
    assert f"WARNING: {rng} is missing" in second.stdout
    assert "this resume is not exact" in second.stdout


def test_doctor_reports_a_broken_torch_as_a_failing_row(english_shards, tmp_path):
    from bertforge.pretrain.doctor.checks import FAIL, device_rows

    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise OSError('libcudart.so.12: cannot open shared file')")
    probe = [sys.executable, str(REPO / "pretrain" / "doctor" / "probe.py")]
    arg = json.dumps({"data": str(english_shards), "output_dir": str(tmp_path / "run")})
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "fake")}
    out = subprocess.run(probe + [arg], env=env, capture_output=True, text=True, timeout=120)
    line = next(x for x in out.stdout.splitlines() if x.startswith("DOCTOR_PROBE "))
    result = json.loads(line.removeprefix("DOCTOR_PROBE "))
    assert "libcudart.so.12" in result["torch_error"]
    rows = device_rows({"gpu-node": result}, {"gpu-node": 8}, {})
    assert [(r.check, r.status) for r in rows] == [("devices", FAIL)]
    assert "torch fails to load (OSError: libcudart.so.12" in rows[0].detail
    assert "CPU" not in rows[0].detail and "repair torch on gpu-node" in rows[0].fix


# --- the dry run checks what the launch checks -------------------------------------------------


def _dry_run(shards: Path, run: Path, *extra: str, capsys) -> tuple[int, str, str]:
    """`pretrain/main.py --dry-run` in-process: (exit status, stdout, stderr)."""
    from bertforge.pretrain.config.cli import parse_args
    from bertforge.pretrain.main import main

    capsys.readouterr()
    argv = ["--data", str(shards), "--output_dir", str(run), "--model", "tiny", "--dry-run"]
    code = main([*argv, "--num_workers", "0", *extra])
    out, err = capsys.readouterr()
    assert parse_args(argv).run.dry_run
    return code, out, err


def test_dry_run_fails_on_a_malformed_deepspeed_config_as_the_launch_does(
    english_shards, tmp_path, capsys
):
    bad = tmp_path / "bad.json"
    bad.write_text('{\n  "train_batch_size": 32,\n  "train_micro_batch_size_per_gpu": 8,\n'
                   '  "optimizer": {"type": "AdamW",, "params": {"lr": 1e-3}}\n}\n')  # fmt: skip
    message = f"{bad}:4:33: invalid JSON"
    code, out, err = _dry_run(
        english_shards, tmp_path / "dry", "--ds_config", str(bad), capsys=capsys
    )
    assert code == 2 and message in err and "dry run" not in out
    launch = _train(english_shards, tmp_path / "run", "--ds_config", str(bad), "--max_steps", "1")
    assert launch.returncode == 2 and message in launch.stderr


def test_dry_run_reports_what_the_deepspeed_config_resolves(english_shards, tmp_path, capsys):
    """A JSON that gives the batch and lr (as users' own configs do): micro-batch 8 x
    accumulation 2 per rank (16 sequences a step on one process), AdamW at lr 5e-4; the masking
    statistics are drawn at that micro-batch, and the mask rate prints as given (0.2, not
    0.19999999999999998). A flag for a value the JSON gives is refused, naming both."""
    path = ds_config(
        tmp_path,
        "given.json",
        train_micro_batch_size_per_gpu=8,
        gradient_accumulation_steps=2,
        optimizer={"params": {"lr": 5e-4, "torch_adam": True}},
    )
    args = ("--ds_config", str(path), "--mask_prob", "0.2", "--json")
    code, out, _ = _dry_run(english_shards, tmp_path / "dry", *args, capsys=capsys)
    assert code == 0
    report = json.loads(out)
    batch, optim = report["config"]["batch"], report["config"]["optim"]
    split = {k: batch[k] for k in ("global_batch_size", "micro_batch_size", "grad_accum")}
    assert split == {"global_batch_size": 16, "micro_batch_size": 8, "grad_accum": 2}
    assert optim["lr"] == 0.0005 and optim["optimizer"] == "AdamW" and optim["weight_decay"] == 0.01
    assert report["config"]["precision"]["precision"] == "fp32"
    assert report["masking"]["micro_batch_size"] == 8
    assert report["masking"]["sequences"] == 8 * 8  # 8 batches of the resolved micro-batch
    assert report["masking"]["mask_prob"] == 0.2 and report["masking"]["mask_prob_start"] == 0.2
    assert "99999" not in out
    code, _, err = _dry_run(
        english_shards, tmp_path / "dry", *args, "--micro_batch_size", "4", capsys=capsys
    )
    assert code == 2 and "(flag --micro_batch_size)" in err
    assert f"train_micro_batch_size_per_gpu = 8 ({path})" in err
    code, human, _ = _dry_run(english_shards, tmp_path / "dry", *args[:-1], capsys=capsys)
    assert code == 0 and "over 8 batches of 8:" in human and '"lr": 0.0005' in human
    assert f"optim.lr = 0.0005   (DeepSpeed JSON {path})" in human


def test_dry_run_refuses_a_checkpoint_that_does_not_fit_as_the_launch_does(
    english_shards, tmp_path, capsys
):
    from bertforge.pretrain.checkpoints.checkpoint_files import folder_sizes, write_marker
    from bertforge.pretrain.run_folder.run_checkpoints import STATE_FILE, tag_for

    ckpt = tmp_path / "run" / "checkpoints" / tag_for(2)
    ckpt.mkdir(parents=True)
    state = {"step": 2, "world_size": 1, "vocab_size": 999, "tokenizer_fingerprint": "other"}
    (ckpt / STATE_FILE).write_text(json.dumps(state))
    write_marker(ckpt, folder_sizes(ckpt))
    code, _, err = _dry_run(english_shards, tmp_path / "run", "--resume", "auto", capsys=capsys)
    assert code == 2 and "does not fit this run" in err and "vocab size 999" in err


def test_rounded_for_display():
    from bertforge.pretrain.dry_run import rounded

    assert rounded({"a": [1 - 0.8, 3], "b": 0.1 + 0.2, "c": "x"}) == {
        "a": [0.2, 3],
        "b": 0.3,
        "c": "x",
    }
    assert rounded(0.1985111662531017) == 0.1985111663
