"""Checkpoints that are complete or invisible: DeepSpeed engine state plus our own client state.

Layout of ``RUN/checkpoints/``::

    step_00000010/                 DeepSpeed tag folder (model/optimizer shards, all ranks write)
        trainer_state.json         step, consumed samples, world size, config, tokenizer fingerprint
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
"""

from __future__ import annotations

import copy
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from data_prep.layout import write_text_atomic
from pretrain.config import CheckpointConfig
from pretrain.distributed import sum_across_ranks

MARKER = "COMPLETE"
LATEST_FILE = "latest"  # DeepSpeed's name (engine.load_checkpoint, zero_to_fp32 read it)
STATE_FILE = "trainer_state.json"
_TAG_RE = re.compile(r"^step_(\d{8})$")


# Model settings a resumed run may change: they do not alter the weights' shapes or meaning.
_FREE_MODEL_FIELDS = {
    "name",
    "loss_impl",
    "config_json",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
}


class CheckpointError(ValueError):
    """A checkpoint that does not exist, is incomplete, or does not fit this run."""


def tag_for(step: int) -> str:
    """Folder name of the checkpoint after ``step`` optimizer steps."""
    return f"step_{step:08d}"


def rng_state() -> dict[str, Any]:
    """This process's RNG states (torch CPU and accelerator, numpy, python)."""
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
    from deepspeed.accelerator import get_accelerator

    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "accelerator" in state:
        get_accelerator().set_rng_state(state["accelerator"])


def is_complete(path: str | os.PathLike) -> bool:
    """True when ``path`` is a checkpoint folder whose completion marker exists."""
    return Path(path, MARKER).is_file()


