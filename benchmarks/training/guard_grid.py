"""The stability guard on a grid of healthy runs and of real divergences (issue 36, item 11).

    python -m benchmarks.training.guard_grid --corpus TEXT [--out /tmp/guard_grid] [--steps 200]
        [--batch 16] [--archs bert modernbert] [--lrs 1e-3 2e-3 3e-3] [--seeds 1 2 3]
        [--small_lrs 3e-3] [--small_seeds 1 2 3] [--jobs 2] [--only NAME ...]

Every run is the project's trainer as a user launches it, on one process and one thread, with the
guard at its defaults (on): ``--warmup_steps 50``, batch ``--batch`` (16), linear decay, on
shards built from ``--corpus`` (one document a line; the measurements used the Chinese novel
beside the checkout).
Two sizes of each architecture (:data:`SIZES`): tiny (the presets ``tiny`` and
``modernbert-tiny``) and small (BERT's ``small`` preset, 512 x 4 layers, and a ModernBERT of the
same width and depth). Two kinds of run:

- **healthy**: each arch at tiny over ``--lrs`` x ``--seeds`` and at small over ``--small_lrs`` x
  ``--small_seeds`` (a small step costs about 10x a tiny one on a CPU thread: the top of the lr
  range, where the spikes were, by default). A false positive is a run whose loss falls (mean of
  the last 10 steps below that of the first 10) and that the guard ended (exit status 6) or rolled
  back (a rollback in place, without a checkpoint, too); steps it skipped are counted apart.
- **divergence**, per architecture at the middle lr and the first seed: a NaN loss planned at
  step ``--nan_step`` (``BERTFORGE_FAULTS=loss_nan@K``: caught when the guard rolls back), and
  an absurd lr (``--absurd_lr``, 1.0: caught when the guard rolls back or gives up).

Prints one table row per run and a summary (false positives of N healthy runs, divergences caught
of M); writes OUT/summary.json. A finished run (OUT/<name>/result.json) is not run again.
"""

from __future__ import annotations

import json
import statistics
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks.common import CPU_DS_CONFIG, REPO, build_shards, one_thread_env, write_results
from bertforge.cli import ArgumentParser
from bertforge.logs import get_logger
from bertforge.pretrain.components.metrics import read_metrics
from bertforge.pretrain.config import command_line
from bertforge.pretrain.config.train_config import GuardConfig
from bertforge.pretrain.stability.guard import StabilityGuard

log = get_logger(__spec__.name)  # run as `python -m`: __name__ is "__main__"

WARMUP, VOCAB, SEQ = 50, 8000, 128

#: (arch, size) -> the trainer's model flags. ModernBERT has no small preset: its tiny preset
#: (GeGLU, a global layer every 3, no biases) at BERT-small's width and depth, GeGLU width 1.5x
#: as in modernbert-base (768 -> 1152).
SIZES: dict[tuple[str, str], dict[str, object]] = {
    ("bert", "tiny"): {"model": "tiny"},
    ("bert", "small"): {"model": "small"},
    ("modernbert", "tiny"): {"model": "modernbert-tiny"},
    ("modernbert", "small"): {
        "model": "modernbert-tiny",
        "hidden_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "intermediate_size": 768,
    },
}


@dataclass
class Cell:
    """One run of the grid."""

    arch: str
    lr: float
    seed: int
    kind: str  # "healthy" | "nan" | "absurd_lr"
    faults: str = ""
    size: str = "tiny"  # a key of SIZES with the arch

    @property
    def name(self) -> str:
        size = "" if self.size == "tiny" else f"{self.size}_"  # tiny: the names of earlier grids
        return f"{self.arch}_{size}{self.kind}_lr{self.lr:g}_s{self.seed}"


@dataclass
class Outcome:
    """What a run did and what the guard did about it."""

    cell: Cell
    exit: int
    steps: int
    loss_first: float
    loss_last: float
    events: dict[str, int] = field(default_factory=dict)
    rollbacks: int = 0
    old_rules_escalate_at: int | None = None  # see old_rules_escalation
    current_rules_escalate_at: int | None = None  # see current_rules_escalation

    @property
    def skips(self) -> int:
        """Steps the guard skipped (a loss spike's update dropped)."""
        return sum(n for k, n in self.events.items() if k.endswith(":skip"))

    @property
    def loss_falls(self) -> bool:
        return self.loss_last < self.loss_first

    @property
    def verdict(self) -> str:
        acted = self.exit == 6 or self.rollbacks > 0
        if self.cell.kind == "healthy":
            if self.exit not in (0, 6):
                return f"failed (exit {self.exit})"
            return "FALSE POSITIVE" if acted and self.loss_falls else "ok"
        return "caught" if acted else "MISSED"


