"""A real SLURM on this machine runs the project's SLURM scripts as docs/launching.md and
docs/data.md print them (scripts/slurm_train.sh, scripts/slurm_shards.sh; a docs test keeps the
pages and the files equal), adapted to CPU ranks by sbatch options, which override a script's
#SBATCH lines, and by the one ARGS line:

- a 2-task training job is requeued (`scontrol requeue`) in the middle: its ranks save a signal
  checkpoint, the requeued job resumes from it and ends bit-identical (every loss, the weights)
  to a job never requeued, and its log keeps both attempts; the doctor ran once per node in each;
- that uninterrupted job is also the time-limit case: once past the requeued job's steps (a
  constant lr after warmup, so its longer --max_steps changes none of them), its time limit is
  brought near (`scontrol update TimeLimit`, as an administrator may), the script's own
  `--signal=USR1@120` arrives and the job ends in a save, COMPLETED, not TIMEOUT;
- docs/data.md's array job builds shards in two parts, byte-identical (tokenizer too) to a
  build of the whole on one machine.

One cluster (tests/helpers/slurm_harness.py) serves the whole module and the three jobs run side
by side. Skipped, with the reason, without root or without the packages (`make test-slurm`
installs them).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import pytest
import torch
from helpers.commands import REPO, run_cli
from helpers.launch import losses
from helpers.slurm_harness import FINISHED, LocalSlurm, missing_requirements, python_bin

from bertforge.pretrain.components.metrics import read_metrics
from bertforge.pretrain.run_folder.run_checkpoints import (
    STATE_FILE,
    consolidated_state_dict,
    find_latest,
    tag_for,
)

pytestmark = pytest.mark.slow

TRAIN_SCRIPT = REPO / "scripts" / "slurm_train.sh"
SHARDS_SCRIPT = REPO / "scripts" / "slurm_shards.sh"
# The ARGS lines as the pages print them: the only lines the tests replace.
TRAIN_ARGS = (
    'ARGS="--ds_config ds_configs/zero2.json --data /shared/shards --model base '
    '--output_dir /shared/runs/base"'
)
SHARDS_ARGS = (
    'ARGS="--input /shared/corpus/ --output /shared/shards --vocab_size 30522 --max_seq_len 128"'
)
# One node of 2 CPU tasks instead of 4 nodes x 8 GPUs; each sbatch option overrides its #SBATCH
# line, --open-mode and --requeue stay the script's own.
ON_CPU = ["--nodes=1", "--ntasks-per-node=2", "--gpus-per-node=0", "--cpus-per-task=1"]
STEPS = 60  # of the requeued job; the reference trains on until its time limit
REQUEUE_AFTER = 8  # logged steps
SIGNAL_BEFORE = 120  # s: the script's --signal=USR1@120


def adapted(script: Path, doc_args: str, args: str, dest: Path) -> Path:
    """`script` with its ARGS line (as the page prints it) replaced by `args`."""
    text = script.read_text(encoding="utf-8")
    assert text.count(doc_args) == 1, f"{script} no longer has the line {doc_args}"
    dest.write_text(text.replace(doc_args, f'ARGS="{args}"'), encoding="utf-8")
    return dest


def train_args(shards: Path, run: Path, steps: int) -> str:
    return (
        f"--ds_config ds_configs/cpu.json --data {shards} --model tiny --output_dir {run} "
        f"--max_steps {steps} --micro_batch_size 4 --global_batch_size 16 --lr 1e-3 "
        f"--warmup_steps 1 --decay constant --save_interval {STEPS} --keep_last 100 "
        "--num_workers 1 --progress false --eval_batches 2"
    )


def seconds(slurm_time: str) -> int:
    """[D-]HH:MM:SS (scontrol's RunTime) in seconds."""
    days, _, hms = slurm_time.rpartition("-")
    h, m, s = (int(x) for x in hms.split(":"))
    return int(days or 0) * 86400 + h * 3600 + m * 60 + s


def steps_logged(run: Path) -> int:
    path = run / "metrics.jsonl"
    return sum(1 for r in read_metrics(path) if "split" not in r) if path.is_file() else 0


def job_log(folder: Path, name: str) -> str:
    """The text of the one log file matching `name` (a glob) in `folder`."""
    found = sorted(folder.glob(name))
    assert len(found) == 1, f"{name}: {found}"
    return found[0].read_text(errors="replace")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = missing_requirements()
    if reason:
        pytest.skip(f"SLURM: {reason}")
    slurm = LocalSlurm(tmp_path_factory.mktemp("slurm"))
    yield slurm
    slurm.close()


@pytest.fixture(scope="module")
def jobs(cluster: LocalSlurm, english_shards, english_corpus, tmp_path_factory) -> dict:
    """Submit the three jobs at once, then act on the two training jobs as they train: requeue
    the first after REQUEUE_AFTER steps and start it again at once (a requeued job otherwise
    waits AuthInfo's cred_expire, 120 s); bring the second's time limit near once it is past
    STEPS."""
    tmp = tmp_path_factory.mktemp("slurm_jobs")
    logs = tmp / "logs"
    logs.mkdir()
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {
        "PATH": f"{python_bin(tmp / 'bin')}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": path,
        "TOKENIZERS_PARALLELISM": "false",
    }
    jobs: dict = {"logs": logs}
    for name, steps in (("requeued", STEPS), ("reference", 1_000_000)):
        run = tmp / name
        args = train_args(english_shards, run, steps)
        script = adapted(TRAIN_SCRIPT, TRAIN_ARGS, args, tmp / f"{name}.sh")
        job = cluster.sbatch(
            script,
            *ON_CPU,
            "--time=15",
            f"--job-name={name}",
            f"--output={logs}/%x-%j.log",
            cwd=REPO,
            env=env,
        )
        jobs[name] = {"job": job, "run": run}
    # docs/data.md: `prepare` on the login node, then the array.
    shards = tmp / "array_shards"
    build = (
        f"--input {english_corpus} --output {shards} --vocab_size 2000 --max_seq_len 128 "
        "--validation_fraction 0.05"
    )
    run_cli("-m", "data_prep", "prepare", *build.split(), env=env)
    script = adapted(SHARDS_SCRIPT, SHARDS_ARGS, build, tmp / "shards.sh")
    array = cluster.sbatch(
        script,
        "--array=0-1",
        "--cpus-per-task=1",
        "--time=15",
        f"--output={logs}/%x-%A_%a.log",
        cwd=REPO,
        env=env,
    )
    jobs["array"] = {"job": array, "shards": shards}

    requeued, reference = jobs["requeued"], jobs["reference"]
    todo = {"requeue", "time limit"}
    deadline = time.monotonic() + 400
    while todo:
        for name in ("requeued", "reference"):
            state = cluster.state(jobs[name]["job"])
            log = sorted(logs.glob(f"{name}-*.log"))
            assert state[0] not in FINISHED, (name, state, log and log[0].read_text())
        assert time.monotonic() < deadline, (todo, cluster.daemon_logs())
        if "requeue" in todo and steps_logged(requeued["run"]) >= REQUEUE_AFTER:
            cluster.run("scontrol", "requeue", requeued["job"], check=True)
            wait = time.monotonic() + 90  # the ranks save (within KillWait), then it is pending
            while cluster.state(requeued["job"])[0] != "PENDING":
                assert time.monotonic() < wait, cluster.state(requeued["job"])
                time.sleep(0.3)
            requeued["held"] = cluster.state(requeued["job"])[1]
            cluster.run(
                "scontrol", "update", f"JobId={requeued['job']}", "StartTime=now", check=True
            )
            todo.remove("requeue")
        if "time limit" in todo and steps_logged(reference["run"]) >= STEPS:
            # SLURM checks its time limits every 30 s and sends --signal=USR1@120 at the first
            # check within 120 + 30 s of the end: a limit 60-120 s away signals at the next one.
            elapsed = seconds(cluster.jobs(reference["job"])[0]["RunTime"])
            minutes = math.ceil((elapsed + 60) / 60)
            cluster.run(
                "scontrol",
                "update",
                f"JobId={reference['job']}",
                f"TimeLimit={minutes}",
                check=True,
            )
            reference["limit_s"] = minutes * 60
            todo.remove("time limit")
        time.sleep(0.2)
    return jobs


def finished(cluster: LocalSlurm, jobs: dict, name: str, timeout: float = 300) -> dict:
    """The job's record once finished, with its log."""
    entry = jobs[name]
    (record,) = cluster.wait_finished(entry["job"], timeout)
    log = job_log(jobs["logs"], f"{name}-{entry['job']}.log")
    assert record["JobState"] == "COMPLETED" and record["ExitCode"] == "0:0", (
        f"{record}\n{log[-6000:]}\n{cluster.daemon_logs()}"
    )
    return {**record, "log": log}


def test_a_requeued_job_resumes_from_its_signal_checkpoint_bit_identical(cluster, jobs):
    requeued = finished(cluster, jobs, "requeued")
    finished(cluster, jobs, "reference")
    run, ref = jobs["requeued"]["run"], jobs["reference"]["run"]
    assert jobs["requeued"]["held"] == "BeginTime" and requeued["Restarts"] == "1"
    log = requeued["log"]
    # --open-mode=append: the first attempt's lines are still there, then the second's.
    first, second = log.index("attempt 1 of job"), log.index("attempt 2 of job")
    stopped = log.index("stopped by a signal after step")
    assert first < log.index("starting fresh") < stopped < second < log.index("resumed from")
    resumed = [p for p in (run / "checkpoints").iterdir() if f"resumed from {p} " in log]
    assert len(resumed) == 1, log[-4000:]
    state = json.loads((resumed[0] / STATE_FILE).read_text())
    assert state["reason"] == "signal" and REQUEUE_AFTER <= state["step"] < STEPS
    # Every loss of both attempts, and the weights at the end, as the job never requeued.
    got = losses(run)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert got == {step: loss for step, loss in losses(ref).items() if step <= STEPS}
    assert find_latest(run / "checkpoints").name == tag_for(STEPS)
    a = consolidated_state_dict(run / "checkpoints" / tag_for(STEPS))
    b = consolidated_state_dict(ref / "checkpoints" / tag_for(STEPS))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_doctor_runs_once_per_node_in_each_attempt(cluster, jobs):
    for name, attempts in (("requeued", 2), ("reference", 1)):
        log = finished(cluster, jobs, name)["log"]
        assert log.count("All checks passed.") == attempts, log[-4000:]
        assert "can't honor --ntasks-per-node" not in log
        # The dry run printed the job's batch at its 2 ranks.
        assert "{'global_batch_size': 16, 'micro_batch_size': 4, 'grad_accum': 2," in log


def test_usr1_near_the_time_limit_ends_in_a_save(cluster, jobs):
    record = finished(cluster, jobs, "reference")  # COMPLETED: not TIMEOUT
    assert "stopped by a signal after step" in record["log"], record["log"][-4000:]
    assert seconds(record["RunTime"]) < jobs["reference"]["limit_s"]
    run = jobs["reference"]["run"]
    state = json.loads((find_latest(run / "checkpoints") / STATE_FILE).read_text())
    assert state["reason"] == "signal" and state["step"] == max(losses(run)) > STEPS


def test_the_shards_array_builds_what_one_machine_builds(cluster, jobs, english_shards):
    entry = jobs["array"]
    records = cluster.wait_finished(entry["job"], 300)
    logs = {t: job_log(jobs["logs"], f"shards-{entry['job']}_{t}.log") for t in (0, 1)}
    assert [r["JobState"] for r in records] == ["COMPLETED"] * 2, (records, logs)
    shards = entry["shards"]
    assert json.loads((shards / "manifest.json").read_text())["partitions"] == 2
    # The parts' shards and tokenizer (trained by `prepare`) are the single build's, byte for byte.
    for sub in ("train", "validation", "tokenizer"):
        names = sorted(p.name for p in (english_shards / sub).iterdir())
        assert names == sorted(p.name for p in (shards / sub).iterdir())
        for name in names:
            assert (shards / sub / name).read_bytes() == (english_shards / sub / name).read_bytes()
