"""Training from object storage (issue 53): two DeepSpeed ranks read their shards from a real S3
server (moto's server mode on 127.0.0.1, reached the standard way: ``AWS_ENDPOINT_URL`` and
credentials in the environment) through a cache a quarter of the training data's size, in the
window order; the run, its resume from S3, and a resume on one rank are compared with the same
run from the local folder. Same world size: bit-identical losses; another world size: equal up
to the order of floating-point sums (as tests/e2e/test_resume_on_more_ranks.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers.commands import REPO, run_cli
from helpers.launch import COMMON, launch
from helpers.s3 import MotoServer, s3fs_for, upload_folder

from bertforge.pretrain.components.metrics import read_metrics
from bertforge.pretrain.run_folder.run_checkpoints import read_state, tag_for

pytestmark = pytest.mark.slow

URL = "s3://corpus/shards/en"


def train_bytes(shards: Path) -> int:
    manifest = json.loads((shards / "manifest.json").read_text())
    return sum(
        f["bytes"] for s in manifest["splits"]["train"]["shards"] for f in s["files"].values()
    )


@pytest.fixture(scope="module")
def s3(tmp_path_factory, english_many_shards):
    """The server, with english_many_shards uploaded to URL; stopped by its pid at the end."""
    srv = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log")
    upload_folder(srv.endpoint, english_many_shards, URL)
    yield srv
    srv.stop()


def args(data: str | Path, run: Path, *extra: str) -> list[str]:
    return [
        "--ds_config", str(REPO / "ds_configs" / "cpu.json"),
        "--data", str(data), "--output_dir", str(run),
        "--max_steps", "8", "--save_interval", "4", "--eval_interval", "4",
        "--eval_batches", "2", "--hidden_dropout_prob", "0",
        "--attention_probs_dropout_prob", "0",
        "--data_order", "window", "--window_shards", "1",
        *COMMON, *extra,
    ]  # fmt: skip


def from_s3(s3: MotoServer, run: Path, cache: Path, limit: int, *extra: str, nproc: int = 2):
    return launch(
        args(URL, run, "--cache_dir", str(cache), "--cache_limit", str(limit), *extra),
        nproc=nproc,
        env=s3.env(),
    )


@pytest.fixture(scope="module")
def local_run(english_many_shards, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("local") / "run"
    launch(args(english_many_shards, run))
    return run


@pytest.fixture(scope="module")
def s3_run(s3, english_many_shards, tmp_path_factory) -> tuple[Path, Path, int]:
    """(run, cache folder, limit): the same run from S3, the cache a quarter of the data."""
    folder = tmp_path_factory.mktemp("s3")
    limit = train_bytes(english_many_shards) // 4
    from_s3(s3, folder / "run", folder / "cache", limit)
    return folder / "run", folder / "cache", limit


def records(run: Path) -> list[tuple]:
    """(split, step, loss) of every training and validation record."""
    return [
        (split, r["step"], r.get("loss", r.get("val_loss")))
        for split in ("train", "validation")
        for r in read_metrics(run / "metrics.jsonl", split)
    ]


def test_two_ranks_from_s3_match_the_local_folder_bit_for_bit(local_run, s3_run):
    run, cache, limit = s3_run
    assert records(run) == records(local_run)  # every loss, exactly
    assert len(records(run)) == 8 + 2
    for rank in (0, 1):  # each rank stayed within its limit, and fetched more than it holds
        stats = json.loads((cache / f"rank-{rank}" / "stats.json").read_text())
        assert stats["limit_bytes"] == limit and stats["peak_bytes"] <= limit, stats
        assert stats["fetched_bytes"] > limit  # shards came, were read and evicted
    state = read_state(run / "checkpoints" / tag_for(8))
    assert state["data_mixture"][0]["path"] == URL
    assert state["config"]["data_cfg"]["data_order"] == "window"
    assert state["config"]["data_cfg"]["window_shards"] == 1
    for name in ("config.json", "recipe.yaml", "checkpoints/step_00000008/trainer_state.json"):
        assert "testing" not in (run / name).read_text()  # the credentials are nowhere


def test_resume_from_s3_is_bit_identical(s3, local_run, s3_run, tmp_path):
    run, cache, limit = s3_run
    resumed = tmp_path / "run"
    shutil.copytree(run, resumed)
    shutil.rmtree(resumed / "checkpoints" / tag_for(8))
    (resumed / "checkpoints" / "latest").unlink(missing_ok=True)
    # the same cache folder: the shards the first launch left are taken up, not fetched again
    proc = from_s3(s3, resumed, cache, limit, "--resume", "auto")
    assert "at step 4 (64 samples consumed" in proc.stdout + proc.stderr
    assert records(resumed) == records(local_run)


def test_resume_on_one_rank_from_s3_keeps_the_window_order(s3, local_run, s3_run, tmp_path):
    """2 -> 1 ranks: the checkpoint's order (window, 1 shard) is kept without the flags."""
    run, _, limit = s3_run
    resumed = tmp_path / "run"
    shutil.copytree(run, resumed)
    shutil.rmtree(resumed / "checkpoints" / tag_for(8))
    (resumed / "checkpoints" / "latest").unlink(missing_ok=True)
    cmd = args(URL, resumed, "--cache_dir", str(tmp_path / "cache"), "--cache_limit", str(limit))
    at = cmd.index("--data_order")
    del cmd[at : at + 4]  # neither --data_order nor --window_shards: the checkpoint's
    proc = launch([*cmd, "--resume", "auto"], nproc=1, env=s3.env())
    assert "at step 4 (64 samples consumed; saved on 2 ranks, now 1)" in proc.stdout + proc.stderr
    ref, got = dict(((s, t), v) for s, t, v in records(local_run)), records(resumed)
    assert [(s, t) for s, t, _ in got] == list(ref)
    for split, step, value in got:
        assert value == pytest.approx(ref[(split, step)], rel=1e-5), (split, step)
    state = read_state(resumed / "checkpoints" / tag_for(8))
    assert state["config"]["data_cfg"]["window_shards"] == 1 and state["world_size"] == 1


