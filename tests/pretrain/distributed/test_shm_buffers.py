"""pretrain.distributed.shm_buffers: DeepSpeed's CPU shared-memory all-reduce buffers are unlinked
once every rank has mapped them, still work afterwards, and the doctor names the stale ones."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from helpers.commands import REPO

from bertforge.pretrain.distributed.shm_buffers import buffer_name, buffers_of_port, stale_buffers
from bertforge.pretrain.distributed.startup import free_port
from bertforge.pretrain.doctor.checks import shm_rows

# A rank that starts the group the trainer's way, then proves both buffers are mapped but gone
# from /dev/shm, and that DeepSpeed's shared-memory all-reduce still sums over the two ranks.
SCRIPT = textwrap.dedent("""
    import os, torch, torch.distributed as dist, deepspeed.comm as ds_comm
    from bertforge.pretrain.distributed.startup import init_distributed
    from bertforge.pretrain.distributed.shm_buffers import buffer_name
    info = init_distributed(timeout_s=60)
    dist.barrier()  # every rank has unlinked its own
    names = [buffer_name(r, "127.0.0.1", info.master_port) for r in range(2)]
    maps = open("/proc/self/maps").read()
    mapped = all(f"/dev/shm/{n} (deleted)" in maps for n in names)
    listed = any(os.path.exists(f"/dev/shm/{n}") for n in names)
    t = torch.full((1000,), info.rank + 1.0)
    ds_comm.inference_all_reduce(t)
    print(f"RESULT mapped={mapped} listed={listed} sum={t[0].item():g}", flush=True)
""")


def test_buffers_are_unlinked_once_mapped_and_the_all_reduce_still_works():
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "WORLD_SIZE": "2"}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_SIZE="2")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SCRIPT],
            cwd=REPO,
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=180)[0] for p in procs]
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-3000:]
        assert "RESULT mapped=True listed=False sum=3" in out, out[-3000:]
    assert buffers_of_port(port) == []


def test_stale_buffers_are_the_unmapped_ones_and_the_doctor_says_how_to_remove_them(tmp_path):
    dead = tmp_path / buffer_name(0, "127.0.0.1", 29999)
    dead.write_bytes(b"\0" * 4096)
    live = tmp_path / buffer_name(1, "127.0.0.1", 29999)
    live.write_bytes(b"\0" * 10)
    (tmp_path / "other_program_segment").write_bytes(b"x")
    with open(live, "rb"):  # held open by a live process (this one): not stale
        stale = stale_buffers(tmp_path)
    assert [(b.path, b.size) for b in stale] == [(dead, 4096)]
    assert buffers_of_port(29999, tmp_path) == [dead, live]
    (row,) = shm_rows(stale)
    assert row.status == "WARN" and "1 DeepSpeed buffers of dead jobs" in row.detail
    assert f"rm -f {dead}" in row.fix
    assert shm_rows([])[0].status == "ok"
