"""The chaos harness's view of a running job (benchmarks.training.chaos): start it in its own
session, find its processes, wait until they are gone, watch its metrics.jsonl across relaunches,
and check what a run left behind (checkpoints that verify, /dev/shm buffers, the lock, weights).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from benchmarks.common import REPO, one_thread_env

LOCK_NAME = ".lock"  # pretrain/build.py: FolderLock(run / ".lock")
POLL_S = 0.05


def start(
    cmd: list[str], log: Path, faults: str | None, extensions: Path | None = None
) -> subprocess.Popen:
    """The launcher in its own session (a group SIGTERM reaches the job only); ``extensions``:
    its ``TORCH_EXTENSIONS_DIR`` (None: the one this process has)."""
    env = one_thread_env(TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(REPO))
    env.pop("BERTFORGE_FAULTS", None)
    if faults:
        env["BERTFORGE_FAULTS"] = faults
    if extensions is not None:
        env["TORCH_EXTENSIONS_DIR"] = str(extensions)
    with open(log, "w") as out:
        return subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def job_processes(sid: int) -> list:
    """Every live process of the job's session (launcher, its launch.py, the ranks)."""
    import psutil

    found = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
    return found


def rank_process(sid: int, rank: int):
    """The process of local rank ``rank`` (None before the launcher has started it)."""
    import psutil

    for p in job_processes(sid):
        try:
            if f"--local_rank={rank}" in p.cmdline():
                return p
        except psutil.Error:
            continue
    return None


def wait_job_gone(proc: subprocess.Popen, deadline_s: float) -> tuple[int | None, float, bool]:
    """Wait for the launcher and every process of its session; (exit code, seconds, hung)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        code = proc.poll()
        if code is not None and not job_processes(proc.pid):
            return code, time.monotonic() - t0, False
        time.sleep(POLL_S)
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # clean up what hung, then report it
    except ProcessLookupError:
        pass
    proc.wait()
    return proc.returncode, time.monotonic() - t0, True


class MetricsWatch:
    """The step records a launch adds to RUN/metrics.jsonl. The trainer rewrites the file (a new
    inode) when it starts, dropping records past its resume step: until then, records past it are
    the previous launch's."""

    def __init__(self, path: Path, resume_step: int):
        self.path, self.resume_step = path, resume_step
        self.signature = self._signature()
        self.fresh = not any(r["step"] > resume_step for r in self._read("train"))
        self.seen: dict[int, float] = {}  # step -> when first seen (monotonic)

    def _signature(self) -> tuple[int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_ctime_ns  # nobody writes the file until the trainer rewrites it

    def _read(self, split: str) -> list[dict]:
        from bertforge.pretrain.components.metrics import read_metrics

        try:
            return read_metrics(self.path, split)
        except FileNotFoundError:
            return []

    def poll(self) -> dict[int, float]:
        """Steps this launch has logged so far, with when each was first seen."""
        if not self.fresh:
            self.fresh = self._signature() != self.signature
        if self.fresh:
            now = time.monotonic()
            for r in self._read("train"):
                if r["step"] > self.resume_step:
                    self.seen.setdefault(r["step"], now)
        return self.seen

    def records(self) -> list[dict]:
        """Train and validation records of this launch (steps past its resume step)."""
        if not self.fresh:
            return []
        out = []
        for split in ("train", "validation"):
            for r in self._read(split):
                if r["step"] > self.resume_step:
                    loss = r["loss" if split == "train" else "val_loss"]
                    out.append({"split": split, "step": r["step"], "loss": loss})
        return out


# ---- checkpoints and what a job leaves --------------------------------------------------------


def newest_verified(run: Path) -> int:
    from bertforge.pretrain.run_folder.run_checkpoints import find_latest

    latest = find_latest(run / "checkpoints", quiet=True)
    return int(latest.name.split("_")[1]) if latest else 0


def leftovers(run: Path, ports: list[int]) -> list[str]:
    """What a finished run must not hold: shm buffers of its ports, its lock, partial folders."""
    from bertforge.pretrain.distributed.shm_buffers import buffers_of_port
    from bertforge.pretrain.run_folder.run_checkpoints import TAG_RE, is_complete, verify

    found = [f"/dev/shm/{p.name}" for port in ports for p in buffers_of_port(port)]
    if (run / LOCK_NAME).exists():
        found.append(f"{run.name}/{LOCK_NAME}")
    for p in sorted((run / "checkpoints").iterdir()) if (run / "checkpoints").is_dir() else []:
        if p.is_dir() and (not TAG_RE.match(p.name) or not is_complete(p) or verify(p)):
            found.append(f"{run.name}/checkpoints/{p.name} (no COMPLETE or does not verify)")
    return found


def same_weights(run: Path, ref: Path, step: int) -> list[str]:
    """Names of the tensors of checkpoint ``step`` that differ between the runs (or the reason)."""
    import torch

    from bertforge.pretrain.run_folder.run_checkpoints import consolidated_state_dict, tag_for

    try:
        a = consolidated_state_dict(run / "checkpoints" / tag_for(step))
        b = consolidated_state_dict(ref / "checkpoints" / tag_for(step))
    except Exception as e:  # a missing final checkpoint fails the run with its reason
        return [f"cannot read the final checkpoints: {e}"]
    if a.keys() != b.keys():
        return [f"different tensors: {sorted(a.keys() ^ b.keys())}"]
    return [k for k in a if not torch.equal(a[k], b[k])]


# ---- one launch, and the kill planned for it ----------------------------------------------------
