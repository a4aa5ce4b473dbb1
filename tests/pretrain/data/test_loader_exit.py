"""A program that uses the loader's Python API (docs/model.md) exits normally, whatever iterators
it still holds at exit: the workers ignore SIGTERM (so a preemption signal reaches the rank,
not them), and Python's multiprocessing exit handler would otherwise terminate them with SIGTERM
and wait for them forever."""

from __future__ import annotations

import json
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


STARTUP_SCRIPT = """
import json, os, signal, sys
from bertforge.data_prep.reader import ShardReader
from bertforge.pretrain.data.loader import DataConfig, build_loader
from bertforge.pretrain.data.masking import MaskingConfig

def blocked():
    return signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, [])

def recording(worker_id, real=None, out=sys.argv[2]):
    at_start = blocked()  # before ignore_job_signals: a job's SIGTERM now would kill the worker
    real(worker_id)
    after = {"ignored": signal.getsignal(signal.SIGTERM) == signal.SIG_IGN, "blocked": blocked()}
    with open(f"{out}.{worker_id}", "w") as f:
        json.dump({"blocked_at_start": at_start, **after}, f)

reader = ShardReader(sys.argv[1], split="validation")
loader = build_loader(reader, DataConfig(num_workers=2), MaskingConfig(), micro_batch_size=2,
                      train=False)
real = loader.worker_init_fn
loader.worker_init_fn = lambda i: recording(i, real)
batches = sum(1 for _ in loader)
print(json.dumps({"batches": batches, "rank_blocked_after": blocked()}))
"""


def test_workers_start_with_the_job_signals_blocked_until_they_ignore_them(
    english_shards, tmp_path
):
    """A signal sent to the whole job while a validation pass starts its workers killed a worker
    before its worker_init_fn ran (seen under load: the rank then failed with 'DataLoader worker
    is killed by signal: Terminated'). Workers now start with the signals blocked; the rank's
    own mask is back as it was once they are up."""
    script, out = tmp_path / "start_workers.py", tmp_path / "worker"
    script.write_text(textwrap.dedent(STARTUP_SCRIPT))
    proc = subprocess.run(
        [sys.executable, str(script), str(english_shards), str(out)],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rank = json.loads(proc.stdout.strip().splitlines()[-1])
    assert rank["batches"] > 0 and rank["rank_blocked_after"] is False
    for worker in (0, 1):
        seen = json.loads((tmp_path / f"worker.{worker}").read_text())
        assert seen == {"blocked_at_start": True, "ignored": True, "blocked": False}, seen