def grid(args) -> list[Cell]:
    """The healthy cells (tiny, then small), then the divergences of each architecture (tiny,
    the middle lr, the first seed)."""
    cells = [
        Cell(arch, lr, s, "healthy", size=size)
        for size, lrs, seeds in (
            ("tiny", args.lrs, args.seeds),
            ("small", args.small_lrs, args.small_seeds),
        )
        for arch in args.archs
        for lr in lrs
        for s in seeds
    ]
    if args.lrs and args.seeds:
        lr, seed = sorted(args.lrs)[len(args.lrs) // 2], args.seeds[0]
        for arch in args.archs:
            cells.append(Cell(arch, lr, seed, "nan", f"loss_nan@{args.nan_step}"))
            cells.append(Cell(arch, args.absurd_lr, seed, "absurd_lr"))
    return cells


def run_cell(cell: Cell, shards: Path, out: Path, steps: int, batch: int) -> Outcome:
    """Train one cell (or read its finished result) and judge it."""
    run = out / cell.name
    done = run / "result.json"
    if not done.is_file():
        cmd = command_line.trainer(
            ds_config=CPU_DS_CONFIG, data=shards, output_dir=run, arch=cell.arch,
            **SIZES[(cell.arch, cell.size)], lr=cell.lr, seed=cell.seed, warmup_steps=WARMUP,
            max_steps=steps,
            global_batch_size=batch, micro_batch_size=batch, num_workers=0, progress=False,
            eval_interval=0, eval_batches=2, save_final=False, keep_last=2,
        )  # fmt: skip
        env = one_thread_env(BERTFORGE_FAULTS=cell.faults)
        run.mkdir(parents=True, exist_ok=True)
        with open(run / "train.log", "w") as logf:
            proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=logf, stderr=subprocess.STDOUT)
        write_results(done, {"exit": proc.returncode, "command": cmd}, out)
    result = json.loads(done.read_text())
    return judge(cell, int(result["exit"]), run / "metrics.jsonl")


def judge(cell: Cell, exit_status: int, metrics: Path) -> Outcome:
    """The run's losses at the start and the end, and its guard records by event."""
    train = read_metrics(metrics) if metrics.is_file() else []
    losses = [float(r["loss"]) for r in train if isinstance(r.get("loss"), (int, float))]
    guard = read_metrics(metrics, "guard") if metrics.is_file() else []
    events: dict[str, int] = {}
    for g in guard:
        key = f"{g['event']}:{g['action']}"
        events[key] = events.get(key, 0) + 1
    rollbacks = max((int(g.get("rollbacks", 0)) for g in guard), default=0)  # in place too
    replay = cell.kind == "healthy" and not guard_acted(guard)
    old = old_rules_escalation(train) if replay else None
    now = current_rules_escalation(train) if replay else None
    return Outcome(
        cell,
        exit_status,
        len(train),
        statistics.fmean(losses[:10]) if losses else float("nan"),
        statistics.fmean(losses[-10:]) if losses else float("nan"),
        events,
        rollbacks,
        old,
        now,
    )


def guard_acted(guard: list[dict]) -> bool:
    """Whether the guard changed the run (a skip, a rollback, giving up)."""
    return any(g["action"] != "ok" for g in guard)


def first_escalation(train: list[dict], clipping: float, climb: float) -> int | None:
    """The step at which a guard with these rules would have rolled back or given up on the
    run's records; None if never. Exact for a run the guard let through (every step "ok"): it
    is the run that guard would have seen up to that step."""
    guard = StabilityGuard(GuardConfig(guard_climb=climb), clipping=clipping)
    for r in train:
        loss, norm = float(r["loss"]), r.get("grad_norm")
        verdict = guard.check_loss(r["step"], loss)
        if verdict.action == "ok" and verdict.event is None:
            verdict = guard.check_grad_norm(r["step"], None if norm is None else float(norm))
        if verdict.action in ("rollback", "give_up"):
            return int(r["step"])
    return None


