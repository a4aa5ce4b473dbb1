"""The chaos test: a 2-rank run killed K times at seeded random moments, restarted each time with
``--resume auto``, must end bit-identical to a run that was never interrupted.

    python -m benchmarks.training.chaos --out /tmp/chaos --steps 300 --kills 30 --seed 0
        [--ds_config ds_configs/cpu.json] [--save_interval 8] [--eval_interval 12]

The job is launched as a user launches it (the DeepSpeed launcher, in its own session), tiny
model with dropout, interval saves and validation passes. Each kill is drawn from five moments:
``step`` (after a random number of new step records in metrics.jsonl plus a random delay),
``save`` and ``validation`` (the planned faults ``kill_in_PHASE`` / ``term_in_PHASE`` of
``BERTFORGE_FAULTS`` at a save or validation step still ahead of the run), ``startup`` (a
random delay after launch, before the first step) and ``op_build`` (the launch, and those after
it, get a new empty ``TORCH_EXTENSIONS_DIR`` under ``OUT/op_builds``, so its ranks build
DeepSpeed's ops first; the kill fires a random delay after torch's build ``lock`` appears), and
from two signals: ``kill`` (SIGKILL to one rank process; at ``op_build`` the rank that builds) or
``term`` (SIGTERM to the job's whole process group, as a scheduler preempts).
After each kill every process of the job must end within ``--hang_timeout_s``; then the same
command is started again with ``--resume auto`` until the run reaches ``--steps``.

It passes when: every training loss (and validation loss) ever logged, the records of redone
steps included, equals the uninterrupted run's at that step exactly, and the final history holds
each step 1..N once; the final weights are bit-identical; each relaunch resumed from the newest
complete checkpoint that verified; no job hung; no ``/dev/shm/deepspeed_*`` buffer of any of its
ports, no run lock (``RUN/.lock``), no torch build lock and no checkpoint folder without its
``COMPLETE`` marker is left. A kill whose moment the run never reached (it ended first) is
reported as unreachable and fails the run. ``OUT/chaos_summary.json`` holds the figures, with
paths relative to ``OUT``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks.common import CPU_DS_CONFIG, REPO, build_shards
from benchmarks.training.chaos_job import (
    POLL_S,
    MetricsWatch,
    newest_verified,
    rank_process,
    start,
    wait_job_gone,
)
from benchmarks.training.chaos_summary import report, summarize
from bertforge.pretrain.config import command_line
from bertforge.pretrain.distributed import op_builds
from bertforge.pretrain.distributed.startup import free_port

# step, save and op_build take one signal of a round and validation and startup the other: a
# round of five then holds a SIGKILL inside steps, inside a save and inside a build (or SIGTERMs).
MOMENTS = ("step", "validation", "save", "startup", "op_build")
SIGNALS = ("kill", "term")


@dataclass
class Settings:
    """One chaos run's sizes; the defaults are the CI form's."""

    steps: int = 36
    kills: int = 5
    seed: int = 0
    ds_config: str = str(CPU_DS_CONFIG)
    save_interval: int = 6
    eval_interval: int = 9
    keep_last: int = 2
    hang_timeout_s: float = 120.0
    launch_timeout_s: float = 900.0
    extra: list[str] = field(default_factory=list)


@dataclass
class Launch:
    """What one launch of the job did."""

    index: int
    resume_expected: int  # the newest verified checkpoint's step before it started (0: none)
    resumed_at: int | None  # the step its log says it resumed from
    reached: int  # the newest step it logged
    exit_code: int | None
    port: int
    log: str
    cmd: str = ""  # the command line, paths relative to the output folder
    kill: dict | None = None  # the kill it suffered (None: it ran to the end)
    startup_s: float | None = None  # launch -> its first new step record
    exit_s: float | None = None  # the kill -> every process of the job gone
    records: list[dict] = field(default_factory=list)  # train + validation records it logged
    cleared_build_lock: bool = False  # it removed a stale op-build lock (its log says so)


# ---- the job ----------------------------------------------------------------------------------


def train_args(s: Settings, shards: Path, run: Path) -> list[str]:
    """The trainer's flags (launcher and --resume aside): tiny model with dropout, one thread."""
    return command_line.flags(
        {
            "ds_config": s.ds_config,
            "data": shards,
            "output_dir": run,
            "model": "tiny",
            "num_workers": 0,
            "progress": False,
            "global_batch_size": 16,
            "micro_batch_size": 4,
            "lr": 1e-3,
            "warmup_steps": 1,
            "max_steps": s.steps,
            "save_interval": s.save_interval,
            "eval_interval": s.eval_interval,
            "eval_batches": 2,
            "keep_last": s.keep_last,
            "dist_timeout_s": 60,
        },
        switches=False,
    ) + list(s.extra)