def list_complete(ckpt_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """(step, folder) of every complete checkpoint under ``ckpt_dir``, oldest first."""
    root = Path(ckpt_dir)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _TAG_RE.match(p.name)
        if m and is_complete(p):
            found.append((int(m.group(1)), p))
    return sorted(found)


def find_latest(ckpt_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint under ``ckpt_dir``, or None."""
    found = list_complete(ckpt_dir)
    return found[-1][1] if found else None


def write_latest(ckpt_dir: str | os.PathLike) -> Path | None:
    """Point DeepSpeed's ``latest`` file at the newest complete checkpoint (atomic); returns it.

    Only a complete checkpoint is ever named: with none, the file is left as it is.
    """
    newest = find_latest(ckpt_dir)
    if newest is not None:
        write_text_atomic(Path(ckpt_dir) / LATEST_FILE, newest.name)  # no newline, as DeepSpeed
    return newest


def resolve_resume(resume: str, output_dir: str | os.PathLike) -> Path | None:
    """Turn ``--resume`` (auto | none | path) into a complete checkpoint folder or None.

    A path may be a checkpoint folder, a ``checkpoints/`` folder or a run folder (newest inside).
    """
    if resume == "none":
        return None
    if resume == "auto":
        return find_latest(Path(output_dir) / "checkpoints")
    p = Path(resume)
    if is_complete(p):
        return p
    for root in (p, p / "checkpoints"):
        latest = find_latest(root)
        if latest is not None:
            return latest
    if _TAG_RE.match(p.name):
        raise CheckpointError(
            f"--resume {p}: the checkpoint is incomplete (no {MARKER} marker; "
            "the run stopped while saving). Resume from an earlier one or use "
            "--resume auto."
        )
    raise CheckpointError(f"--resume {p}: no complete checkpoint there")


def read_state(path: Path) -> dict[str, Any]:
    """The trainer state saved with a checkpoint."""
    with open(path / STATE_FILE, encoding="utf-8") as f:
        return json.load(f)


def check_compatible(
    state: dict[str, Any],
    *,
    vocab_size: int,
    tokenizer_fingerprint: str,
    model_config: dict[str, Any],
    path: Path,
) -> None:
    """Raise CheckpointError when the checkpoint was trained with another model, vocabulary or
    tokenizer."""
    problems = []
    if state.get("tokenizer_fingerprint") != tokenizer_fingerprint:
        problems.append(
            f"tokenizer fingerprint {state.get('tokenizer_fingerprint')} (checkpoint) "
            f"!= {tokenizer_fingerprint} (--data)"
        )
    if state.get("vocab_size") != vocab_size:
        problems.append(
            f"vocab size {state.get('vocab_size')} (checkpoint) != {vocab_size} (--data)"
        )
    saved = state.get("config", {}).get("model_cfg", {})
    for k, v in model_config.items():
        if k in saved and saved[k] != v and k not in _FREE_MODEL_FIELDS:
            problems.append(f"model.{k} = {saved[k]!r} (checkpoint) != {v!r} (this run)")
    if problems:
        raise CheckpointError(
            f"checkpoint {path} does not fit this run:\n  "
            + "\n  ".join(problems)
            + "\nUse the same --data/--model as the run that wrote it, or start "
            "a new --output_dir."
        )


@dataclass(frozen=True)
class ResumePoint:
    """A complete checkpoint this run continues from, and the trainer state saved with it."""

    path: Path
    state: dict[str, Any]

    def world_size_changed(self, world_size: int) -> bool:
        """True when the checkpoint was written by another number of ranks (universal load)."""
        return int(self.state["world_size"]) != world_size


def find_resume(
    resume: str,
    output_dir: str | os.PathLike,
    *,
    vocab_size: int,
    tokenizer_fingerprint: str,
    model_config: dict[str, Any],
) -> ResumePoint | None:
    """The checkpoint ``--resume`` names, checked against this run's data and model, or None."""
    path = resolve_resume(resume, output_dir)
    if path is None:
        return None
    state = read_state(path)
    check_compatible(
        state,
        vocab_size=vocab_size,
        tokenizer_fingerprint=tokenizer_fingerprint,
        model_config=model_config,
        path=path,
    )
    return ResumePoint(path, state)


class PreemptionHandler:
    """SIGTERM/SIGINT set a flag; the loop saves at the next step boundary and exits.

    The trainer agrees on the flag across ranks with an all-reduce each step, because a signal
    may reach only one rank and every rank must call ``save_checkpoint`` together.
    """

    def __init__(self) -> None:
        self.signal: int | None = None
        self._previous = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, _frame) -> None:
        if self.signal is not None and signum == signal.SIGINT:  # second Ctrl-C: stop now
            signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))
            raise KeyboardInterrupt
        self.signal = signum

    def restore(self) -> None:
        """Put back the previous handlers."""
        for sig, h in self._previous.items():
            signal.signal(sig, h)


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
        self.root = Path(output_dir) / "checkpoints"
        self.cfg = cfg
        self.keep_last = cfg.keep_last
        self.rank = rank
        self.world_size = world_size
        self.device = device or torch.device("cpu")  # where the cross-rank flags are reduced
        self.last_save_time = time.monotonic()
        self.last_saved_step: int | None = None

    def _barrier(self) -> None:
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()

    def save(self, engine, step: int, state: dict[str, Any]) -> Path:
        """Save engine + client state as ``step_<step>``; all ranks must call this together."""
        tag = tag_for(step)
        path = self.root / tag
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            if path.exists():  # a partial save of the same step from a crashed run
                shutil.rmtree(path)
        self._barrier()
        full_state = {
            **state,
            "step": step,
            "world_size": self.world_size,
            "tag": tag,
            "saved_at": time.time(),
        }
        # universal_checkpoint_info lets ds_to_universal convert ZeRO-1/2 checkpoints later.
        engine.save_checkpoint(
            str(self.root),
            tag=tag,
            save_latest=False,
            client_state={"trainer_state": full_state, "universal_checkpoint_info": {}},
        )
        (path / "rng").mkdir(parents=True, exist_ok=True)
        rng_file = path / "rng" / f"rank_{self.rank:05d}.pt"
        torch.save(rng_state(), rng_file.with_suffix(".tmp"))
        os.replace(rng_file.with_suffix(".tmp"), rng_file)
        if self.rank == 0:
            write_text_atomic(path / STATE_FILE, json.dumps(full_state, indent=2, default=str))
        self._barrier()  # every rank's shards and RNG file are on disk
        if self.rank == 0:
            write_text_atomic(path / MARKER, f"{tag}\n")
            write_latest(self.root)
            self._prune()
        self._barrier()
        self.last_save_time = time.monotonic()
        self.last_saved_step = step
        return path

    def _prune(self) -> None:
        """Keep the newest ``keep_last`` complete checkpoints; drop older ones and stale
        partials."""
        complete = list_complete(self.root)
        keep = {p.name for _, p in complete[-self.keep_last :]}
        newest = complete[-1][0] if complete else -1
        for p in self.root.iterdir() if self.root.is_dir() else []:
            m = _TAG_RE.match(p.name)
            if not m or p.name in keep:
                continue
            if is_complete(p) or int(m.group(1)) < newest:
                shutil.rmtree(p, ignore_errors=True)
        uni = self.root / "universal"
        if uni.is_dir():
            for p in uni.iterdir():
                if p.name not in keep:
                    shutil.rmtree(p, ignore_errors=True)

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
        signal_any, time_rank0, spent_rank0 = sum_across_ranks(
            [float(preempt.signal is not None), float(time_due), float(spent)], self.device
        )
        if signal_any > 0:
            return "signal"
        if spent_rank0 > 0:
            return "budget"
        return self.due(step, self.cfg.save_interval, 0.0) or ("time" if time_rank0 > 0 else None)

    def restore(self, engine, point: ResumePoint, *, schedule: Any, seed: int) -> tuple[int, int]:
        """Load ``point`` into ``engine`` and return (step, consumed samples). Collective.

        Everything that reaches into DeepSpeed on resume is here: a world-size change loads a
        universal checkpoint (converted once by rank 0; the engine was built with
        ``checkpoint.load_universal``, switched off again afterwards so later saves are ordinary),
        the LR schedule continues as saved (a warning names it when this launch's flags differ),
        the engine's step and sample counters are set, and on a world-size change each rank's RNG
        is derived from the seed and step since per-rank states cannot carry over.
        """
        world_changed = point.world_size_changed(self.world_size)
        path = self.to_universal(point.path) if world_changed else point.path
        flags_schedule = copy.deepcopy(schedule)  # the load below overwrites the engine's copy
        self.load(engine, path)
        engine._config.load_universal_checkpoint = False
        # LambdaLR.load_state_dict writes the saved schedule's fields into the callable: the run
        # continues the checkpoint's schedule. Say so when this launch's flags ask for another.
        saved = getattr(engine.lr_scheduler, "lr_lambdas", [None])[0]
        if (
            flags_schedule is not None
            and saved is not None
            and saved != flags_schedule
            and self.rank == 0
        ):
            print(
                f"[pretrain] WARNING: the learning-rate schedule continues as saved in the "
                f"checkpoint ({saved}); this launch's flags give {flags_schedule}, which is not "
                "applied. Start a new run (--init_from) for another schedule.",
                flush=True,
            )
        step, consumed = int(point.state["step"]), int(point.state["consumed_samples"])
        engine.global_steps, engine.global_samples = step, consumed
        self.last_saved_step = step
        if world_changed:
            torch.manual_seed(seed + 1000003 * step + self.rank)
        if self.rank == 0:
            print(
                f"[pretrain] resumed from {point.path} at step {step} ({consumed} samples "
                f"consumed; saved on {point.state['world_size']} ranks, now {self.world_size})",
                flush=True,
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
        rng_file = path / "rng" / f"rank_{self.rank:05d}.pt"
        if state["world_size"] == self.world_size:
            if rng_file.is_file():
                set_rng_state(torch.load(rng_file, weights_only=False))
            else:  # no silent fallback: the run goes on, but not bit-for-bit
                print(
                    f"[pretrain] WARNING: {rng_file} is missing; rank {self.rank} keeps its fresh "
                    "RNG state, so this resume is not exact (dropout and masking differ from an "
                    "uninterrupted run)",
                    flush=True,
                )
        return state

    def to_universal(self, path: Path) -> Path:
        """Convert ``path`` to a universal checkpoint (rank 0 converts, everyone waits).

        Returns the converted folder (``checkpoints/universal/<tag>``), made once and reused.
        """
        out = self.root / "universal" / path.name
        if self.rank == 0 and not is_complete(out):
            tmp = out.with_name(out.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(out, ignore_errors=True)
            tmp.parent.mkdir(parents=True, exist_ok=True)
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
            write_text_atomic(tmp / MARKER, f"universal {path.name}\n")
            os.replace(tmp, out)
            # DeepSpeed's converter named the temporary folder in latest_universal: fix it.
            write_text_atomic(out.parent / "latest_universal", out.name)
        self._barrier()
        return out
