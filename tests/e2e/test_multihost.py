"""A real two-host launch on one machine: the DeepSpeed launcher reaches 127.0.0.1 and 127.0.0.2
through pdsh and an sshd of the test's own, trains the tiny model with ZeRO-2 on one rank per
host, saves, and a second launch resumes from the checkpoint. Everything stays on loopback and
is torn down afterwards; skipped with the reason when root, sshd or pdsh is missing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.commands import REPO
from helpers.sshd_harness import LoopbackSSH, missing_requirements

from bertforge.pretrain.distributed.startup import free_port

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory):
    reason = missing_requirements()
    if reason:
        pytest.skip(f"two-host launch: {reason}")
    harness = LoopbackSSH(tmp_path_factory.mktemp("sshd"))
    yield harness
    harness.close()


def _launch(
    harness: LoopbackSSH, tmp: Path, shards: Path, run: Path, max_steps: int, resume: str
) -> str:
    """`deepspeed --hostfile ... pretrain/main.py ...` as a user types it; returns its output."""
    hostfile = tmp / "hostfile"
    hostfile.write_text("127.0.0.1 slots=1\n127.0.0.2 slots=1\n")
    # Variables for the remote ranks go through a .deepspeed_env file (DS_ENV_FILE names ours).
    ds_env = tmp / "deepspeed_env"
    ds_env.write_text(
        "".join(
            f"{k}={os.environ[k]}\n"
            for k in ("PATH", "OMP_NUM_THREADS", "TOKENIZERS_PARALLELISM", "TRITON_INTERPRET")
            if k in os.environ
        )
    )
    env = {**os.environ, **harness.env(), "DS_ENV_FILE": str(ds_env)}
    cmd = [
        sys.executable,
        "-m",
        "deepspeed.launcher.runner",
        "--hostfile",
        str(hostfile),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        "pretrain/main.py",
        "--ds_config",
        "ds_configs/cpu.json",
        "--data",
        str(shards),
        "--model",
        "tiny",
        "--output_dir",
        str(run),
        "--max_steps",
        str(max_steps),
        "--micro_batch_size",
        "4",
        "--global_batch_size",
        "16",
        "--resume",
        resume,
        "--dist_timeout_s",
        "120",
        "--progress",
        "false",
        "--eval_batches",
        "2",
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate()
        pytest.fail(f"two-host launch did not finish in 400 s:\n{out[-4000:]}")
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{out[-6000:]}"
    return out


def _train_steps(run: Path) -> list[int]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows if "split" not in r]


def test_two_host_train_save_resume(two_hosts, english_shards, tmp_path):
    run = tmp_path / "run"
    out = _launch(two_hosts, tmp_path, english_shards, run, max_steps=3, resume="none")
    # pdsh prefixes each line with its host: both hosts ran a rank.
    assert any(line.startswith("127.0.0.1: ") for line in out.splitlines()), out[-3000:]
    assert any(line.startswith("127.0.0.2: ") for line in out.splitlines()), out[-3000:]
    ckpt = run / "checkpoints" / "step_00000003"
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert state["world_size"] == 2 and state["step"] == 3 and state["consumed_samples"] == 48
    # ZeRO-2 over 2 ranks: one optimizer-state shard per rank.
    assert sorted(p.name for p in ckpt.glob("*optim_states.pt")) == [
        "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "zero_pp_rank_1_mp_rank_00_optim_states.pt",
    ]
    assert _train_steps(run) == [1, 2, 3]

    _launch(two_hosts, tmp_path, english_shards, run, max_steps=5, resume="auto")
    # Resumed at step 3 (not restarted): steps 4 and 5 follow in the same metrics file.
    assert _train_steps(run) == [1, 2, 3, 4, 5]
    state = json.loads((run / "checkpoints" / "step_00000005" / "trainer_state.json").read_text())
    assert state["world_size"] == 2 and state["consumed_samples"] == 80