def plan_kill(
    rng: random.Random, kind: tuple[str, str], s: Settings, resume: int, startup_s: float
):
    """The kill of one launch: its moment, signal, rank and where/when it fires."""
    (moment, sig), rank = kind, rng.randrange(2)
    kill = {"moment": moment, "signal": sig, "rank": rank}
    if moment in ("save", "validation"):
        every = s.save_interval if moment == "save" else s.eval_interval
        ahead = [t for t in range(every, s.steps, every) if t > resume]
        if sig == "kill":  # a SIGTERM in the last save or validation only ends the run early
            ahead.append(s.steps)
        if ahead:
            kill["at_step"] = rng.choice(ahead[:2])  # one of the next two: the run lasts K kills
            kill["faults"] = f"{sig}_in_{moment}@{kill['at_step']}@{rank}"
            return kill
        kill["moment"] = moment = "step"
        kill["note"] = "no save or validation step ahead of the run: a kill inside steps"
    if moment == "step":
        kill["after_records"] = rng.randint(1, s.save_interval + 1)
        kill["delay_s"] = round(rng.uniform(0.0, 0.3), 3)
    elif moment == "op_build":  # after torch's lock appears: the build takes 20 s or more here
        kill["delay_s"] = round(rng.uniform(0.5, 5.0), 3)
    else:  # startup: well inside the start-up the reference run took
        kill["delay_s"] = round(rng.uniform(0.1, 0.6) * startup_s, 3)
    return kill


