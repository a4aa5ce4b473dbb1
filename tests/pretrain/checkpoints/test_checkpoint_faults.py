"""Failed saves and damaged checkpoints (issue 14, item 2; rows of docs/reliability.md).

``COMPLETE`` records every file of a checkpoint and its size; a checkpoint that no longer matches
is skipped by ``--resume auto`` (with a warning naming it) and refused when named explicitly. A
save that fails on any rank leaves nothing ``--resume auto`` would take and keeps the previous
checkpoint: a periodic one warns and the run goes on, a final one stops with EXIT_SAVE_FAILED.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers.commands import REPO
from helpers.engines import one_rank_engine, tiny_config

from bertforge.pretrain.checkpoints import checkpoint as ck
from bertforge.pretrain.checkpoints import checkpoint_files as cf
from bertforge.pretrain.checkpoints import resume
from bertforge.pretrain.run_folder import run_checkpoints as rc


def _fake_checkpoint(root: Path, step: int, payload: bytes = b"weights" * 100) -> Path:
    """A checkpoint folder with a few files and a COMPLETE manifest of them (no engine)."""
    path = root / rc.tag_for(step)
    (path / "rng").mkdir(parents=True)
    (path / "mp_rank_00_model_states.pt").write_bytes(payload)
    (path / "zero_pp_rank_1_mp_rank_00_optim_states.pt").write_bytes(payload * 2)
    (path / "rng" / "rank_00000.pt").write_bytes(b"rng")
    (path / rc.STATE_FILE).write_text(json.dumps({"step": step}))
    cf.write_marker(path, cf.folder_sizes(path))
    return path


def _truncate(file: Path) -> None:
    with open(file, "r+b") as f:
        f.truncate(file.stat().st_size // 2)


def test_verify_legacy_marker_missing_file_and_size_change(tmp_path):
    path = _fake_checkpoint(tmp_path, 4)
    manifest = json.loads((path / rc.MARKER).read_text())
    assert manifest["files"] == {
        "mp_rank_00_model_states.pt": 700,
        "rng/rank_00000.pt": 3,
        "trainer_state.json": len(json.dumps({"step": 4})),
        "zero_pp_rank_1_mp_rank_00_optim_states.pt": 1400,
    }
    assert rc.verify(path) == []

    (path / "rng" / "rank_00000.pt").unlink()  # costs exactness only: load warns, not verify
    assert rc.verify(path) == []
    (path / "trainer_state.json").unlink()
    _truncate(path / "zero_pp_rank_1_mp_rank_00_optim_states.pt")
    assert rc.verify(path) == [
        "trainer_state.json is missing",
        "zero_pp_rank_1_mp_rank_00_optim_states.pt has 700 bytes, 1400 were written",
    ]
    (path / "mp_rank_00_model_states.pt").write_bytes(b"weights" * 101)  # grown: also a problem
    assert "mp_rank_00_model_states.pt has 707 bytes, 700 were written" in rc.verify(path)

    (path / rc.MARKER).write_text(f"{path.name}\n")  # a marker written before manifests existed
    assert rc.verify(path) == [] and rc.is_complete(path)
    (path / rc.MARKER).write_text('{"files": ')  # cut short
    assert rc.verify(path) == [f"{rc.MARKER} is damaged (not a JSON manifest with a 'files' table)"]
    (path / rc.MARKER).unlink()
    assert rc.verify(path) == [f"no {rc.MARKER} marker (the save did not finish)"]


def test_resume_and_init_from_skip_or_refuse_a_checkpoint_that_does_not_verify(tmp_path, capsys):
    from bertforge.pretrain.model.init_source import InitError, locate

    root = tmp_path / "run" / "checkpoints"
    older, newer = _fake_checkpoint(root, 2), _fake_checkpoint(root, 4)
    _truncate(newer / "zero_pp_rank_1_mp_rank_00_optim_states.pt")

    assert rc.resolve_resume("auto", tmp_path / "run") == older
    out = capsys.readouterr().out
    assert f"WARNING: skipping checkpoint {newer}" in out
    assert "zero_pp_rank_1_mp_rank_00_optim_states.pt has 700 bytes, 1400 were written" in out
    assert rc.resolve_resume(str(tmp_path / "run"), "unused") == older  # a run folder: the same
    assert (
        resume.write_latest(root) == older and (root / resume.LATEST_FILE).read_text() == older.name
    )
    with pytest.raises(rc.CorruptCheckpointError, match="optim_states.pt has 700 bytes"):
        rc.resolve_resume(str(newer), tmp_path / "run")  # named explicitly: an error
    with pytest.raises(InitError, match=r"--init_from .*step_00000004: the checkpoint's files"):
        locate(newer)

    (older / "mp_rank_00_model_states.pt").unlink()  # now none verifies: no silent fresh start
    with pytest.raises(rc.CorruptCheckpointError, match="no checkpoint in .* matches"):
        rc.resolve_resume("auto", tmp_path / "run")


def _tiny_engine(shards: Path, run: Path, *extra: str):
    cfg = tiny_config(shards, run, *extra)
    return cfg, one_rank_engine(cfg)[0]


@pytest.mark.slow
def test_failed_save_leaves_no_checkpoint_and_keeps_the_previous(
    english_shards, tmp_path, one_rank_group, monkeypatch
):
    from bertforge.pretrain.stability.faults import ENV_VAR

    cfg, engine = _tiny_engine(english_shards, tmp_path / "run", "--keep_last", "1")
    state = {"config": dataclasses.asdict(cfg.run), "consumed_samples": 0}
    monkeypatch.setenv(ENV_VAR, "save_enospc@2")
    ckpts = ck.CheckpointManager(cfg.run.output_dir, cfg.checkpoint, 0, 1)
    first = ckpts.save(engine, 1, state)
    files = json.loads((first / rc.MARKER).read_text())["files"]
    assert {"mp_rank_00_model_states.pt", "rng/rank_00000.pt", rc.STATE_FILE} <= set(files)
    assert any(name.endswith("optim_states.pt") for name in files)
    assert files == cf.folder_sizes(first)  # every file written, and only those
    before = {p: p.read_bytes() for p in first.rglob("*") if p.is_file()}

    with pytest.raises(ck.CheckpointSaveError) as failed:
        ckpts.save(engine, 2, state)  # the planned ENOSPC: a shard cut short, then the error
    message = str(failed.value)
    assert f"saving checkpoint {ckpts.root / rc.tag_for(2)} failed" in message
    assert "No space left on device" in message
    assert f"the previous complete checkpoint {first} is intact" in message
    assert not (ckpts.root / rc.tag_for(2)).exists()  # the partial folder is gone
    assert ckpts.last_saved_step == 1 and rc.verify(first) == []
    assert {p: p.read_bytes() for p in first.rglob("*") if p.is_file()} == before  # not pruned
    assert (ckpts.root / resume.LATEST_FILE).read_text() == first.name
    assert ckpts.save(engine, 3, state).name == rc.tag_for(3)  # the next save works and prunes
    assert [s for s, _ in rc.list_complete(ckpts.root)] == [3]


@pytest.mark.slow
def test_a_real_full_disk_fails_the_save_and_keeps_the_previous(
    english_shards, tmp_path, one_rank_group
):
    """A tmpfs with room for one checkpoint but not two: the second save meets a real ENOSPC."""
    cfg, engine = _tiny_engine(english_shards, tmp_path / "probe", "--keep_last", "1")
    state = {"config": dataclasses.asdict(cfg.run), "consumed_samples": 0}
    probe = ck.CheckpointManager(cfg.run.output_dir, cfg.checkpoint, 0, 1).save(engine, 1, state)
    size = sum(cf.folder_sizes(probe).values())
    disk = tmp_path / "disk"
    disk.mkdir()
    room = f"size={int(size * 1.5) // 4096 * 4096 + 65536}"
    mount = ["mount", "-t", "tmpfs", "-o", room, "tmpfs", str(disk)]
    if not shutil.which("mount") or subprocess.run(mount, check=False).returncode != 0:
        pytest.skip("mounting a tmpfs is not permitted here (needs root)")
    try:
        ckpts = ck.CheckpointManager(disk / "run", cfg.checkpoint, 0, 1)
        first = ckpts.save(engine, 1, state)
        with pytest.raises(ck.CheckpointSaveError, match="bytes free there") as failed:
            ckpts.save(engine, 2, state)
        assert f"the previous complete checkpoint {first} is intact" in str(failed.value)
        assert not (ckpts.root / rc.tag_for(2)).exists()
        assert rc.find_latest(ckpts.root) == first and rc.verify(first) == []
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def _losses(run: Path) -> dict[int, float]:
    from bertforge.pretrain.components.metrics import read_metrics

    return {r["step"]: r["loss"] for r in read_metrics(run / "metrics.jsonl")}


def _train(shards: Path, run: Path, *extra: str) -> None:
    """One launch of the trainer, in this process (the one-rank group): main.train(cfg)."""
    from bertforge.pretrain.config.cli import parse_args
    from bertforge.pretrain.main import train

    cfg = parse_args(
        ["--ds_config", str(REPO / "ds_configs" / "cpu.json"), "--data", str(shards)]
        + ["--output_dir", str(run), "--model", "tiny", "--global_batch_size", "4"]
        + ["--micro_batch_size", "4", "--lr", "1e-3", "--warmup_steps", "1", "--eval_batches"]
        + ["1", "--num_workers", "0", "--progress", "false", *extra]
    )
    assert train(cfg) == 0


@pytest.mark.slow
def test_resume_auto_skips_a_truncated_checkpoint(english_shards, tmp_path, one_rank_group, capsys):
    """A shard of the newest checkpoint cut short: --resume auto warns naming it and resumes from
    the previous one, exactly as resuming from that one directly."""
    run, direct = tmp_path / "run", tmp_path / "direct"
    _train(english_shards, run, "--max_steps", "4", "--save_interval", "2", "--keep_last", "5")
    shutil.copytree(run, direct)
    newest = run / "checkpoints" / rc.tag_for(4)
    shard = next(newest.glob("*optim_states.pt"))
    _truncate(shard)
    capsys.readouterr()

    _train(english_shards, run, "--max_steps", "6", "--resume", "auto")
    out = capsys.readouterr().out
    assert f"WARNING: skipping checkpoint {newest}" in out and f"{shard.name} has " in out
    assert f"resumed from {run / 'checkpoints' / rc.tag_for(2)} at step 2" in out
    start = direct / "checkpoints" / rc.tag_for(2)
    _train(english_shards, direct, "--max_steps", "6", "--resume", str(start))
    assert f"resumed from {start} at step 2" in capsys.readouterr().out
    resumed, reference = _losses(run), _losses(direct)
    assert sorted(resumed) == list(range(1, 7))
    for step in range(3, 7):
        assert resumed[step] == pytest.approx(reference[step], abs=1e-6), step


@pytest.mark.slow
def test_periodic_save_failing_on_one_of_two_ranks_warns_and_the_run_goes_on(
    english_shards, tmp_path
):
    """ENOSPC on rank 1 only (DeepSpeed launcher, 2 ranks, ZeRO-2): every rank learns of it, the
    run warns and goes on, the failed step's folder is gone and the next interval saves."""
    from helpers.launch import COMMON, launch

    from bertforge.pretrain.stability.faults import ENV_VAR

    run, ckpts = tmp_path / "run", tmp_path / "run" / "checkpoints"
    args = ["--ds_config", str(REPO / "ds_configs" / "cpu.json"), "--data", str(english_shards)]
    args += ["--output_dir", str(run), "--eval_batches", "1", "--keep_last", "5", *COMMON]
    proc = launch(
        [*args, "--max_steps", "6", "--save_interval", "2"], env={ENV_VAR: "save_enospc@4@1"}
    )
    out = proc.stdout + proc.stderr
    failed = ckpts / rc.tag_for(4)
    assert f"WARNING: saving checkpoint {failed} failed (rank 1: writing {failed}" in out
    assert "No space left on device" in out and "will retry at the next interval" in out
    assert f"the previous complete checkpoint {ckpts / rc.tag_for(2)} is intact" in out
    assert not failed.exists()  # the partial folder (rank 1's shard cut short) was removed
    assert [s for s, _ in rc.list_complete(ckpts)] == [2, 6]  # the next interval saved
    assert rc.resolve_resume("auto", run) == ckpts / rc.tag_for(6)
    assert _losses(run).keys() == set(range(1, 7))


