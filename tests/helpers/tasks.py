"""Start the ranks of a job as srun (or one launcher per node) starts them, and time their ends.

No launcher in between: each rank is its own process with RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_SIZE, MASTER_ADDR and MASTER_PORT set, so when one dies nobody kills the others: what they
do next is the trainer's own doing (the watchdog tests, tests/e2e/test_rank_watchdog.py).
Several jobs can run side by side (:func:`wait_all`), so their waits overlap.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass
class TaskEnd:
    """How one rank ended: its exit status (negative: killed by that signal), when
    (``time.monotonic()``) and its output."""

    code: int
    ended_at: float
    output: str


class Tasks:
    """``ranks`` copies of ``cmd`` on 127.0.0.1:``port``, each in its own session (as on its
    own node), output to ``logs/rank{r}.log``."""

    def __init__(self, cmd: list[str], ranks: int, port: int, logs: Path, env: dict | None = None):
        base = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", **(env or {})}
        base.update(MASTER_PORT=str(port), WORLD_SIZE=str(ranks), LOCAL_SIZE=str(ranks))
        logs.mkdir(parents=True, exist_ok=True)
        self.logs, self.procs, self.ended = logs, [], {}
        for rank in range(ranks):
            with open(logs / f"rank{rank}.log", "w") as out:
                self.procs.append(
                    subprocess.Popen(
                        cmd,
                        cwd=REPO,
                        env={**base, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )

    def poll(self) -> bool:
        """Record the ranks that ended since the last call; True when every rank has."""
        for rank, p in enumerate(self.procs):
            if rank not in self.ended and p.poll() is not None:
                self.ended[rank] = time.monotonic()
        return len(self.ended) == len(self.procs)

    def output(self, rank: int) -> str:
        return (self.logs / f"rank{rank}.log").read_text()

    def kill(self) -> None:
        """SIGKILL every rank still running (a stopped one too) and reap it."""
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    def ends(self) -> list[TaskEnd]:
        return [
            TaskEnd(p.returncode, self.ended[r], self.output(r)) for r, p in enumerate(self.procs)
        ]


def wait_all(
    jobs: list[Tasks], timeout_s: float = 240.0, tick: Callable[[], None] | None = None
) -> None:
    """Wait until every rank of every job has ended, calling ``tick()`` (if given) every 50 ms;
    ranks still running after ``timeout_s`` are killed and the test fails, showing their logs."""
    deadline = time.monotonic() + timeout_s
    try:
        while not all([job.poll() for job in jobs]) and time.monotonic() < deadline:
            if tick is not None:
                tick()
            time.sleep(0.05)
        late = [
            f"--- {job.logs.name} rank {r}\n{job.output(r)[-3000:]}"
            for job in jobs
            for r in range(len(job.procs))
            if r not in job.ended
        ]
        assert not late, "ranks still running after the timeout:\n" + "\n".join(late)
    finally:
        for job in jobs:
            job.kill()