def old_rules_escalation(train: list[dict]) -> int | None:
    """The guard before issue 36: grad-norm spikes of clipped updates counted, no climb test."""
    return first_escalation(train, clipping=0.0, climb=0.0)


def current_rules_escalation(train: list[dict]) -> int | None:
    """Today's defaults (clipping 1.0, the shipped configs' value), replayed: the check for a
    run trained before the last change to the rules."""
    return first_escalation(train, clipping=1.0, climb=GuardConfig().guard_climb)


def table(outcomes: list[Outcome]) -> str:
    """The markdown table and the two numbers."""
    rows = [
        "| arch | size | kind | lr | seed | exit | step records | loss first 10 -> last 10 "
        "| guard events | rollbacks | verdict | replayed: old rules escalate at | today's rules |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        c = o.cell
        events = ", ".join(f"{k} x{v}" for k, v in sorted(o.events.items())) or "-"
        rows.append(
            f"| {c.arch} | {c.size} | {c.kind} | {c.lr:g} | {c.seed} | {o.exit} | {o.steps} | "
            f"{o.loss_first:.2f} -> {o.loss_last:.2f} | {events} | {o.rollbacks} | {o.verdict} | "
            f"{o.old_rules_escalate_at or '-'} | {o.current_rules_escalate_at or '-'} |"
        )
    healthy = [o for o in outcomes if o.cell.kind == "healthy"]
    diverging = [o for o in outcomes if o.cell.kind != "healthy"]
    fp = sum(o.verdict == "FALSE POSITIVE" for o in healthy)
    caught = sum(o.verdict == "caught" for o in diverging)
    old = sum(o.old_rules_escalate_at is not None for o in healthy)
    rows += [
        "",
        f"healthy runs ended or rolled back by the guard: {fp} of {len(healthy)} "
        f"(loss fell in {sum(o.loss_falls for o in healthy)})",
        f"steps skipped (a loss spike's update dropped) in healthy runs: "
        f"{sum(o.skips for o in healthy)}, in {sum(o.skips > 0 for o in healthy)} runs",
        f"divergences caught: {caught} of {len(diverging)}",
        f"the rules before issue 36 would have rolled back or ended {old} of {len(healthy)} "
        "healthy runs",
    ]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", type=Path, required=True, help="text, one document a line")
    p.add_argument("--out", type=Path, default=Path("/tmp/guard_grid"))
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=16, help="sequences a step (one process)")
    p.add_argument(
        "--archs", nargs="*", default=["bert", "modernbert"], choices=["bert", "modernbert"]
    )
    p.add_argument("--lrs", type=float, nargs="*", default=[1e-3, 2e-3, 3e-3], help="tiny runs")
    p.add_argument("--seeds", type=int, nargs="*", default=[1, 2, 3], help="tiny runs")
    p.add_argument("--small_lrs", type=float, nargs="*", default=[3e-3], help="small runs")
    p.add_argument("--small_seeds", type=int, nargs="*", default=[1, 2, 3], help="small runs")
    p.add_argument("--nan_step", type=int, default=120)
    p.add_argument("--absurd_lr", type=float, default=1.0)
    p.add_argument("--jobs", type=int, default=2, help="runs at once")
    p.add_argument(
        "--only", nargs="*", default=[], help="run the cells whose name has one of these"
    )
    args = p.parse_args(argv)
    if not args.corpus.is_file():
        p.error(f"--corpus {args.corpus}: no such file; give a text file, one document a line")
    shards = build_shards(
        args.corpus, args.out / "shards", vocab_size=VOCAB, max_seq_len=SEQ, one_doc_per_line=True
    )
    cells = [c for c in grid(args) if not args.only or any(o in c.name for o in args.only)]
    log.info(f"{len(cells)} runs of {args.steps} steps, {args.jobs} at a time, in {args.out}")
    with ThreadPoolExecutor(args.jobs) as pool:
        outcomes = list(
            pool.map(lambda c: run_cell(c, shards, args.out, args.steps, args.batch), cells)
        )
    summary = [{**asdict(o), "verdict": o.verdict} for o in outcomes]
    write_results(args.out / "summary.json", summary, args.out)
    print(table(outcomes))


if __name__ == "__main__":
    main()