def send_to_builder(proc: subprocess.Popen, kill: dict, lock: Path) -> bool:
    """The ``op_build`` kill: SIGTERM to the job, or SIGKILL to the rank holding torch's build
    lock open and to its compiler (as an OOM kill of the rank's cgroup: a compiler orphaned
    alive would only finish its object file); ``kill["rank"]`` becomes that rank's."""
    import psutil

    if kill["signal"] == "term":
        return send(proc, kill)
    ranks = {getattr(rank_process(proc.pid, r), "pid", None): r for r in (0, 1)}
    for pid in op_builds.holders_of(lock):
        kill["rank"] = ranks.get(pid)
        try:
            builder = psutil.Process(pid)
            tree = [builder, *builder.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for p in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        return True
    return False


def send(proc: subprocess.Popen, kill: dict) -> bool:
    """The kill itself, for the moments the harness times (faults fire inside the trainer)."""
    if kill["signal"] == "term":
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            return True
        except ProcessLookupError:
            return False
    while proc.poll() is None:  # at start-up the rank may not exist yet
        p = rank_process(proc.pid, kill["rank"])
        if p is not None:
            try:
                p.send_signal(signal.SIGKILL)
                return True
            except Exception:
                pass
        time.sleep(POLL_S)
    return False


def fired(kill: dict, log: str) -> bool:
    """Whether the trainer fired its planned fault, from the launcher's log: a rank's exit by
    SIGKILL (DeepSpeed's launcher names the last rank it started, whichever died), or the
    launcher itself receiving the group's SIGTERM."""
    if kill["signal"] == "term":
        return "Main process received SIGTERM" in log
    return "exits with return code = -9" in log


def fire_if_due(
    proc: subprocess.Popen, kill: dict, seen: dict[int, float], t0: float, extensions: Path | None
) -> bool:
    """Fire a kill the harness times (``step``, ``startup``, ``op_build``) once its moment has
    come; whether it was sent. ``seen``: the launch's new step records (step -> when seen)."""
    now = time.monotonic()
    if kill["moment"] == "startup":
        if seen:  # too late for start-up: kill at once and say so
            kill["missed"] = "the first step came before the start-up delay"
        return bool(seen or now - t0 >= kill["delay_s"]) and send(proc, kill)
    if kill["moment"] == "op_build":
        locks = op_builds.find_locks(extensions) if extensions else []
        if locks and "lock_seen_s" not in kill:
            kill["lock_seen_s"] = round(now - t0, 2)
        if "lock_seen_s" not in kill:
            if not seen:
                return False
            kill["missed"] = "the first step came before any build lock"
            return send(proc, kill)
        if not locks:  # the build ended before the delay: kill at once and say so
            kill["missed"] = "the build ended before the kill's delay"
            return send(proc, kill)
        return now - t0 - kill["lock_seen_s"] >= kill["delay_s"] and send_to_builder(
            proc, kill, locks[0].path
        )
    if len(seen) < kill["after_records"]:
        return False
    nth = sorted(seen.values())[kill["after_records"] - 1]
    if now - nth >= kill["delay_s"] and send(proc, kill):
        kill["fired_after_step"] = max(seen)
        return True
    return False


def run_launch(
    index: int,
    s: Settings,
    args: list[str],
    logs: Path,
    run: Path,
    kill: dict | None,
    extensions: Path | None = None,
) -> Launch:
    """Start the job (``--resume auto`` after the first), fire its kill, wait until it is gone.
    ``extensions``: the job's ``TORCH_EXTENSIONS_DIR`` (None: the environment's)."""
    port = free_port()
    cmd = command_line.trainer(ranks=2, master_port=port, python=sys.executable) + args
    if index > 0:
        cmd += ["--resume", "auto"]
    log = logs / f"launch_{index:02d}.log"
    expected = newest_verified(run)
    watch = MetricsWatch(run / "metrics.jsonl", expected)
    t0 = time.monotonic()
    proc = start(cmd, log, kill.get("faults") if kill else None, extensions)
    shown = " ".join(cmd).replace(str(run.parent), "OUT").replace(str(REPO), ".")
    launch = Launch(index, expected, None, expected, None, port, log.name, shown, kill)
    fired_at, ranks, sent = None, [], False
    try:
        while proc.poll() is None and time.monotonic() - t0 < s.launch_timeout_s:
            seen = watch.poll()
            if seen and launch.startup_s is None:
                launch.startup_s = round(min(seen.values()) - t0, 2)
            if len(ranks) < 2:
                ranks = [p for r in (0, 1) if (p := rank_process(proc.pid, r)) is not None]
            elif fired_at is None and not all(p.is_running() for p in ranks):
                fired_at = time.monotonic()  # a planned fault (or the end): the first rank gone
            if kill and fired_at is None and "faults" not in kill:
                if fire_if_due(proc, kill, seen, t0, extensions):
                    fired_at, sent = time.monotonic(), True
            time.sleep(POLL_S)
        if proc.poll() is None and fired_at is None:
            kill = launch.kill = {**(kill or {}), "hung": "the launch ran past --launch_timeout_s"}
            fired_at = time.monotonic()
        if fired_at is None:  # the trainer fired its planned fault, or it ended by itself
            fired_at = time.monotonic()
        code, _, hung = wait_job_gone(proc, s.hang_timeout_s)
        launch.exit_s = time.monotonic() - fired_at
        if kill is not None and kill.get("moment") == "op_build" and extensions is not None:
            kill["left_build_lock"] = bool(op_builds.find_locks(extensions))  # for the next
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    launch.exit_code = code
    launch.exit_s = round(launch.exit_s, 2)
    if hung and kill is not None:
        kill["hung"] = f"processes still alive {s.hang_timeout_s:.0f} s after the kill"
    watch.poll()
    launch.records = watch.records()
    launch.reached = max([expected, *watch.seen])
    text = log.read_text(errors="replace")
    if kill is not None:
        kill["fired"] = fired(kill, text) if "faults" in kill else sent
    launch.cleared_build_lock = op_builds.STALE_REMOVED in text
    found = re.search(r"resumed from \S+ at step (\d+)", text)
    launch.resumed_at = int(found.group(1)) if found else (0 if launch.startup_s else None)
    return launch


PORT_TAKEN = "could not open the rendezvous store on port"  # the trainer's EADDRINUSE message
PORT_ATTEMPTS = 3


def launch_on_a_free_port(
    index: int,
    s: Settings,
    args: list[str],
    logs: Path,
    run: Path,
    kill: dict | None,
    extensions: Path | None = None,
) -> Launch:
    """:func:`run_launch`, started again on a new port when another process took the port
    between ``free_port`` and the rendezvous (a race with concurrent jobs, not a fault of the
    run: the launch never got past its rendezvous). The kill is planned afresh for the retry;
    ``kill`` ends as the last attempt's (the caller reads it)."""
    for attempt in range(1, PORT_ATTEMPTS + 1):
        planned = copy.deepcopy(kill)
        launch = run_launch(index, s, args, logs, run, planned, extensions)
        log_file = logs / launch.log
        taken = PORT_TAKEN in log_file.read_text(errors="replace")
        if not taken or launch.reached != launch.resume_expected or attempt == PORT_ATTEMPTS:
            break
        log_file.rename(log_file.with_suffix(f".port_taken_{attempt}.log"))
        print(f"chaos: launch {index}: port {launch.port} was taken; again on another port")
    if kill is not None:
        kill.clear()
        kill.update(launch.kill or planned)
        launch.kill = kill
    return launch


# ---- the whole test ---------------------------------------------------------------------------


def kinds_for(seed: int, kills: int) -> list[tuple[str, str]]:
    """The (moment, signal) of each of ``kills`` kills, a function of the seed alone: every
    moment once in each round of five, the signals alternating over the rounds, each round
    shuffled, so that K >= 5 covers every moment and K >= 10 every moment with both signals."""
    rng = random.Random(f"kinds-{seed}")
    kinds: list[tuple[str, str]] = []
    first = rng.randrange(2)
    while len(kinds) < kills:
        turn = len(kinds) // len(MOMENTS)
        round_ = [(m, SIGNALS[(first + i + turn) % 2]) for i, m in enumerate(MOMENTS)]
        rng.shuffle(round_)
        kinds += round_
    return kinds[:kills]


def reference_run(s: Settings, shards: Path, out: Path) -> dict:
    """The uninterrupted run: its losses, wall time, start-up and seconds per step."""
    ref = out / "reference"
    args = train_args(s, shards, ref)
    launch = launch_on_a_free_port(0, s, args, out / "reference_logs", ref, None)
    seen_first = launch.startup_s or 0.0
    losses = {(r["split"], r["step"]): r["loss"] for r in launch.records}
    return {"launch": launch, "losses": losses, "startup_s": seen_first}


def chaos(s: Settings, shards: Path, out: Path) -> dict:
    """Run the reference, then the killed run; returns the summary (also written as JSON)."""
    rng = random.Random(s.seed)
    for logs in ("reference_logs", "chaos_logs"):
        (out / logs).mkdir(parents=True, exist_ok=True)
    t_ref = time.monotonic()
    ref = reference_run(s, shards, out)
    ref_wall = time.monotonic() - t_ref
    ref_launch = ref["launch"]
    step_s = (ref_wall - (ref_launch.startup_s or 0)) / max(1, s.steps)
    run = out / "chaos"
    args = train_args(s, shards, run)
    pending = kinds_for(s.seed, s.kills)
    launches: list[Launch] = []
    t_chaos = time.monotonic()
    extensions: Path | None = None  # the environment's build folder until an op_build kill
    while True:
        resume = newest_verified(run)
        kill = plan_kill(rng, pending[0], s, resume, ref["startup_s"]) if pending else None
        if kill and kill["moment"] == "op_build":  # a new empty folder: this launch builds
            extensions = out / "op_builds" / f"launch_{len(launches):02d}"
        launch = launch_on_a_free_port(
            len(launches), s, args, out / "chaos_logs", run, kill, extensions
        )
        launches.append(launch)
        with open(out / "chaos_progress.jsonl", "a") as f:  # what a run cut short had reached
            f.write(json.dumps({k: v for k, v in asdict(launch).items() if k != "records"}) + "\n")
        finished = launch.exit_code == 0 and newest_verified(run) == s.steps
        if kill is not None:
            pending.pop(0)
            if finished and not kill["fired"]:
                kill["unreachable"] = "the run reached its last step before this kill's moment"
            elif not kill["fired"]:
                kill["ended_first"] = f"the launch ended by itself (exit {launch.exit_code})"
        if finished or kill is None or kill.get("hung") or len(launches) > s.kills + 3:
            break
    chaos_wall = time.monotonic() - t_chaos
    return summarize(s, out, ref, ref_wall, step_s, launches, chaos_wall, pending)


def parse_args(argv: list[str] | None) -> tuple[Settings, argparse.Namespace]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for both runs and the summary")
    p.add_argument("--shards", type=Path, help="a finished shard build (default: build one)")
    d = Settings()
    for name in ("steps", "kills", "seed", "save_interval", "eval_interval", "keep_last"):
        p.add_argument(f"--{name}", type=int, default=getattr(d, name))
    p.add_argument("--ds_config", default=d.ds_config)
    p.add_argument("--hang_timeout_s", type=float, default=d.hang_timeout_s)
    p.add_argument("--launch_timeout_s", type=float, default=d.launch_timeout_s)
    ns, extra = p.parse_known_args(argv)
    fields = {k: v for k, v in vars(ns).items() if k not in ("out", "shards")}
    return Settings(**fields, extra=extra), ns


def main(argv: list[str] | None = None) -> int:
    s, ns = parse_args(argv)
    out = ns.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    shards = ns.shards
    if shards is None:
        from bertforge.data_prep.sample_corpus import write_english_corpus

        corpus = write_english_corpus(out / "corpus" / "pydoc_topics.txt")
        shards = build_shards(
            corpus, out / "shards", vocab_size=2000, max_seq_len=128, validation_fraction=0.05
        )
    summary = chaos(s, shards.resolve(), out)
    print(report(summary))
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
