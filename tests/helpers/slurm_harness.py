"""A real SLURM on this machine for the SLURM tests: Debian's `slurm-wlm` and `munge`, each daemon
of the test's own (munged, slurmctld, slurmd in the foreground, started as children of the test),
with every file they write (config, key, socket, state, spool, logs) in one temporary folder,
ports picked free, and job ids from a random first id, so the scripts' MASTER_PORT (20000 + job id
mod 20000) differs between sessions; none of the packages' default paths (/etc/slurm,
/etc/munge, /run/munge, /var/spool/slurm*) is used.

`make slurm-packages` (run by `make test-slurm` and by .ci/run) installs the packages where apt
works as root; without them the tests skip, saying so.

`close()` cancels what is still queued or running, then stops the daemons by their process ids and
ends any process of the cluster's jobs that outlived them (found by this cluster's SLURM_CONF in
its environment: slurmstepd leaves slurmd's process tree).
"""

from __future__ import annotations

import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

DAEMONS = {
    "munged": "/usr/sbin/munged",
    "slurmctld": "/usr/sbin/slurmctld",
    "slurmd": "/usr/sbin/slurmd",
}
CLIENTS = ("sbatch", "srun", "scontrol", "squeue", "scancel", "sinfo", "mungekey")
PACKAGES = "slurm-wlm munge"
CPUS = 16  # declared (SlurmdParameters=config_overrides): the tests' jobs run side by side
FINISHED = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
}


