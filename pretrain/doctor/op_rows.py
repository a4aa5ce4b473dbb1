"""The doctor's op-build rows and ``--build_ops``: DeepSpeed's JIT ops on this machine.

A stale build lock (``pretrain.distributed.op_builds``) is a WARN with the command that clears it
(a launch removes it itself and builds again, as the row says); an op not built yet is a WARN
(the first launch would build it, tens of seconds on every node);
``bertforge doctor --build_ops`` builds them now (``make install`` runs it).
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

from bertforge.pretrain.config.optimizer import OptimizerConfigError, configure_optimizer
from bertforge.pretrain.distributed import op_builds
from bertforge.pretrain.doctor.checks import LOCAL, OK, WARN, Row


def _accelerator():
    """DeepSpeed's accelerator; DeepSpeed's logger is made on import, bound to stderr here, so
    its start-up lines never mix into the table or the ``--json`` output on stdout."""
    with contextlib.redirect_stdout(sys.stderr):
        # Lazy: deepspeed takes seconds to import; the commands that import this module without
        # running a job (--help, the doctor) do without it.
        from deepspeed.accelerator import get_accelerator

        return get_accelerator()


def _op_names(op_classes: list[str]) -> list[str]:
    """The ops (builder NAMEs) this accelerator has and DeepSpeed would use, of ``op_classes``."""
    accelerator = _accelerator()
    # Lazy: deepspeed (seconds to import) only when a job runs; see the first import here.
    import deepspeed.ops

    names = []
    for cls in op_classes:
        builder = accelerator.create_op_builder(cls)
        if builder is not None and deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
            names.append(builder.NAME)
    return names


def lock_rows(root: Path) -> list[Row]:
    """Torch build locks under ``root``, each a WARN: stale (looked at twice; a launch removes
    it), or a build in progress (a launch waits for it)."""
    locks = op_builds.find_locks(root)
    if any(lock.stale for lock in locks):  # a builder releasing right now is not stale
        time.sleep(op_builds.STALE_CONFIRM_S)
        again = {(lock.path, lock.inode): lock for lock in op_builds.find_locks(root)}
        locks = [again.get((lock.path, lock.inode)) or lock for lock in locks if lock.path.exists()]
    stale = [lock for lock in locks if lock.stale]
    rows = []
    if stale:
        rows.append(
            Row(
                "op build lock",
                LOCAL,
                WARN,
                "; ".join(lock.describe() for lock in stale),
                "a launch removes it and builds the op again, saying so; or remove it now: "
                + op_builds.clear_command(stale),
            )
        )
    for lock in (lock for lock in locks if not lock.stale):
        rows.append(
            Row(
                "op build lock",
                LOCAL,
                WARN,
                lock.describe(),
                "a launch now waits for this build; if no machine builds, remove it with: "
                + op_builds.clear_command([lock]),
            )
        )
    return rows


def run_config(ds_config: dict, optim) -> dict:
    """``ds_config`` as the trainer hands it to DeepSpeed (its optimizer block decides the op:
    on the CPU AdamW is torch's unless the file says ``torch_adam: false``)."""
    try:
        return configure_optimizer(ds_config, optim, _accelerator().device_name())
    except OptimizerConfigError:  # the launch refuses it with its own message; size as written
        return ds_config


def op_build_rows(ds_config: dict, ds_config_path: str) -> list[Row]:
    """This machine's build folder: its locks, and whether each op ``ds_config`` (as the trainer
    resolves it: :func:`run_config`) needs is built."""
    root = op_builds.use_environment_folder()
    rows = lock_rows(root)
    names = _op_names(op_builds.needed_ops(ds_config))
    built = [n for n in names if any((root / n).glob(f"{n}*.so"))]
    missing = [n for n in names if n not in built]
    if missing:
        rows.append(
            Row(
                "op builds",
                LOCAL,
                WARN,
                f"not built yet in {root}: {', '.join(missing)} (the first launch builds them, "
                "tens of seconds on every node)",
                "build them now: bertforge doctor --build_ops --ds_config " + ds_config_path,
            )
        )
    else:
        what = ", ".join(built) if built else "none needed"
        rows.append(Row("op builds", LOCAL, OK, f"{what} (in {root})"))
    return rows


def build_ops(ds_config: dict) -> list[str]:
    """Build (or load) every op ``ds_config`` needs on this machine now; the ops' names."""
    return op_builds.prepare(op_builds.needed_ops(ds_config))
