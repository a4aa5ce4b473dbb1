"""Run the project's commands as a user would: `python -m ...` and the one-process trainer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bertforge.pretrain.config import command_line

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"


def run_cli(
    *args: str, check: bool = True, env: dict | None = None, timeout: int = 600, cwd: Path = REPO
) -> subprocess.CompletedProcess:
    """Run `python -m ...` the way a user would; returns the completed process (text output).
    The repository leads PYTHONPATH (as in :func:`helpers.launch.launch`): a checkout's tests run
    that checkout's code, not whichever checkout the editable install points at."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    full_env = {**os.environ, "PYTHONPATH": path, **(env or {})}
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def train_cli(run: Path, *args: str, check: bool = True, env: dict | None = None):
    """`python pretrain/main.py` as one process on the CPU config, quiet and small: the flags
    every one-process trainer test shares. ``args`` add the data, model, batch and the feature."""
    cmd = command_line.trainer(
        ds_config=REPO / "ds_configs" / "cpu.json",
        output_dir=run,
        eval_batches=2,
        num_workers=0,
        progress=False,
    )
    return run_cli(*cmd[1:], *args, check=check, env=env)
