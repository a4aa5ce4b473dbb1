"""The job's stop signals: a flag the loop acts on at a moment every rank agrees on.

A scheduler signals a job at a moment nobody chose: SLURM sends SIGTERM on ``scancel`` and on
preemption (to every process of the job step), SIGUSR1 some time before the time limit when the
job asks for it (``--signal=USR1@120``), a terminal's Ctrl-C sends SIGINT. A
:class:`PreemptionHandler` turns each of the signals chosen by ``--preemption_signals`` into a
flag. :func:`pretrain.main.main` installs it before anything else happens (before the rendezvous
and the engine build) and keeps it until the process exits, so no moment of a run ends by the
signal's default action. What the trainer does with the flag, by moment (docs/reliability.md):

* start-up (rendezvous, engine, checkpoint load): the run stops right after start-up, before its
  first step, with exit 0 and no save. Nothing is lost: the launch starts from a complete
  checkpoint (or from step 0), which is exactly what the next ``--resume auto`` takes. Taking a
  step and saving it instead would spend the grace period before the scheduler's SIGKILL on a
  full checkpoint that holds one step more than the one already on disk.
* a step: the save at that step boundary (reason "signal"), then exit 0.
* a save: the save completes; the run then stops without another step (a failed periodic save
  is retried at once as the signal save).
* a validation pass: the pass completes (it is bounded by ``--eval_batches``), then the signal
  save at that step boundary, exit 0; during the final validation, the final save, exit 0.
* the final save, or after training: exit 0 with the final checkpoint.

A second SIGINT (Ctrl-C twice) raises ``KeyboardInterrupt`` at once: main reports it in one line
naming the newest complete checkpoint and exits 130; a save cut short has no ``COMPLETE``
marker, so ``--resume auto`` skips it and the previous checkpoint is intact.

The flag may reach one rank only: the trainer agrees on it with an all-reduce
(:meth:`pretrain.checkpoints.checkpoint.CheckpointManager.save_due`), because every rank must
call ``save_checkpoint`` together. DataLoader workers ignore the same signals
(:func:`job_signals`, :func:`pretrain.data.loader.ignore_job_signals`).
"""

from __future__ import annotations

import signal

DEFAULT_SIGNALS = "TERM,INT"
FLAG = "--preemption_signals"
# Signals a scheduler or a user sends to ask for a stop; others (KILL, STOP, SEGV...) cannot be
# caught or mean something else.
ALLOWED = ("TERM", "INT", "USR1", "USR2", "HUP", "XCPU")
EXIT_INTERRUPTED = 130  # a second Ctrl-C: stopped at once (128 + SIGINT, as shells report it)

_installed: PreemptionHandler | None = None  # the handler of this process, once main made it


def parse_signals(value: str) -> tuple[signal.Signals, ...]:
    """The signals of a ``--preemption_signals`` value ("TERM,INT,USR1"; case and a ``SIG``
    prefix do not matter); a ValueError naming the flag for anything else."""
    names = [n.strip().upper().removeprefix("SIG") for n in value.split(",") if n.strip()]
    bad = [n for n in names if n not in ALLOWED]
    if not names or bad:
        what = f"unknown signal {', '.join(bad)}" if bad else "no signal given"
        raise ValueError(
            f"{FLAG} {value!r}: {what}; give a comma-separated list of {', '.join(ALLOWED)} "
            f"(default {DEFAULT_SIGNALS}; e.g. {FLAG} TERM,INT,USR1 with SLURM's "
            "--signal=USR1@120)"
        )
    return tuple(dict.fromkeys(getattr(signal, f"SIG{n}") for n in names))


class PreemptionHandler:
    """The chosen signals set a flag (``signal``: the first one's number); a second SIGINT raises
    ``KeyboardInterrupt``. Install from the main thread."""

    def __init__(self, signals: tuple[int, ...] | str = DEFAULT_SIGNALS) -> None:
        if isinstance(signals, str):
            signals = parse_signals(signals)
        self.signals = tuple(signals)
        self.signal: int | None = None
        self._previous = {sig: signal.signal(sig, self._handle) for sig in self.signals}

    def _handle(self, signum, _frame) -> None:
        if self.signal is not None and signum == signal.SIGINT:  # second Ctrl-C: stop now
            signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))
            raise KeyboardInterrupt
        if self.signal is None:
            self.signal = signum

    @property
    def name(self) -> str:
        """The first signal's name (``SIGTERM``), or "" before any."""
        return signal.Signals(self.signal).name if self.signal is not None else ""

    def restore(self) -> None:
        """Put back the previous handlers."""
        for sig, h in self._previous.items():
            signal.signal(sig, h)


def install(signals: tuple[int, ...] | str = DEFAULT_SIGNALS) -> PreemptionHandler:
    """The process's handler, installed now (main calls it first thing); :func:`job_signals`
    and the trainer find it again with :func:`installed`."""
    global _installed
    _installed = PreemptionHandler(signals)
    return _installed


def installed() -> PreemptionHandler | None:
    """The handler :func:`install` made, or None (a trainer built by a test or a benchmark)."""
    return _installed


def uninstall() -> None:
    """Restore the previous handlers and forget the process's handler."""
    global _installed
    if _installed is not None:
        _installed.restore()
        _installed = None


def job_signals() -> tuple[int, ...]:
    """The signals the job stops on: the installed handler's, else the default ones (what the
    DataLoader workers ignore)."""
    if _installed is not None:
        return _installed.signals
    return parse_signals(DEFAULT_SIGNALS)
