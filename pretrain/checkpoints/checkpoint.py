"""Checkpoints that are complete or invisible: DeepSpeed engine state plus our own client state.

Layout of ``RUN/checkpoints/``::

    step_00000010/                 DeepSpeed tag folder (model/optimizer shards, all ranks write)
        trainer_state.json         step, consumed samples, world size, config, tokenizer fingerprint
        README.md                  the command that gives Hugging Face weights (the export)
        rng/rank_00000.pt          each rank's torch / numpy / python RNG states
        COMPLETE                   written last, atomically, by rank 0 after every rank finished
    universal/step_00000010/       DeepSpeed universal checkpoint (made on a world-size change)
    latest                         DeepSpeed's pointer file: the newest complete tag
    zero_to_fp32.py                DeepSpeed's recovery script (copied there by DeepSpeed)

DeepSpeed's own writing of ``latest`` is off (``save_latest=False``: it writes it before the final
barrier, so a crash could leave it naming a partial tag). :meth:`CheckpointManager.save` writes it
itself, atomically, after ``COMPLETE`` and naming the newest complete tag, so DeepSpeed's tools
work unchanged: ``python zero_to_fp32.py . OUT`` in ``checkpoints/`` (no ``--tag``) and
``engine.load_checkpoint("RUN/checkpoints")``. A folder without ``COMPLETE`` is ignored by
:func:`find_latest` and removed before the same tag is saved again.

Verified checkpoints: ``COMPLETE`` is a JSON manifest of every file of the tag folder, made from
each rank's own list of the files it wrote (gathered to rank 0, so it holds on any filesystem
layout; :mod:`pretrain.checkpoints.checkpoint_files`). Finding and verifying checkpoints is
:mod:`pretrain.run_folder.run_checkpoints`; choosing the one to resume from is
:mod:`pretrain.checkpoints.resume`.

Failed saves: every rank catches its own write error (OSError, or torch's RuntimeError for a full
disk) -- DeepSpeed's own writes included, which are recorded rather than raised so the rank still
reaches DeepSpeed's closing barrier -- then one all-gather tells every rank which ranks failed.
A failed save writes no ``COMPLETE``, its partial folder is removed, and pruning only ever runs
after a new checkpoint is complete, so the previous one is untouched. :class:`CheckpointSaveError`
is raised on every rank; the trainer's policy: a periodic save ("interval", "time") warns and the
run retries at the next interval; a final, "signal" or "budget" save stops the run with
``EXIT_SAVE_FAILED``. Remaining risk: a rank killed while writing leaves the others in DeepSpeed's
barrier until the rendezvous timeout (``--dist_timeout_s``); the job then dies with no
``COMPLETE`` written, the previous checkpoint intact.
"""

from __future__ import annotations

import copy
import io
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from bertforge.files import publish_dir, write_bytes_atomic, write_text_atomic
from bertforge.logs import get_logger
from bertforge.preemption import PreemptionHandler  # noqa: F401 - its old home
from bertforge.pretrain.checkpoints.checkpoint_files import (
    DeferredWriteErrors,
    explain_write_error,
    folder_sizes,
    injected_enospc,
    write_marker,
    write_readme,
    written_sizes,
)
from bertforge.pretrain.checkpoints.leases import live_leases
from bertforge.pretrain.checkpoints.resume import ResumePoint, write_latest
from bertforge.pretrain.checkpoints.schedule_override import (
    ScheduleOverride,
    resume_schedule,
)
from bertforge.pretrain.config.train_config import CheckpointConfig
from bertforge.pretrain.distributed.startup import sum_across_ranks
from bertforge.pretrain.run_folder.layout import RunFolder
from bertforge.pretrain.run_folder.run_checkpoints import (
    MARKER,
    STATE_FILE,
    TAG_RE,
    CheckpointError,
    find_latest,
    is_complete,
    list_complete,
    read_state,
    tag_for,
    verify,
)
from bertforge.pretrain.stability.faults import FaultPlan

log = get_logger(__name__)


class CheckpointSaveError(RuntimeError):
    """A save that failed on some rank (raised on every rank); nothing of it is resumable."""

    def __init__(self, message: str, path: Path):
        super().__init__(message)
        self.path = path


