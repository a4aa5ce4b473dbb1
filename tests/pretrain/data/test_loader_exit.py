"""A program that uses the loader's Python API (docs/model.md) exits normally, whatever iterators
it still holds at exit: the workers ignore SIGTERM (so a preemption signal reaches the rank,
not them), and Python's multiprocessing exit handler would otherwise terminate them with SIGTERM
and wait for them forever."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

SCRIPT = """
import os, signal, sys
from bertforge.data_prep.reader import ShardReader
from bertforge.pretrain.data.loader import DataConfig, build_loader
from bertforge.pretrain.data.masking import MaskingConfig

reader = ShardReader(sys.argv[1], split="train")
loader = build_loader(reader, DataConfig(num_workers=2), MaskingConfig(), micro_batch_size=4)
it = iter(loader)  # kept alive to the end, as a script that takes a few batches does
batch = next(it)
also = iter(build_loader(reader, DataConfig(num_workers=1), MaskingConfig(), micro_batch_size=2))
next(also)
pids = [w.pid for w in it._workers + also._workers]
os.kill(pids[0], signal.SIGTERM)  # what a scheduler's SIGTERM does to a worker: nothing
next(it)
print(" ".join(map(str, pids)), flush=True)
if sys.argv[2] == "raise":
    raise SystemExit("ending by an exception")
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purposes (its parent has exited; init reaps it).
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("ending", ["return", "raise"])
def test_a_script_holding_loader_iterators_exits(english_shards, tmp_path, ending):
    script = tmp_path / "use_loader.py"
    script.write_text(textwrap.dedent(SCRIPT))
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(script), str(english_shards), ending],
        capture_output=True,
        text=True,
        timeout=150,  # the bug: it never returned
    )
    took = time.monotonic() - start
    assert proc.returncode == (1 if ending == "raise" else 0), proc.stderr[-3000:]
    pids = [int(p) for p in proc.stdout.split()]
    assert len(pids) == 3
    deadline = time.monotonic() + 10
    while any(map(_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in pids if _alive(p)], "a worker outlived its program"
    assert took < 120, f"the script took {took:.0f} s to exit"
