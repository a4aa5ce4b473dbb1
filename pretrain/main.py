#!/usr/bin/env python
"""Pretrain a BERT-style masked LM on DeepSpeed (ZeRO-2/3, fp16/bf16/fp32, exact resume).

    deepspeed pretrain/main.py --recipe recipes/bert-base-zero2-fp16.yaml --data SHARDS \
        --output_dir RUN [--max_steps N --resume auto ...: any recipe field's flag]

Also runs under ``torchrun``, and as one process: ``bertforge train``. Parse -> resolve -> build
-> run: the recipe and flags into a TrainConfig (:mod:`pretrain.config.cli`); the inputs checked
and the config resolved before any rendezvous, then data, model, engine and resume point
(:mod:`pretrain.build`); then the loop (:class:`pretrain.trainer.Trainer`).
"""

from __future__ import annotations

import os
import sys

from bertforge.data_prep import shard_cache
from bertforge.errors import USER_ERROR_EXIT, UserError
from bertforge.logs import get_logger, quiet_libraries
from bertforge.preemption import EXIT_INTERRUPTED, PreemptionHandler, install, uninstall
from bertforge.pretrain import build, dry_run
from bertforge.pretrain.components.run_outputs import take_run_lock
from bertforge.pretrain.config.cli import parse_args
from bertforge.pretrain.config.train_config import TrainConfig
from bertforge.pretrain.distributed import watchdog
from bertforge.pretrain.distributed.startup import shutdown
from bertforge.pretrain.run_folder.layout import RunFolder
from bertforge.pretrain.run_folder.run_checkpoints import find_latest
from bertforge.pretrain.schedule.budget import launch_clock

log = get_logger("bertforge.pretrain.main")


def train(cfg: TrainConfig, preempt: PreemptionHandler | None = None) -> int:
    """Resolve, build, run the loop; returns the exit status. Refused at once (LockError) while
    another job holds --output_dir. (DeepSpeed is imported only here, inside pretrain.build's
    functions: --help and --dry-run need no engine.) ``preempt``: the stop-signal flag main
    installed, carried into the trainer."""
    launched = launch_clock()  # a time budget counts start-up too
    lock = take_run_lock(cfg)
    try:
        run = build.resolve_run(cfg)  # every user error fails here, before any rendezvous
        training = build.build_training(run.cfg, run, launched, preempt)
        try:
            return training.trainer.run(training.start_step, training.consumed)
        finally:
            training.trainer.outputs.metrics.close()
    finally:
        shard_cache.close()  # object storage: stop fetching, write its stats
        if lock is not None:
            lock.release()


def interrupted_message(cfg: TrainConfig) -> str:
    """The one line of a second Ctrl-C: stopped at once, and what a resume will take."""
    latest = find_latest(RunFolder(cfg.run.output_dir).checkpoints, quiet=True)
    kept = (
        f"the newest complete checkpoint is {latest}"
        if latest is not None
        else "there is no complete checkpoint yet"
    )
    return f"interrupted twice: stopped at once without saving; {kept} (resume with --resume auto)"


def main(
    argv: list[str] | None = None, *, keep_handler: bool = False, prog: str = "pretrain/main.py"
) -> int:
    """Entry point for ``pretrain/main.py`` under the launchers and for ``bertforge train``.
    ``keep_handler``: leave the stop-signal handler installed on return (the script: it exits
    right after, so a signal in between still does nothing); a caller in the same process gets
    its handlers back. ``prog``: the command's name in usage lines and errors."""
    quiet_libraries()
    cfg = parse_args(argv, prog)
    if cfg.run.dry_run:
        try:
            return dry_run.main(cfg)
        except UserError as e:
            log.error(str(e))
            return USER_ERROR_EXIT
        finally:
            shard_cache.close()  # the script skips atexit: release the cache's lock here
    # The stop signals set a flag from here on, through the rendezvous, the engine build and the
    # checkpoint load, to the process's exit: none ends the run by its default action
    # (bertforge.preemption says what each moment does with it).
    preempt = install(cfg.checkpoint.preemption_signals)
    try:
        status = train(cfg, preempt)
        shutdown()
        return status
    except UserError as e:  # a bad flag, file or checkpoint: the message says what to fix
        log.error(str(e))
        watchdog.stop(done=False)  # no done mark: a peer still waiting for this rank exits 3
        return USER_ERROR_EXIT
    except KeyboardInterrupt:  # a second Ctrl-C: one line, not a traceback
        log.error(interrupted_message(cfg))
        return EXIT_INTERRUPTED
    except Exception as e:
        watchdog.await_verdict(e)  # a collective saw a peer die first: the watchdog names it
        raise
    finally:
        if not keep_handler:
            uninstall()


if __name__ == "__main__":
    code = main(keep_handler=True)
    # All is written and closed: skip the native teardown (~7 s per run with a gloo group, CPU).
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(code)
