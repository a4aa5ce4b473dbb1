"""``data_prep build --output s3://...`` against a real S3 server (moto's server mode): a whole
build and a build split into two parts on two "machines" (each its own staging folder, the
prepare step on a third) give the folder a local build gives, shard for shard; the trainer's
refusal of a run folder in object storage names the reason."""

from __future__ import annotations

import json

import pytest
from helpers.commands import REPO, run_cli
from helpers.s3 import MotoServer, s3fs_for, upload_folder

from bertforge.pretrain.config import command_line

pytestmark = pytest.mark.slow  # data_prep and the trainer's parser in processes of their own


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log")
    upload_folder(srv.endpoint, tmp_path_factory.mktemp("empty"), "s3://built/x")
    yield srv
    srv.stop()


def build_args(corpus, out, tokenizer, **extra) -> list[str]:
    options = {"max_seq_len": 128, "validation_fraction": 0.05, "workers": 1, "shard_docs": 20}
    cmd = command_line.data_prep_build(corpus, out, tokenizer=str(tokenizer), **options, **extra)
    return cmd[1:]


def shard_hashes(manifest: dict) -> dict[str, str]:
    return {
        f"{split}/{name}": meta["sha256"]
        for split, info in manifest["splits"].items()
        for shard in info["shards"]
        for name, meta in shard["files"].items()
    }


@pytest.fixture(scope="module")
def local_build(english_corpus, english_shards, tmp_path_factory):
    out = tmp_path_factory.mktemp("local") / "shards"
    run_cli(*build_args(english_corpus, out, english_shards / "tokenizer"))
    return json.loads((out / "manifest.json").read_text())


def test_a_build_uploads_the_folder_a_local_build_writes(
    server, english_corpus, english_shards, local_build, tmp_path
):
    url = "s3://built/whole"
    env = {**server.env(), "TMPDIR": str(tmp_path)}
    proc = run_cli(*build_args(english_corpus, url, english_shards / "tokenizer"), env=env)
    assert f"wrote {url}/manifest.json" in proc.stdout
    fs = s3fs_for(server.endpoint)
    manifest = json.loads(fs.cat_file("built/whole/manifest.json"))
    assert shard_hashes(manifest) == shard_hashes(local_build)
    assert fs.exists("built/whole/tokenizer/tokenizer.json")
    assert not fs.exists("built/whole/.work")
    again = run_cli(
        *build_args(english_corpus, url, english_shards / "tokenizer"), env=env, check=False
    )
    assert again.returncode == 2 and "holds a finished build" in again.stderr


def test_a_split_build_on_two_machines_merges_in_the_store(
    server, english_corpus, english_shards, local_build, tmp_path
):
    url = "s3://built/split"
    tok = english_shards / "tokenizer"
    machines = [tmp_path / name for name in ("prep", "a", "b")]
    for m in machines:
        m.mkdir()
    run_cli("-m", "bertforge.data_prep", "prepare", *build_args(english_corpus, url, tok)[3:],
            env={**server.env(), "TMPDIR": str(machines[0])})  # fmt: skip
    fs = s3fs_for(server.endpoint)
    outputs = []
    for k, machine in enumerate(machines[1:]):
        args = build_args(english_corpus, url, tok, num_partitions=2, partition=k)
        outputs.append(run_cli(*args, env={**server.env(), "TMPDIR": str(machine)}).stdout)
        assert fs.exists("built/split/manifest.json") == (k == 1)  # the last part merges
    manifest = json.loads(fs.cat_file("built/split/manifest.json"))
    assert shard_hashes(manifest) == shard_hashes(local_build)
    assert manifest["partitions"] == 2 and not fs.exists("built/split/.work")
    assert f"wrote {url}/manifest.json" in outputs[1]


def test_a_run_folder_in_object_storage_is_refused_with_the_reason(english_shards, tmp_path):
    proc = run_cli(
        "pretrain/main.py", "--data", str(english_shards), "--output_dir", "s3://runs/x",
        "--ds_config", str(REPO / "ds_configs" / "cpu.json"), check=False,
        env={"PYTHONPATH": str(REPO)},  # the script imports this checkout
    )  # fmt: skip
    assert proc.returncode == 2
    assert "--output_dir s3://runs/x" in proc.stderr and "torch.save" in proc.stderr


def test_verify_a_folder_in_the_store(server, english_shards, tmp_path):
    """data_prep verify URL fetches every shard file (sha256 checked on arrival): ok for the
    upload, exit 2 naming the object once one is replaced by other bytes of its size."""
    url = upload_folder(server.endpoint, english_shards, "s3://built/copy")
    env = {**server.env(), "TMPDIR": str(tmp_path)}
    proc = run_cli("-m", "bertforge.data_prep", "verify", url, env=env)
    assert "ok:" in proc.stdout and f"{url}/manifest.json" in proc.stdout
    fs = s3fs_for(server.endpoint)
    name = "built/copy/train/shard-00000.tokens"
    data = fs.cat_file(name)
    fs.pipe_file(name, bytes([data[0] ^ 1]) + data[1:])
    bad = run_cli(
        "-m", "bertforge.data_prep", "verify", url, env={**env, "AWS_MAX_ATTEMPTS": "1"},
        check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and f"{url}/train/shard-00000.tokens" in bad.stderr
    assert "checksum" in bad.stderr
