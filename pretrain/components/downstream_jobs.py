"""Periodic downstream evaluation during pretraining, in the background on rank 0.

``--downstream_eval TASKS.json --downstream_interval N``: after the checkpoint of every Nth step
is complete, rank 0 starts ``python -m pretrain.evaluate.downstream RUN@STEP`` (one seed, the
first learning rate of each task's grid, at most ``--downstream_max_examples`` examples; with
``glue:DIR[:TASKS]`` or ``clue:...`` the run_glue protocol on the benchmark's tasks, see
:mod:`pretrain.evaluate.glue.checkpoint_job`) as a separate process and goes on training: no
rank waits, and the training losses are those of a run without it (the job reads the finished
checkpoint, never the live weights or the RNG). Finished
jobs' ``split: "downstream"`` records are copied into metrics.jsonl and TensorBoard at the next
step; at the end of the run rank 0 waits for the jobs still running. Each job writes its records
and its log under ``RUN/downstream/``. Jobs run on the CPU unless ``--downstream_device`` says
otherwise, so they never take memory from training on the GPU.

A job holds a lease on its checkpoint (:mod:`pretrain.checkpoints.leases`), taken right after it
starts and before any later save could prune: ``--keep_last`` keeps that checkpoint until the
job has read it (the job gives the lease back then; this module does too when the job ends, and
a dead job's lease no longer counts). At the end of the run, once the jobs are done, rank 0
prunes again, so nothing is kept beyond ``--keep_last``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bertforge.logs import get_logger
from bertforge.pretrain.checkpoints import leases
from bertforge.pretrain.data.downstream_tasks import load_downstream_tasks
from bertforge.pretrain.data.glue.spec import is_benchmark_spec, resolve_spec
from bertforge.pretrain.run_folder.layout import RunFolder
from bertforge.pretrain.run_folder.run_checkpoints import tag_for

log = get_logger(__name__)

_REPO = Path(__file__).resolve().parents[2]


class DownstreamJobs:
    """Starts, watches and collects the background evaluations of one run (rank 0 only)."""

    def __init__(
        self,
        run_dir: str | os.PathLike,
        tasks: str,
        interval: int,
        *,
        max_examples: int,
        device: str,
        rank: int,
        metrics,
    ) -> None:
        self.root = RunFolder(run_dir).downstream
        self.run_dir, self.tasks, self.interval = Path(run_dir), tasks, interval
        self.max_examples, self.device, self.metrics = max_examples, device, metrics
        self.active = bool(tasks) and interval > 0 and rank == 0
        self.running: dict[int, subprocess.Popen] = {}
        self.leases: dict[int, Path] = {}  # step -> the lease its job holds on the checkpoint
        if self.active:  # a bad tasks file fails now, not in the first background job
            if is_benchmark_spec(tasks):  # the CLI has read the folder; here: is it still there
                resolve_spec(tasks)
            else:
                load_downstream_tasks(tasks, max_examples)
            self.root.mkdir(parents=True, exist_ok=True)

    @classmethod
    def for_run(cls, cfg, rank: int, metrics) -> DownstreamJobs:
        """The jobs of a run from its TrainConfig (inactive without --downstream_eval)."""
        opts = cfg.log
        return cls(
            cfg.run.output_dir,
            opts.downstream_eval,
            opts.downstream_interval,
            rank=rank,
            metrics=metrics,
            max_examples=opts.downstream_max_examples,
            device=opts.downstream_device,
        )

    def after_save(self, step: int) -> None:
        """Start the evaluation of the checkpoint just saved at ``step`` when it is due."""
        if not self.active or step % self.interval or step in self.running:
            return
        out = self.root / f"step_{step:08d}.jsonl"
        out.unlink(missing_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "bertforge.pretrain.evaluate.downstream",
            f"{self.run_dir}@{step}",
            "--tasks",
            self.tasks,
            "--out",
            str(out),
            "--max_examples",
            str(self.max_examples),
            "--device",
            self.device,
        ]
        job_log = open(self.root / f"step_{step:08d}.log", "w", encoding="utf-8")  # noqa: SIM115
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(_REPO), os.environ.get("PYTHONPATH")) if p
            ),
        }
        self.running[step] = subprocess.Popen(
            cmd,
            stdout=job_log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=_REPO,
            env=env,
        )
        job_log.close()  # the child holds its own descriptor
        ckpt = RunFolder(self.run_dir).checkpoints / tag_for(step)
        try:
            self.leases[step] = leases.take(ckpt, self.running[step].pid, "downstream evaluation")
        except OSError as e:  # training goes on; the job may then lose its checkpoint to a prune
            log.warning(f"no lease on {ckpt} for its job ({e}): --keep_last may prune it early")
        log.info(
            f"downstream evaluation of step {step} started "
            f"(log: {self.root / f'step_{step:08d}.log'})"
        )

    def poll(self) -> None:
        """Copy the records of every finished job into the metrics (cheap: no waiting)."""
        for step, proc in list(self.running.items()):
            if proc.poll() is not None:
                self._collect(step, proc.returncode)

    def finish(self, timeout_s: float | None = None) -> None:
        """Wait for the jobs still running (end of training) and collect them."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for step, proc in list(self.running.items()):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                proc.wait(timeout=left)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            self._collect(step, proc.returncode)

    def _collect(self, step: int, returncode: int) -> None:
        del self.running[step]
        lease = self.leases.pop(step, None)
        if lease is not None:  # (the job gave it back once it had read it)
            leases.release(lease)
        out, job_log = self.root / f"step_{step:08d}.jsonl", self.root / f"step_{step:08d}.log"
        if returncode != 0 or not out.is_file():
            tail = job_log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-3:]
            log.warning(
                f"downstream evaluation of step {step} failed "
                f"(exit {returncode}); see {job_log}: {' | '.join(tail)}"
            )
            return
        for line in out.read_text(encoding="utf-8").splitlines():
            if line.strip():
                record: dict[str, Any] = json.loads(line)
                self.metrics.downstream({**record, "step": step, "split": "downstream"})