@pytest.mark.slow
def test_final_save_failing_stops_with_its_exit_status(
    english_shards, tmp_path, one_rank_group, monkeypatch, capsys
):
    from bertforge.pretrain.config.cli import parse_args
    from bertforge.pretrain.main import train
    from bertforge.pretrain.stability.faults import ENV_VAR
    from bertforge.pretrain.trainer import EXIT_SAVE_FAILED

    run, ckpts = tmp_path / "run", tmp_path / "run" / "checkpoints"
    monkeypatch.setenv(ENV_VAR, "save_enospc@3")
    cfg = parse_args(
        ["--ds_config", str(REPO / "ds_configs" / "cpu.json"), "--data", str(english_shards)]
        + ["--output_dir", str(run), "--model", "tiny", "--global_batch_size", "4"]
        + ["--micro_batch_size", "4", "--eval_batches", "1", "--num_workers", "0"]
        + ["--progress", "false", "--max_steps", "3", "--save_interval", "2"]
    )
    assert train(cfg) == EXIT_SAVE_FAILED
    out = capsys.readouterr().out
    lost, kept = ckpts / rc.tag_for(3), ckpts / rc.tag_for(2)
    assert f"ERROR: the final save after step 3 failed: saving checkpoint {lost} failed" in out
    assert "No space left on device" in out
    assert f"the previous complete checkpoint {kept} is intact" in out
    assert not lost.exists() and rc.verify(kept) == []
    assert rc.resolve_resume("auto", run) == kept
    assert (ckpts / resume.LATEST_FILE).read_text() == kept.name