def missing_requirements() -> str | None:
    """Why a SLURM cannot be started here, or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root (slurmd starts the jobs' tasks)"
    missing = [n for n, p in DAEMONS.items() if not os.access(p, os.X_OK)]
    missing += [c for c in CLIENTS if not shutil.which(c)]
    if missing:
        return (
            f"missing {', '.join(missing)}: `make slurm-packages` (apt-get install -y {PACKAGES}; "
            "`make test-slurm` and .ci/run run it)"
        )
    host = socket.gethostname().split(".")[0]
    try:
        socket.gethostbyname(host)
    except OSError:
        return f"this machine's name {host!r} does not resolve (the jobs' MASTER_ADDR)"
    return None


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def python_bin(folder: Path) -> Path:
    """A folder whose `python` and `python3` exec this interpreter (a wrapper, not a link: a
    link outside a venv's bin/ would lose the venv), and whose `bertforge` is `python -m
    bertforge`: first on the jobs' PATH, so the scripts' commands run the code under test."""
    folder.mkdir(parents=True, exist_ok=True)
    python = shlex.quote(sys.executable)
    for name, run in (("python", ""), ("python3", ""), ("bertforge", " -m bertforge")):
        wrapper = folder / name
        wrapper.write_text(f'#!/bin/sh\nexec {python}{run} "$@"\n')
        wrapper.chmod(0o755)
    return folder


class LocalSlurm:
    """One node (this machine, `CPUS` CPUs declared), one partition. Start with
    `LocalSlurm(tmp)`, stop with `.close()`."""

    def __init__(self, tmp: Path):
        self.dir = tmp
        self.host = socket.gethostname().split(".")[0]
        self.logs = tmp / "log"
        for sub in ("munge", "state", "spool", "log"):
            (tmp / sub).mkdir(parents=True, exist_ok=True)
        (tmp / "munge").chmod(0o700)
        self.conf = tmp / "slurm.conf"
        self.procs: dict[str, subprocess.Popen] = {}
        self._jobs: set[str] = set()
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    # ---- start and stop ------------------------------------------------------------------
    def _start(self) -> None:
        key, sock = self.dir / "munge" / "munge.key", self.dir / "munge" / "munge.socket"
        subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True)
        ctld_port, slurmd_port = _free_ports(2)
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=bertforge-test",
                    f"SlurmctldHost={self.host}(127.0.0.1)",
                    f"SlurmctldPort={ctld_port}",
                    f"SlurmdPort={slurmd_port}",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={sock}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    f"StateSaveLocation={self.dir / 'state'}",
                    f"SlurmdSpoolDir={self.dir / 'spool'}",
                    f"SlurmctldPidFile={self.dir / 'slurmctld.pid'}",
                    f"SlurmdPidFile={self.dir / 'slurmd.pid'}",
                    f"SlurmctldLogFile={self.logs / 'slurmctld.log'}",
                    f"SlurmdLogFile={self.logs / 'slurmd.log'}",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "MpiDefault=none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "JobCompType=jobcomp/none",
                    "SchedulerType=sched/backfill",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core",
                    "ReturnToService=2",
                    "MinJobAge=3600",  # finished jobs stay visible to scontrol for the tests
                    # The scripts' MASTER_PORT is 20000 + job id: 21000-32000, below the
                    # ephemeral ports (32768+) that other tests' free ports come from.
                    f"FirstJobId={random.randrange(1000, 12000)}",
                    "SlurmdParameters=config_overrides",
                    f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs={CPUS} State=UNKNOWN",
                    f"PartitionName=test Nodes={self.host} Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )
        env = self.env()
        munge = self.dir / "munge"
        self._daemon(
            "munged",
            [
                DAEMONS["munged"],
                "--foreground",
                "--force",  # as root, in a folder of root's
                f"--key-file={key}",
                f"--socket={sock}",
                f"--pid-file={munge / 'munged.pid'}",
                f"--log-file={self.logs / 'munged.log'}",
                f"--seed-file={munge / 'munged.seed'}",
            ],
            env,
        )
        self._wait(sock.exists, 10, "munged made no socket")
        self._daemon("slurmctld", [DAEMONS["slurmctld"], "-D", "-c", "-f", str(self.conf)], env)
        self._daemon("slurmd", [DAEMONS["slurmd"], "-D", "-f", str(self.conf)], env)
        self._wait(
            lambda: self.run("sinfo", "-h", "-o", "%T").stdout.strip() == "idle",
            30,
            "the node did not become idle",
        )

    def _daemon(self, name: str, cmd: list[str], env: dict[str, str]) -> None:
        out = open(self.logs / f"{name}.out", "w")
        self.procs[name] = subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        out.close()

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited {proc.returncode}:\n{self.daemon_logs()}")
            if ready():
                return
            time.sleep(0.2)
        raise RuntimeError(f"{what} in {timeout} s:\n{self.daemon_logs()}")

    def daemon_logs(self, lines: int = 30) -> str:
        """The last lines of every daemon's log (for a failure's message)."""
        parts = []
        for log in sorted(self.logs.iterdir()):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {log.name}\n" + "\n".join(tail))
        return "\n".join(parts)

    def close(self) -> None:
        """Cancel this cluster's jobs, stop the daemons by pid, end what their jobs left."""
        import psutil

        if "slurmctld" in self.procs and self._jobs and self.procs["slurmctld"].poll() is None:
            self.run("scancel", *sorted(self._jobs))
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline and self.run("squeue", "-h").stdout.strip():
                time.sleep(0.5)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        # slurmstepd and the tasks it started are no children of slurmd (they daemonize); they
        # carry this cluster's SLURM_CONF.
        left = []
        for p in psutil.process_iter():
            try:
                if p.environ().get("SLURM_CONF") == str(self.conf) and p.pid != os.getpid():
                    left.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        for p in left:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(left, timeout=10)

    # ---- commands ------------------------------------------------------------------------
    def env(self, **extra: str) -> dict[str, str]:
        """This environment for this cluster: its SLURM_CONF, no SLURM_* of an enclosing job."""
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))
        }
        return {**env, "SLURM_CONF": str(self.conf), **extra}

    def run(self, *cmd: str, check: bool = False, **kwargs) -> subprocess.CompletedProcess:
        """A SLURM client command against this cluster."""
        proc = subprocess.run(
            cmd, env=self.env(), capture_output=True, text=True, timeout=60, **kwargs
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{' '.join(cmd)} -> {proc.returncode}\n{proc.stdout}{proc.stderr}"
            )
        return proc

    def sbatch(self, script: Path, *options: str, cwd: Path, env: dict[str, str]) -> str:
        """Submit `script` with `options` (they override its #SBATCH lines); the job id."""
        proc = subprocess.run(
            ["sbatch", "--parsable", *options, str(script)],
            env=self.env(**env),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if proc.returncode != 0:
            raise AssertionError(f"sbatch {script}: {proc.stdout}{proc.stderr}")
        job = proc.stdout.strip().split(";")[0]
        self._jobs.add(job)
        return job

    def jobs(self, job: str) -> list[dict[str, str]]:
        """`scontrol show job` of `job` (one record per array task), as key -> value."""
        out = self.run("scontrol", "-o", "show", "job", job).stdout
        return [dict(re.findall(r"(\w+)=(\S*)", line)) for line in out.splitlines() if line]

    def state(self, job: str) -> tuple[str, str]:
        """(JobState, Reason) of a job that is not an array."""
        rec = self.jobs(job)[0]
        return rec["JobState"], rec.get("Reason", "")

    def wait_finished(self, job: str, timeout: float) -> list[dict[str, str]]:
        """Wait until every record of `job` has finished; the records."""
        deadline = time.monotonic() + timeout
        while True:
            records = self.jobs(job)
            if records and all(r["JobState"] in FINISHED for r in records):
                return records
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job} not finished in {timeout} s: {records}")
            time.sleep(1)

    def wait_state(self, job: str, wanted: tuple[str, str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.state(job) != wanted:
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job} is {self.state(job)}, not {wanted}")
            time.sleep(0.3)
