"""pretrain.distributed.startup: single-process defaults, a 2-rank rendezvous, and the timeout
message."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
from helpers.commands import REPO

from bertforge.pretrain.distributed.startup import (
    EXIT_RENDEZVOUS,
    RendezvousError,
    _ranges,
    free_port,
    resolve_env,
)

# A rank that rendezvous, all-reduces its rank+1 and prints the result: sum over 2 ranks is 3.
SCRIPT = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    from bertforge.pretrain.distributed.startup import init_distributed
    info = init_distributed(timeout_s=float(sys.argv[1]))
    assert init_distributed(timeout_s=1.0) == info  # a second call reuses the group
    t = torch.tensor([info.rank + 1.0])
    dist.all_reduce(t)
    print(f"RESULT rank={info.rank} world={info.world_size} local={info.local_rank} "
          f"main={info.is_main} sum={t.item():g} port={info.master_port}", flush=True)
    dist.destroy_process_group()
""")


def _start(rank: int | None, world: int, port: int, timeout_s: float) -> subprocess.Popen:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env["PYTHONPATH"] = str(REPO)
    if rank is not None:
        env.update(
            RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(timeout_s)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_ranges_compacts_consecutive_ranks():
    assert _ranges([1, 2, 3, 7, 9, 10]) == "1-3, 7, 9-10"
    assert _ranges([5]) == "5"
    assert _ranges([]) == "none"


def test_partial_launcher_variables_are_an_error(monkeypatch):
    for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RendezvousError, match="RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT"):
        resolve_env()
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1234")
    with pytest.raises(RendezvousError, match="RANK=2 is outside"):
        resolve_env()


def test_no_launcher_gives_single_process_defaults(monkeypatch):
    for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(v, raising=False)
    info = resolve_env()
    assert (info.rank, info.world_size, info.local_rank, info.is_main) == (0, 1, 0, True)
    assert info.master_addr == "127.0.0.1" and info.master_port > 0
    assert os.environ["MASTER_PORT"] == str(info.master_port)


@pytest.mark.slow
def test_two_ranks_rendezvous_and_plain_python():
    port = free_port()
    procs = [_start(r, 2, port, 60) for r in (0, 1)] + [_start(None, 1, 0, 60)]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (_out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    assert f"RESULT rank=0 world=2 local=0 main=True sum=3 port={port}" in outs[0][0]
    assert f"RESULT rank=1 world=2 local=1 main=False sum=3 port={port}" in outs[1][0]
    assert "RESULT rank=0 world=1 local=0 main=True sum=1 port=" in outs[2][0]


@pytest.mark.slow
def test_missing_rank_times_out_with_names_and_address():
    port = free_port()
    t0 = time.monotonic()
    p = _start(0, 2, port, 3)
    out, err = p.communicate(timeout=120)
    assert p.returncode == EXIT_RENDEZVOUS, err[-3000:]
    assert "ranks that did not join: 1" in err
    assert f"127.0.0.1:{port}" in err
    assert "1 of 2 ranks joined" in err and "firewall" in err
    assert "RESULT" not in out
    assert time.monotonic() - t0 < 90  # it gave up instead of hanging at init

    # The other side: rank 1 alone names rank 0's store it could not reach.
    p = _start(1, 2, free_port(), 2)
    out, err = p.communicate(timeout=120)
    assert p.returncode == EXIT_RENDEZVOUS, err[-3000:]
    assert "rank 1 could not reach rank 0's rendezvous store at 127.0.0.1:" in err


@pytest.mark.slow
def test_torchrun_agent_store_is_joined_not_rehosted(tmp_path):
    """torchrun's agent already listens on MASTER_PORT: the ranks must join its store."""
    script = tmp_path / "rank.py"
    script.write_text(SCRIPT)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env["PYTHONPATH"] = str(REPO)
    port = free_port()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(port),
            str(script),
            "60",
        ],
        check=False,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"RESULT rank=0 world=2 local=0 main=True sum=3 port={port}" in proc.stdout
    assert f"RESULT rank=1 world=2 local=1 main=False sum=3 port={port}" in proc.stdout
