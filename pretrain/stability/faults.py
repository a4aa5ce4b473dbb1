"""Planned faults for the reliability tests (docs/reliability.md): off unless asked for.

``BERTFORGE_FAULTS="kind@step[@rank],..."`` makes a run misbehave on purpose at one optimizer
step, so that a test on CPU can prove what the system does about it (the row of the fault table
names the kind). ``step`` is the optimizer step being taken (1-based, as in metrics.jsonl) or,
for a save, the step the checkpoint is written after; ``rank`` limits the fault to one rank
(default: every rank). Each fault fires once per launch. A run with planned faults says so on
its first line, so nobody trains with one by accident.

Kinds:
    loss_spike  the step's loss is multiplied by :data:`SPIKE_FACTOR` (gradients with it)
    loss_nan    the step's loss is NaN (gradients with it)
    save_enospc the checkpoint save after the step fails with ``OSError(ENOSPC)`` part-way
    kill_in_PHASE   the rank SIGKILLs itself part-way through PHASE at the step (a crash)
    term_in_PHASE   the rank sends SIGTERM to its job's whole process group part-way through
                    PHASE, as a scheduler's preemption does (the job must run in its own
                    session: ``setsid``, ``start_new_session=True``)
    int_in_PHASE    the same with SIGINT, as a terminal's Ctrl-C does (twice: a second Ctrl-C)
    usr1_in_PHASE   the same with SIGUSR1, as SLURM's ``--signal=USR1@120`` warning does

PHASE is ``save`` (after DeepSpeed wrote its files, before the RNG and state files and the
completion marker), ``validation`` (after the first validation batch) or ``startup`` (after the
engine is built, before the first step; its step is the step the launch starts from).
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

ENV_VAR = "BERTFORGE_FAULTS"
PHASES = ("save", "validation", "startup")  # where a planned signal can arrive
SIGNALS = {
    "kill": signal.SIGKILL,
    "term": signal.SIGTERM,
    "int": signal.SIGINT,
    "usr1": signal.SIGUSR1,
}
KINDS = (
    "loss_spike",
    "loss_nan",
    "save_enospc",
    *(f"{name}_in_{phase}" for name in SIGNALS for phase in PHASES),
)
SPIKE_FACTOR = 1000.0


@dataclass(frozen=True)
class Fault:
    """One planned fault: what, at which step, on which rank (None: every rank)."""

    kind: str
    step: int
    rank: int | None = None


def parse_faults(spec: str) -> list[Fault]:
    """Parse a ``BERTFORGE_FAULTS`` value; a malformed entry is an error naming it."""
    faults = []
    for entry in filter(None, (e.strip() for e in spec.split(","))):
        parts = entry.split("@")
        try:
            if len(parts) not in (2, 3) or parts[0] not in KINDS:
                raise ValueError
            step = int(parts[1])
            rank = int(parts[2]) if len(parts) == 3 else None
        except ValueError:
            raise ValueError(
                f"{ENV_VAR}: cannot read {entry!r}; write kind@step or kind@step@rank with kind "
                f"one of {', '.join(KINDS)} (e.g. {ENV_VAR}=loss_nan@7,save_enospc@10@1)"
            ) from None
        faults.append(Fault(parts[0], step, rank))
    return faults


class FaultPlan:
    """The faults planned for this launch (from the environment); each fires once."""

    def __init__(self, spec: str | None = None):
        spec = os.environ.get(ENV_VAR, "") if spec is None else spec
        self.pending = parse_faults(spec)

    def __bool__(self) -> bool:
        return bool(self.pending)

    def describe(self) -> str:
        """One line for the console naming every planned fault."""
        names = [
            f"{f.kind}@{f.step}" + (f"@{f.rank}" if f.rank is not None else "")
            for f in self.pending
        ]
        return f"{ENV_VAR} plans faults for this run: {', '.join(names)}"

    def due(self, kind: str, step: int, rank: int) -> bool:
        """True (once) when a fault of ``kind`` is planned at ``step`` on ``rank``."""
        for f in self.pending:
            if f.kind == kind and f.step == step and f.rank in (None, rank):
                self.pending.remove(f)
                return True
        return False

    def signal_if_due(self, phase: str, step: int, rank: int) -> None:
        """Send the signal a ``kill_in_PHASE`` or ``term_in_PHASE`` fault plans for ``step``."""
        for name, signum in SIGNALS.items():
            if not self.due(f"{name}_in_{phase}", step, rank):
                continue
            if name == "kill":
                os.kill(os.getpid(), signum)
            # A scheduler signals every process of the job; refuse to signal a group that is
            # not the job's own (it would reach the shell or the test runner that started it).
            if os.getsid(0) != os.getpgrp():
                raise RuntimeError(
                    f"{ENV_VAR}: {name}_in_{phase} signals the job's process group, but this job "
                    "shares its group with its parent; start it in its own session (setsid)"
                )
            os.killpg(os.getpgrp(), signum)