def rng_state() -> dict[str, Any]:
    """This process's RNG states (torch CPU and accelerator, numpy, python)."""
    # Lazy: deepspeed takes seconds to import; the commands that import this module without running
    # a job (--help, the doctor) do without it.
    from deepspeed.accelerator import get_accelerator

    state = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    accel = get_accelerator()
    if accel.device_name() != "cpu":
        state["accelerator"] = accel.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    # Lazy: deepspeed (seconds to import) only when a job runs; see the first import here.
    from deepspeed.accelerator import get_accelerator

    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "accelerator" in state:
        get_accelerator().set_rng_state(state["accelerator"])


class CheckpointManager:
    """Saves, prunes and loads checkpoints for one run folder."""

    def __init__(
        self,
        output_dir: str | os.PathLike,
        cfg: CheckpointConfig,
        rank: int,
        world_size: int,
        device: torch.device | None = None,
    ):
        self.root = RunFolder(output_dir).checkpoints
        self.cfg = cfg
        self.keep_last = cfg.keep_last
        self.rank = rank
        self.world_size = world_size
        self.device = device or torch.device("cpu")  # where the cross-rank flags are reduced
        self.last_save_time = time.monotonic()
        self.last_saved_step: int | None = None
        self.faults = FaultPlan()  # BERTFORGE_FAULTS: planned failing saves (tests only)
        self.schedule_override: ScheduleOverride | None = None  # --override_lr_schedule's
        self.ema = None  # --ema's average (pretrain.components.ema): saved and loaded here

    def _barrier(self) -> None:
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()

    def save(self, engine, step: int, state: dict[str, Any]) -> Path:
        """Save engine + client state as ``step_<step>``; all ranks must call this together.

        Raises :class:`CheckpointSaveError` on every rank when any rank failed to write: then no
        ``COMPLETE`` exists, the partial folder is removed, and nothing older was touched.
        """
        tag = tag_for(step)
        path = self.root / tag
        error = None
        if self.rank == 0:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
                if path.exists():  # a partial save of the same step from a crashed run
                    shutil.rmtree(path)
            except OSError as e:
                error = f"preparing {path}: {e}"
        self._barrier()
        full_state = {
            **state,
            "step": step,
            "world_size": self.world_size,
            "tag": tag,
            "saved_at": time.time(),
        }
        files, error = self._write(engine, path, step, full_state, error)
        reports = self._gather((error, files))  # one collective: who failed, who wrote what
        failed = [f"rank {r}: {err}" for r, (err, _) in enumerate(reports) if err]
        if not failed and self.rank == 0:
            written = {k: v for _err, part in reports for k, v in part.items()}
            failed = self._commit(path, written)
        # The closing agreement (was a barrier): every rank learns whether rank 0 committed.
        if self._any(bool(failed)):
            self._discard(path)
            self.last_save_time = time.monotonic()  # a timed save retries one interval later
            raise CheckpointSaveError(self._failure_message(path, failed), path)
        self.last_save_time = time.monotonic()
        self.last_saved_step = step
        return path

    def _write(
        self, engine, path: Path, step: int, full_state: dict[str, Any], error: str | None
    ) -> tuple[dict[str, int], str | None]:
        """This rank's part of a save: DeepSpeed's files, its RNG file, rank 0's state file.

        Returns ({relative path: size} of what this rank wrote, its error or None). DeepSpeed's
        save is called even after an error so that every rank runs its collectives.
        """
        inject = self.faults.due("save_enospc", step, self.rank)
        # universal_checkpoint_info lets ds_to_universal convert ZeRO-1/2 checkpoints later.
        with DeferredWriteErrors(engine, path, injected_enospc if inject else None, error) as ds:
            engine.save_checkpoint(
                str(self.root),
                tag=path.name,
                save_latest=False,
                client_state={"trainer_state": full_state, "universal_checkpoint_info": {}},
            )
        written, error = [p for p in ds.written if path in p.parents], ds.error
        self.faults.signal_if_due("save", step, self.rank)  # planned crash or preemption mid-save
        try:
            if error is None:
                (path / "rng").mkdir(parents=True, exist_ok=True)
                rng_file = path / "rng" / f"rank_{self.rank:05d}.pt"
                buffer = io.BytesIO()
                torch.save(rng_state(), buffer)
                write_bytes_atomic(rng_file, buffer.getbuffer())
                written.append(rng_file)
            if error is None and self.rank == 0:
                text = json.dumps(full_state, indent=2, default=str)
                write_text_atomic(path / STATE_FILE, text)
                written.append(path / STATE_FILE)
                model = engine.module  # the README names this model's padded rows
                rows = model.config.vocab_size
                written.append(write_readme(path, model.arch, model.true_vocab_size, rows))
            if error is None and self.ema is not None and (ema := self.ema.save(path)):
                written.append(ema)  # in the COMPLETE manifest: a torn write is incomplete
            return written_sizes(path, written), error
        except (OSError, RuntimeError) as e:  # torch.save reports a full disk as RuntimeError
            return {}, f"writing {path}: {explain_write_error(e, path)}"

    def _gather(self, report: Any) -> list[Any]:
        """Every rank's ``report`` in rank order (one all_gather_object: gloo and NCCL)."""
        if not (dist.is_initialized() and dist.get_world_size() > 1):
            return [report]
        out: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(out, report)
        return out

    def _any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on any (one all-reduce)."""
        return sum_across_ranks([float(flag)], self.device)[0] > 0

    def _commit(self, path: Path, files: dict[str, int]) -> list[str]:
        """Rank 0, after every rank wrote its files: ``COMPLETE``, then ``latest``, then pruning
        (so older checkpoints go only once this one is complete). Returns the failures."""
        try:
            write_marker(path, files)
        except OSError as e:
            return [f"rank 0: writing {path / MARKER}: {explain_write_error(e, path)}"]
        try:
            write_latest(self.root)
            self._prune(keep=path)
        except OSError as e:  # the checkpoint is complete: only housekeeping was lost
            log.warning(f"after saving {path}: {e}")
        return []

    def _discard(self, path: Path) -> None:
        """Rank 0 removes a failed save's partial folder (best effort: it has no COMPLETE)."""
        if self.rank == 0:
            shutil.rmtree(path, ignore_errors=True)

    def _failure_message(self, path: Path, failed: list[str]) -> str:
        previous = find_latest(self.root, quiet=True)
        kept = (
            f"the previous complete checkpoint {previous} is intact"
            if previous is not None
            else "there is no earlier complete checkpoint"
        )
        detail = "; ".join(failed) if failed else "another rank failed (its message is on rank 0)"
        return f"saving checkpoint {path} failed ({detail}); it was discarded, {kept}"

    def _prune(self, keep: Path | None = None) -> None:
        """Keep the newest ``keep_last`` verified checkpoints (``keep``, the one just saved,
        always among them); drop older complete ones and older partials. Nothing newer than
        ``keep`` is touched, nor a checkpoint a live background job holds a lease on
        (:mod:`pretrain.checkpoints.leases`): it goes at a later prune, once the job has read it."""
        complete = list_complete(self.root)
        good = [p for _, p in complete if p == keep or not verify(p)]
        kept = {p.name for p in good[-self.keep_last :]} | ({keep.name} if keep else set())
        newest = complete[-1][0] if complete else -1
        limit = int(TAG_RE.match(keep.name).group(1)) if keep else newest
        for p in self.root.iterdir() if self.root.is_dir() else []:
            m = TAG_RE.match(p.name)
            if not m or p.name in kept or int(m.group(1)) > limit:
                continue
            if is_complete(p) and (held := live_leases(p)):
                who = ", ".join(f"{h['what']} (pid {h['pid']} on {h['host']})" for h in held)
                log.info(f"keeping {p} beyond --keep_last for now: {who} is reading it")
                continue
            if is_complete(p) or int(m.group(1)) < limit:
                shutil.rmtree(p, ignore_errors=True)
        uni = self.root / "universal"
        if uni.is_dir():
            for p in uni.iterdir():
                if p.name not in kept:
                    shutil.rmtree(p, ignore_errors=True)

    def prune(self) -> None:
        """Rank 0: prune now (the end of a run: checkpoints kept for a background job that has
        read them since go too)."""
        if self.rank == 0:
            self._prune()

    def due(self, step: int, save_interval: int, save_interval_minutes: float) -> str | None:
        """The reason a save is due after ``step`` (interval or time), or None.

        The caller all-reduces rank 0's time test, so every rank saves at the same step.
        """
        if save_interval > 0 and step % save_interval == 0:
            return "interval"
        if (
            save_interval_minutes > 0
            and time.monotonic() - self.last_save_time >= 60.0 * save_interval_minutes
        ):
            return "time"
        return None

    def save_due(self, step: int, preempt: PreemptionHandler, budget: Any = None) -> str | None:
        """Why a checkpoint is due after ``step`` on every rank: "signal", "budget" (the run's
        time budget is used up: the caller ends the run), "interval", "time" or None.
        Collective: all ranks call it each step.

        A signal may reach one rank only, and the clocks of the ranks differ: one all-reduce makes
        the signal (any rank) and rank 0's clock tests common to all, so every rank saves together.
        """
        main = self.rank == 0
        time_due = main and self.due(step, 0, self.cfg.save_interval_minutes) is not None
        spent = main and budget is not None and budget.exhausted()
        fraction = budget.fraction() if main and budget is not None else 0.0
        signal_any, time_rank0, spent_rank0, fraction_rank0 = sum_across_ranks(
            [float(preempt.signal is not None), float(time_due), float(spent), fraction],
            self.device,
        )
        if budget is not None:  # the batch ramp's clock, the same on every rank
            budget.agreed = fraction_rank0
        if signal_any > 0:
            return "signal"
        if spent_rank0 > 0:
            return "budget"
        return self.due(step, self.cfg.save_interval, 0.0) or ("time" if time_rank0 > 0 else None)

    def signalled(self, preempt: PreemptionHandler) -> bool:
        """True on every rank when a stop signal reached any rank (collective: one all-reduce).
        The trainer asks at start-up and after a save, the moments between step boundaries."""
        return sum_across_ranks([float(preempt.signal is not None)], self.device)[0] > 0

    def restore(
        self,
        engine,
        point: ResumePoint,
        *,
        schedule: Any,
        seed: int,
        override_lr: bool = False,
        steps_from: str = "",
    ) -> tuple[int, int]:
        """Load ``point`` into ``engine`` and return (step, consumed samples). Collective.

        Everything that reaches into DeepSpeed on resume is here: a world-size change loads a
        universal checkpoint (converted once by rank 0; the engine was built with
        ``checkpoint.load_universal``, switched off again afterwards so later saves are ordinary),
        the LR schedule continues as saved, or with ``override_lr`` becomes this launch's
        ``schedule`` (:mod:`pretrain.checkpoints.schedule_override`: a warning says what the flags
        changed or which were ignored), the engine's step and sample counters are set, and on a
        world-size change each rank's RNG is derived from the seed and step since per-rank states
        cannot carry over. ``steps_from``: where this launch's --max_steps came from, named by the
        schedule warning when it differs from the checkpoint's schedule length.
        """
        world_changed = point.world_size_changed(self.world_size)
        path = self.to_universal(point.path) if world_changed else point.path
        scheduler = engine.lr_scheduler if hasattr(engine.lr_scheduler, "lr_lambdas") else None
        flags_schedule = copy.deepcopy(schedule)  # the load below restores the checkpoint's
        flags_peak = scheduler.base_lrs[0] if scheduler is not None else None  # not loaded yet
        self.load(engine, path)
        self._load_ema(point.path)
        engine._config.load_universal_checkpoint = False
        if scheduler is not None and flags_schedule is not None:
            self.schedule_override = resume_schedule(
                scheduler,
                point.state,
                flags_schedule,
                flags_peak,
                override=override_lr,
                where=f"the checkpoint {point.path}",
                steps_from=steps_from,
            )
        step, consumed = int(point.state["step"]), int(point.state["consumed_samples"])
        engine.global_steps, engine.global_samples = step, consumed
        self.last_saved_step = step
        if world_changed:
            torch.manual_seed(seed + 1000003 * step + self.rank)
        log.info(
            f"resumed from {point.path} at step {step} ({consumed} samples consumed; saved on "
            f"{point.state['world_size']} ranks, now {self.world_size})"
        )
        return step, consumed

    def load(self, engine, path: Path) -> dict[str, Any]:
        """Load engine state from ``path`` (same world size) and this rank's RNG; returns the state.

        For another world size, call :meth:`to_universal` first and load with the returned
        folder and ``universal=True``.
        """
        state = read_state(path)
        loaded, _client = engine.load_checkpoint(
            str(path.parent),
            tag=path.name,
            load_optimizer_states=True,
            load_lr_scheduler_states=True,
        )
        if loaded is None:
            raise CheckpointError(f"DeepSpeed could not load the checkpoint {path}")
        if self.schedule_override is not None:  # a rollback keeps the launch's override
            self.schedule_override.apply(engine.lr_scheduler, state)
        rng_file = path / "rng" / f"rank_{self.rank:05d}.pt"
        if state["world_size"] == self.world_size:
            if rng_file.is_file():
                set_rng_state(torch.load(rng_file, weights_only=False))
            else:  # no silent fallback: the run goes on, but not bit-for-bit
                log.warning(
                    f"{rng_file} is missing; rank {self.rank} keeps its fresh RNG state, so this "
                    "resume is not exact (dropout and masking differ from an uninterrupted run)",
                    extra={"all_ranks": True},
                )
        return state

    def load_any(self, engine, path: Path, *, seed: int) -> dict[str, Any]:
        """:meth:`load` of ``path`` whatever world size wrote it (the guard's rollback); returns
        its state. Collective. Another world size loads its universal conversion, made once by
        rank 0 as ``--resume`` does, with DeepSpeed's universal load switched on for this one
        load; each rank's RNG is then derived from ``seed`` and the step, as on such a resume
        (per-rank RNG states cannot carry over to another number of ranks)."""
        state = read_state(path)
        self._load_ema(path)  # the original folder: a universal conversion holds no EMA
        if int(state["world_size"]) == self.world_size:
            return self.load(engine, path)
        universal = self.to_universal(path)
        engine._config.load_universal_checkpoint = True
        try:
            self.load(engine, universal)
        finally:
            engine._config.load_universal_checkpoint = False
        torch.manual_seed(seed + 1000003 * int(state["step"]) + self.rank)
        log.info(
            f"loaded {path}, written on {state['world_size']} ranks, through its universal "
            f"conversion {universal} (now {self.world_size} ranks)"
        )
        return state

    def _load_ema(self, path: Path) -> None:
        """--ema's average as saved with checkpoint ``path`` (rank 0)."""
        if self.ema is not None:
            self.ema.load(path)

    def to_universal(self, path: Path) -> Path:
        """Convert ``path`` to a universal checkpoint (rank 0 converts, everyone waits).

        Returns the converted folder (``checkpoints/universal/<tag>``), made once and reused.
        """
        out = self.root / "universal" / path.name
        if self.rank == 0 and verify(out):  # missing, partial or damaged: convert (again)
            with publish_dir(out, replace=True) as tmp:
                self._convert_to_universal(path, tmp, out.name)
            # DeepSpeed's converter named the temporary folder in latest_universal: fix it.
            write_text_atomic(out.parent / "latest_universal", out.name)
        self._barrier()
        return out

    @staticmethod
    def _convert_to_universal(path: Path, tmp: Path, tag: str) -> None:
        """DeepSpeed's ds_to_universal of ``path`` into ``tmp``, with our state and marker."""
        cmd = [
            sys.executable,
            "-m",
            "deepspeed.checkpoint.ds_to_universal",
            "--input_folder",
            str(path),
            "--output_folder",
            str(tmp),
            "--inject_missing_state",
            "--num_extract_workers",
            "2",
            "--num_merge_workers",
            "1",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise CheckpointError(
                f"converting {path} to a universal checkpoint failed:\n"
                f"{' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            )
        shutil.copy(path / STATE_FILE, tmp / STATE_FILE)
        write_marker(tmp, folder_sizes(tmp), tag)  # one process wrote it all: list the folder
