"""The trainer launched as a user launches it: `python pretrain/main.py` on one process, the
DeepSpeed launcher on several; a CPU config with blocks replaced; the losses a run logged."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from bertforge.pretrain.components.metrics import read_metrics
from bertforge.pretrain.config import command_line
from helpers.commands import REPO

COMMON = [
    "--model",
    "tiny",
    "--num_workers",
    "0",
    "--progress",
    "false",
    "--global_batch_size",
    "16",
    "--micro_batch_size",
    "4",
    "--lr",
    "1e-3",
    "--warmup_steps",
    "1",
]


def _port() -> int:
    """A port free now: parallel test workers (pytest -n) never share one."""
    from bertforge.pretrain.distributed.startup import free_port

    return free_port()


def launch_cmd(script: str | Path, nproc: int) -> list[str]:
    """`python SCRIPT` for one process (no launcher), else the DeepSpeed launcher on `nproc`
    local ranks with a port of this test session's own."""
    if nproc == 1:
        return command_line.trainer(script=script)
    return command_line.trainer(ranks=nproc, master_port=_port(), script=script)


def launch(
    args: list[str],
    nproc: int = 2,
    script: str | Path = "pretrain/main.py",
    env: dict | None = None,
    check: bool = True,
    timeout: int = 240,
) -> subprocess.CompletedProcess:
    """Run the trainer as a user would; returns the completed process (text output). The
    repository leads PYTHONPATH, so a script outside the packages (tests/helpers/fp16_main.py)
    imports the checkout under test, never another install of bertforge."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, **(env or {})}
    proc = subprocess.run(
        launch_cmd(script, nproc) + args,
        cwd=REPO,
        env=full_env,
        text=True,
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"training failed ({proc.returncode}):\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
        )
    return proc


def ds_config(tmp: Path, name: str, **changes) -> Path:
    """A copy of ds_configs/cpu.json with top-level blocks replaced."""
    cfg = json.loads((REPO / "ds_configs" / "cpu.json").read_text())
    cfg.update(changes)
    path = tmp / name
    path.write_text(json.dumps(cfg))
    return path


def losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run / "metrics.jsonl")}


def assert_loss_falls(run: Path) -> None:
    steps = read_metrics(run / "metrics.jsonl")
    first = sum(r["loss"] for r in steps[:2]) / 2
    last = sum(r["loss"] for r in steps[-2:]) / 2
    assert last < first - 0.15, f"loss did not fall: {[round(r['loss'], 3) for r in steps]}"


def guard_actions(run: Path) -> list[dict]:
    """The guard's events that acted (skip, rollback, give_up). A grad-norm spike it merely
    records ("ok") may follow a planned fault on some thread counts: its z sits near the
    threshold at the tiny sizes the tests train."""
    return [e for e in read_metrics(run / "metrics.jsonl", "guard") if e["action"] != "ok"]


def copy_without_last_checkpoint(run: Path, copy: Path, last_step: int) -> Path:
    """A copy of ``run`` whose checkpoint of ``last_step`` (and its metrics) are gone, so that
    ``--resume auto`` there continues from the checkpoint before it."""
    from bertforge.pretrain.run_folder.run_checkpoints import tag_for

    shutil.copytree(run, copy)
    shutil.rmtree(copy / "checkpoints" / tag_for(last_step))
    (copy / "checkpoints" / "latest").unlink(missing_ok=True)
    (copy / "metrics.jsonl").unlink()
    return copy