def test_another_order_on_resume_is_refused(s3, s3_run, tmp_path):
    run, _, limit = s3_run
    resumed = tmp_path / "run"
    shutil.copytree(run, resumed)
    cmd = args(URL, resumed, "--cache_dir", str(tmp_path / "cache"), "--cache_limit", str(limit))
    cmd[cmd.index("--window_shards") + 1] = "2"
    proc = launch([*cmd, "--resume", "auto"], nproc=1, env=s3.env(), check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "--window_shards 2" in proc.stderr and "trained with --window_shards 1" in proc.stderr


def test_export_to_s3(s3, s3_run, tmp_path):
    """pretrain.export --output s3://...: the Hugging Face folder written here, then uploaded."""
    run, _, _ = s3_run
    upload_folder(s3.endpoint, tmp_path, "s3://models/x")  # the bucket
    proc = run_cli(
        "-m", "bertforge.pretrain.export", str(run), "--output", "s3://models/tiny",
        "--no_verify", env=s3.env(),
    )  # fmt: skip
    assert "to s3://models/tiny" in proc.stdout
    names = set(s3fs_for(s3.endpoint).ls("models/tiny"))
    assert {"models/tiny/config.json", "models/tiny/model.safetensors"} <= names


def test_the_doctor_reads_the_store_with_each_nodes_credentials(s3, tmp_path):
    def doctor(data: str, env: dict) -> dict:
        proc = run_cli(
            "-m", "bertforge.pretrain.doctor", "--json", "--slots", "1",
            "--ds_config", str(REPO / "ds_configs" / "cpu.json"), "--data", data,
            "--output_dir", str(tmp_path / "run"), env=env, check=False,
        )  # fmt: skip
        return {r["check"]: r for r in json.loads(proc.stdout) if r["check"] == "data"}

    assert doctor(URL, s3.env())["data"]["status"] == "ok"
    row = doctor("s3://corpus/absent", s3.env())["data"]
    assert row["status"] == "FAIL" and "s3://corpus/absent" in row["detail"]
    assert "credentials" in row["fix"]
