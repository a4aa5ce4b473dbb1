"""Start a training command, wait until it has really trained, then signal one of its processes.

Used by the preemption tests (tests/e2e/test_*_preemption.py, test_nsp_bf16_interrupt_resume.py): a
cluster's SIGTERM (or a user's Ctrl-C) reaches one process of a job, at a moment nobody chose. The
helper waits for evidence that the loop runs (a condition on the run folder, e.g. a step record in
metrics.jsonl), so the test does not depend on how fast a shared CI machine starts the job.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]


def rank_process(launcher: subprocess.Popen, local_rank: int) -> psutil.Process:
    """The rank process a DeepSpeed launcher started with ``--local_rank=N`` (not the launcher)."""
    for p in psutil.Process(launcher.pid).children(recursive=True):
        if any(a == f"--local_rank={local_rank}" for a in p.cmdline()):
            return p
    raise AssertionError(f"no process with --local_rank={local_rank} under {launcher.pid}")


def run_and_signal(
    cmd: list[str],
    log: Path,
    ready: Callable[[], bool],
    target: Callable[[subprocess.Popen], int],
    sig: int = signal.SIGTERM,
    timeout_s: float = 240.0,
) -> tuple[int, str]:
    """Run ``cmd`` (output to ``log``), send ``sig`` to the pid ``target`` picks once ``ready()``
    holds, and return (exit status, output). Fails when the job ends before it was signalled."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + timeout_s
            while proc.poll() is None and not ready():
                assert time.monotonic() < deadline, (
                    "the run was not ready in time:\n" + (log.read_text()[-4000:])
                )
                time.sleep(0.05)
            assert proc.poll() is None, "the run ended before the signal:\n" + log.read_text()
            os.kill(target(proc), sig)
            code = proc.wait(timeout=timeout_s)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return code, log.read_text()


def run_tasks_and_signal_group(
    cmd: list[str],
    ranks: int,
    port: int,
    logs: Path,
    ready: Callable[[], bool],
    sig: int = signal.SIGTERM,
    timeout_s: float = 240.0,
) -> list[tuple[int, str]]:
    """Start ``ranks`` copies of ``cmd`` as srun starts the tasks of a job step (no launcher:
    each gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_SIZE, MASTER_ADDR, MASTER_PORT) in one new
    process group; once ``ready()`` holds, send ``sig`` to the whole group (ranks and their
    DataLoader workers), as SLURM does on scancel and preemption. Returns each rank's (exit
    status, output), rank 0 first."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1"}
    env.update(MASTER_PORT=str(port), WORLD_SIZE=str(ranks), LOCAL_SIZE=str(ranks))
    procs: list[subprocess.Popen] = []
    outs = []
    try:
        for rank in range(ranks):
            out = open(logs / f"rank{rank}.log", "w")  # noqa: SIM115 - closed below
            outs.append(out)
            procs.append(
                subprocess.Popen(
                    cmd,
                    cwd=REPO,
                    env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    process_group=procs[0].pid if procs else 0,
                )
            )
        deadline = time.monotonic() + timeout_s
        tail = lambda: (logs / "rank0.log").read_text()[-4000:]  # noqa: E731
        while all(p.poll() is None for p in procs) and not ready():
            assert time.monotonic() < deadline, "the run was not ready in time:\n" + tail()
            time.sleep(0.05)
        assert all(p.poll() is None for p in procs), "a rank ended before the signal:\n" + tail()
        os.killpg(procs[0].pid, sig)
        codes = [p.wait(timeout=timeout_s) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for out in outs:
            out.close()
    return [(code, (logs / f"rank{r}.log").read_text()) for r, code in enumerate(codes)]


# The job of run_job_in_own_session: started with start_new_session=True, it starts the ranks
# (they inherit its session and process group, as a job step's tasks under srun share theirs),
# waits for them and prints their exit statuses. Its own handlers ignore the job's signals (a
# caught signal is reset to the default in the ranks by exec, an ignored one would not be).
_JOB = """
import json, os, signal, subprocess, sys
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
    signal.signal(sig, lambda *_: None)
cmd, ranks, logs = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
procs = []
for rank in range(ranks):
    env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank)}
    with open(os.path.join(logs, f"rank{rank}.log"), "w") as out:
        procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT))
codes = []
for p in procs:
    while True:
        try:
            codes.append(p.wait())
            break
        except InterruptedError:
            pass
print(json.dumps(codes))
"""


def run_job_in_own_session(
    cmd: list[str],
    ranks: int,
    port: int,
    logs: Path,
    env: dict | None = None,
    timeout_s: float = 240.0,
) -> list[tuple[int, str]]:
    """Run ``ranks`` copies of ``cmd`` as srun runs a job step's tasks (RANK, WORLD_SIZE,
    LOCAL_RANK, LOCAL_SIZE, MASTER_ADDR, MASTER_PORT set) in a session and process group of
    their own, so that a planned ``term_in_PHASE`` fault (pretrain/stability/faults.py) can
    signal the whole job, DataLoader workers included, and nothing else. Returns each rank's
    (exit status, output), rank 0 first."""
    import json
    import sys

    logs.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", **(env or {})}
    full_env.update(MASTER_PORT=str(port), WORLD_SIZE=str(ranks), LOCAL_SIZE=str(ranks))
    job = subprocess.Popen(
        [sys.executable, "-c", _JOB, json.dumps(cmd), str(ranks), str(logs)],
        cwd=REPO,
        env=full_env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = job.communicate(timeout=timeout_s)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)  # the whole job: the ranks are in its group
            job.wait()
    codes = json.loads(out.strip().splitlines()[-1])
    return [(code, (logs / f"rank{r}.log").read_text()) for r, code in enumerate(codes)]
