"""Fetching shards from a real S3 server (moto's server mode on 127.0.0.1) through a proxy that
injects the faults of issue 53: a 503, a connection dropped mid-object, a short body, flipped
bytes; and objects that stay wrong (truncated, another checksum). A passing fault is retried and
the file arrives whole; one that stays is refused after the last try with an error naming the
object, and nothing of it is left in the cache, so nothing is ever trained on bad bytes."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest
from helpers.s3 import Fault, FaultProxy, MotoServer, s3fs_for, upload_folder

from bertforge.data_prep import shard_cache
from bertforge.data_prep.object_store import Retry, Store, StoreError, check_url, is_url
from bertforge.data_prep.reader import ShardReader
from bertforge.data_prep.remote_folder import parse_size
from bertforge.data_prep.shard_cache import CacheTooSmall
from bertforge.pretrain.data.loader import DataConfig, GlobalSampler, build_loader
from bertforge.pretrain.data.masking import MaskingConfig

FAST = Retry(tries=3, backoff_s=0.01, max_backoff_s=0.02)
BODY = os.urandom(3 << 20)  # three 1 MiB... ranged reads of CHUNK_BYTES each: one object
EXPECTED = {"bytes": len(BODY), "sha256": hashlib.sha256(BODY).hexdigest()}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log")
    fs = s3fs_for(srv.endpoint)
    upload_folder(srv.endpoint, tmp_path_factory.mktemp("empty"), "s3://faults/x")
    fs.pipe_file("faults/good.bin", BODY)
    fs.pipe_file("faults/truncated.bin", BODY[: len(BODY) - 1000])
    fs.pipe_file("faults/other.bin", BODY[:-1] + bytes([BODY[-1] ^ 1]))
    yield srv
    srv.stop()  # by its pid


@pytest.fixture
def proxy(server, monkeypatch):
    """A fault proxy in front of the server; botocore's own retries off, so that the retries
    seen are ours (and quick)."""
    p = FaultProxy(server.endpoint)
    for k, v in server.env(p.endpoint).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    yield p
    p.stop()


def _fetch(name: str, dest, expected=EXPECTED):
    Store("s3://faults", FAST).fetch(name, dest, expected)


@pytest.mark.parametrize("kind", ["503", "drop", "short", "flip"])
def test_a_passing_fault_is_retried_and_the_file_arrives_whole(proxy, tmp_path, kind, capsys):
    proxy.faults.append(Fault("good.bin", kind, times=1))
    dest = tmp_path / "good.bin"
    _fetch("good.bin", dest)
    assert dest.read_bytes() == BODY
    assert proxy.faults[0].served == 1
    assert list(tmp_path.iterdir()) == [dest]  # no temporary left behind
    if kind != "drop":  # a dropped body may be retried inside s3fs first
        assert "s3://faults/good.bin: fetching failed" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("name", "fault", "says"),
    [
        ("truncated.bin", None, "short read"),
        ("other.bin", None, "checksum"),
        ("good.bin", Fault("good.bin", "503", times=None), "failed 3 times"),
        ("good.bin", Fault("good.bin", "flip", times=None), "checksum"),
    ],
)
def test_a_fault_that_stays_is_refused_naming_the_object(proxy, tmp_path, name, fault, says):
    if fault:
        proxy.faults.append(fault)
    dest = tmp_path / name
    with pytest.raises(StoreError) as e:
        _fetch(name, dest)
    assert f"s3://faults/{name}" in str(e.value) and says in str(e.value)
    assert list(tmp_path.iterdir()) == []  # nothing of it arrived
    gets = [r for r in proxy.requests if r.startswith("GET") and name in r]
    assert len(gets) >= 3  # every try asked again


def test_a_missing_object_fails_at_once(proxy, tmp_path):
    with pytest.raises(StoreError, match="s3://faults/absent.bin: no such object"):
        _fetch("absent.bin", tmp_path / "absent.bin")
    assert len([r for r in proxy.requests if "absent.bin" in r]) == 1


def test_urls_with_credentials_are_refused():
    assert is_url("s3://b/p") and is_url("gs://b") and not is_url("/data/shards")
    for bad in ("https://user:secret@host/shards", "https://host/s?X-Amz-Signature=abc"):
        with pytest.raises(StoreError) as e:
            check_url(bad)
        assert "secret" not in str(e.value) and "abc" not in str(e.value)
    assert parse_size("500MB") == 500 * 10**6 and parse_size("1.5GiB") == int(1.5 * 2**30)


@pytest.fixture(scope="module")
def remote_shards(server, english_many_shards):
    return upload_folder(server.endpoint, english_many_shards, "s3://shards/en")


def _second_window(local, cfg: DataConfig, micro: int) -> tuple[int, int]:
    """(the shard the window order reads second, the first batch that reads it)."""
    sampler = GlobalSampler(
        len(local), micro, seed=cfg.seed, window=1, shard_counts=local.shard_sequence_counts()
    )
    first = None
    for j, plan in enumerate(sampler):
        shards = set(local.shard_ids(plan.indices).tolist())
        first = first if first is not None else min(shards)
        if shards - {first}:
            return min(shards - {first}), j
    raise AssertionError("one shard only")


def test_a_shard_that_stays_corrupt_stops_the_loader_at_its_batch(
    server, proxy, english_many_shards, remote_shards, tmp_path
):
    """The batches before the corrupt shard's are the local folder's, bit for bit (the shard
    was prefetched, and refused, well before); the one that needs it raises the fetch's error,
    naming the object, instead of reading its bytes; nothing of it is in the cache."""
    cfg = DataConfig(num_workers=0, data_order="window", window_shards=1)
    local = ShardReader(english_many_shards)
    bad, at = _second_window(local, cfg, micro=8)
    name = local._shards[bad]["name"]
    proxy.faults.append(Fault(f"train/{name}.tokens", "flip", times=None))
    shard_cache.configure(tmp_path / "cache", "20MB", retry=FAST)
    try:
        it = iter(
            build_loader(ShardReader(remote_shards), cfg, MaskingConfig(), micro_batch_size=8)
        )
        ref = iter(build_loader(local, cfg, MaskingConfig(), micro_batch_size=8))
        for _ in range(at):
            assert np.array_equal(next(it)["input_ids"], next(ref)["input_ids"])
        with pytest.raises(StoreError, match=f"s3://shards/en/train/{name}.tokens.*checksum"):
            next(it)
        assert not list(shard_cache.process_cache().folder.glob(f"*/train/{name}.*"))
    finally:
        shard_cache.configure()


def _train_bytes(reader) -> int:
    return sum(int(f["bytes"]) for s in reader._shards for f in s["files"].values())


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_from_s3_in_a_quarter_of_the_data_matches_the_local_folder(
    server, proxy, english_many_shards, remote_shards, tmp_path, workers
):
    """Two epochs of the window order through a cache a quarter of the data's size, with and
    without DataLoader workers: the local folder's batches, bit for bit; the cache never held
    more than its limit, and fetched the data about once an epoch."""
    local = ShardReader(english_many_shards)
    limit = _train_bytes(local) // 4
    shard_cache.configure(tmp_path / "cache", limit)
    try:
        cfg = DataConfig(
            num_workers=workers, prefetch_factor=1, data_order="window", window_shards=1
        )
        it = iter(
            build_loader(ShardReader(remote_shards), cfg, MaskingConfig(), micro_batch_size=8)
        )
        ref = iter(build_loader(local, cfg, MaskingConfig(), micro_batch_size=8))
        batches = 2 * len(local) // 8
        for _ in range(batches):
            got, want = next(it), next(ref)
            assert all(np.array_equal(got[k], want[k]) for k in ("input_ids", "labels"))
        stats = shard_cache.process_cache().stats()
        assert stats["peak_bytes"] <= limit
        assert _train_bytes(local) <= stats["fetched_bytes"] <= 3.5 * _train_bytes(local)
    finally:
        shard_cache.configure()


def test_a_cache_smaller_than_one_batch_stops_with_the_fix(
    server, proxy, english_many_shards, remote_shards, tmp_path
):
    """The global order reads a dozen shards in one batch: a cache of three says so."""
    local = ShardReader(english_many_shards)
    shard_cache.configure(tmp_path / "cache", 3 * _train_bytes(local) // len(local._shards))
    try:
        cfg = DataConfig(num_workers=0)
        it = iter(
            build_loader(ShardReader(remote_shards), cfg, MaskingConfig(), micro_batch_size=32)
        )
        with pytest.raises(CacheTooSmall, match="Raise --cache_limit, or use --data_order window"):
            next(it)
    finally:
        shard_cache.configure()
