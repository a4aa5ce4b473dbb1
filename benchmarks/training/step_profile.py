"""Where one optimizer step's time goes: ours (DeepSpeed ZeRO-2) vs HF Trainer (DDP), on 2 ranks.

    python -m benchmarks.training.step_profile --init_from minilm [--steps 8] [--warmup 3]
        [--repeats 2] [--out FILE.json]

Both sides run exactly as ``benchmarks.learning.per_hour`` runs them (its flags, its seeded
``BertForMaskedLM`` folder, its shards: 16 x 128 tokens per rank, bf16 by default in continued
mode), for ``warmup + steps`` optimizer steps, with wall-clock timers wrapped around named
functions (in place, in each rank; CPU work is synchronous, so wall time is the work's time).
Sections nest: an indented name is part of the one above it. Each side runs ``--repeats`` times,
alternating (hf, ours, hf, ours) so background load hits both alike; the table gives rank 0's
mean milliseconds per measured step, per repeat.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from bertforge.logs import get_logger

# The DeepSpeed launcher runs this file as a script (the ranks of ours): run_side passes the
# repository on PYTHONPATH, so `benchmarks` and `bertforge` import there as they do here.
REPO = Path(__file__).resolve().parents[2]

log = get_logger("benchmarks.training.step_profile")

ENV_OUT = "BERTFORGE_STEP_PROFILE_OUT"  # where a rank writes its timings (set by the parent)
ENV_STEPS = "BERTFORGE_STEP_PROFILE_STEPS"  # "warmup,steps"


class Sections:
    """Wall seconds per named section, summed per optimizer step; steps before ``warmup`` are
    dropped. ``begin_step`` starts the next step's bucket."""

    def __init__(self, warmup: int, steps: int):
        self.warmup, self.steps = warmup, steps
        self.step = -1
        self.per_step: list[dict[str, float]] = []
        self.calls: dict[str, int] = defaultdict(int)
        self.order: list[str] = []

    def begin_step(self) -> None:
        self.step += 1
        self.per_step.append(defaultdict(float))

    def add(self, name: str, seconds: float) -> None:
        if name not in self.order:
            self.order.append(name)
        if self.step >= 0:
            self.per_step[self.step][name] += seconds
            if self.warmup <= self.step < self.warmup + self.steps:
                self.calls[name] += 1

    def done(self) -> bool:
        return self.step >= self.warmup + self.steps

    def report(self) -> dict:
        """Mean ms per measured step of each section, and calls per step."""
        measured = self.per_step[self.warmup : self.warmup + self.steps]
        n = max(len(measured), 1)
        return {
            name: {
                "ms_per_step": 1000.0 * sum(s.get(name, 0.0) for s in measured) / n,
                "calls_per_step": self.calls[name] / n,
            }
            for name in self.order
        }


def timed(owner, attr: str, name: str, sections: Sections) -> None:
    """Replace ``owner.attr`` (a function or method) by one that adds its wall time to ``name``."""
    inner = getattr(owner, attr)

    @functools.wraps(inner)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            sections.add(name, time.perf_counter() - start)

    setattr(owner, attr, wrapper)


def time_collectives(sections: Sections) -> None:
    """Every torch.distributed collective called from Python (DeepSpeed's too; DDP's bucketed
    all-reduce runs in C++ inside backward and does not show here)."""
    import torch.distributed as dist

    for fn in ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "broadcast"):
        timed(dist, fn, f"  collective {fn} (any caller)", sections)
    timed(dist, "barrier", "  collective barrier (any caller)", sections)


def write_report(sections: Sections, side: str) -> None:
    """Each rank's timings to ``$BERTFORGE_STEP_PROFILE_OUT.rankN.json``."""
    rank = int(os.environ.get("RANK", "0"))
    out = Path(f"{os.environ[ENV_OUT]}.rank{rank}.json")
    out.write_text(json.dumps({"side": side, "rank": rank, "sections": sections.report()}))


# ---- ours: pretrain/main.py with timers ---------------------------------------------------------


def instrument_ours(sections: Sections) -> None:
    """Timers on the trainer's step, its host syncs, DeepSpeed's engine and ZeRO-2 internals."""
    import deepspeed.runtime.zero.stage_1_and_2 as zero2
    import torch
    from deepspeed.runtime.engine import DeepSpeedEngine

    import bertforge.pretrain.trainer as trainer_mod
    from bertforge.pretrain.checkpoints.checkpoint import CheckpointManager
    from bertforge.pretrain.components.metrics import MetricsWriter, StepTimer

    step_fn = trainer_mod.Trainer.train_step
    state = {"last": None}

    def train_step(self, batches, timer):
        now = time.perf_counter()
        if state["last"] is not None:  # the previous step's whole loop iteration
            sections.add("iteration (step start to step start)", now - state["last"])
        if sections.step + 1 == sections.warmup + sections.steps:  # the measured steps are in
            write_report(sections, "ours")
        state["last"] = now
        sections.begin_step()
        return step_fn(self, batches, timer)

    trainer_mod.Trainer.train_step = train_step
    timed(trainer_mod.Trainer, "train_step", " train_step", sections)
    _time_data_wait(sections, StepTimer)
    timed(trainer_mod, "sum_across_ranks", "  masked/token counts all-reduce", sections)
    timed(DeepSpeedEngine, "forward", "  engine forward", sections)
    timed(DeepSpeedEngine, "backward", "  engine backward", sections)
    timed(zero2.DeepSpeedZeroOptimizer, "reduce_ipg_grads", "   ZeRO-2 gradient reduce", sections)
    timed(DeepSpeedEngine, "step", "  engine step", sections)
    timed(zero2.DeepSpeedZeroOptimizer, "scaled_global_norm", "   grad norm", sections)
    timed(zero2.DeepSpeedZeroOptimizer, "has_overflow", "   overflow check", sections)
    timed(torch.optim.AdamW, "step", "   AdamW step (own partition)", sections)
    timed(zero2, "all_gather_dp_groups", "   ZeRO-2 parameter all-gather", sections)
    timed(trainer_mod, "engine_record", " engine_record (grad norm, lr)", sections)
    timed(MetricsWriter, "step", " metrics.step", sections)
    timed(CheckpointManager, "save_due", " save_due (stop/save all-reduce)", sections)
    time_collectives(sections)


def _time_data_wait(sections: Sections, timer_cls) -> None:
    """The trainer measures its own loader wait (``StepTimer.waited(seconds)``): record it."""
    inner = timer_cls.waited

    def waited(self, seconds):
        sections.add("  loader wait (next(batches))", seconds)
        return inner(self, seconds)

    timer_cls.waited = waited


def sections_from_env() -> Sections:
    """A rank's sections for the warm-up and measured steps its parent set (ENV_STEPS)."""
    warmup, steps = map(int, os.environ[ENV_STEPS].split(","))
    return Sections(warmup, steps)


def ours_rank_main(extra: Callable[[Sections], None] | None = None) -> int:
    """One rank of ours (under the DeepSpeed launcher): pretrain/main.py with timers; ``extra``
    adds an arch's own timers (step_profile_modernbert)."""
    sections = sections_from_env()
    instrument_ours(sections)
    if extra is not None:
        extra(sections)
    from bertforge.pretrain.main import main

    code = main(keep_handler=True)
    sys.stdout.flush()
    os._exit(code)


# ---- HF: benchmarks.learning.hf_side's worker with timers ---------------------------------------


def instrument_hf_trainer(sections: Sections, model_class: str) -> None:
    """Timers on HF Trainer's step: forward of ``transformers.<model_class>``, backward (DDP's
    all-reduce inside), clipping, the fused AdamW step. The step itself is the callback's
    (:func:`stop_clock`), which the caller puts in place of its harness's own."""
    import accelerate
    import torch
    import transformers

    timed(transformers.Trainer, "training_step", " training_step (forward + backward)", sections)
    timed(getattr(transformers, model_class), "forward", "  model forward", sections)
    timed(accelerate.Accelerator, "backward", "  backward (DDP all-reduce inside)", sections)
    timed(accelerate.Accelerator, "clip_grad_norm_", " clip_grad_norm_", sections)
    timed(torch.optim.AdamW, "step", " AdamW step (fused)", sections)
    time_collectives(sections)


def instrument_hf(sections: Sections) -> None:
    """HF's BERT side (benchmarks.learning.hf_side): the Trainer's timers, and the step clock in
    place of its wall-clock snapshot callback."""
    from benchmarks.learning import hf_side

    instrument_hf_trainer(sections, "BertForMaskedLM")
    hf_side.snapshot_clock = lambda args: stop_clock(sections)


def stop_clock(sections: Sections, times: list[float] | None = None):
    """A TrainerCallback that marks step starts and stops the run after the measured steps;
    ``times`` (a harness's own step clock) gets each step's end time too."""
    from transformers import TrainerCallback

    class StopClock(TrainerCallback):
        records: list = []
        last = None

        def on_step_begin(self, targs, state, control, **_kw):
            now = time.perf_counter()
            if self.last is not None:
                sections.add("iteration (step start to step start)", now - self.last)
            self.last = now
            sections.begin_step()

        def on_step_end(self, targs, state, control, **_kw):
            if times is not None:
                times.append(time.perf_counter())
            if sections.done():
                write_report(sections, "hf")
                control.should_training_stop = True

    return StopClock()


def hf_rank_main(argv: list[str]) -> int:
    """One rank of HF (under torchrun): the per_hour HF worker with timers."""
    from benchmarks.learning.hf_side import hf_worker
    from benchmarks.learning.per_hour import parse_args

    sections = sections_from_env()
    instrument_hf(sections)
    hf_worker(parse_args(argv))
    return 0


# ---- the parent: prepare once, run each side, print the table -----------------------------------


def run_side(side: str, args, shards: Path, work: Path, out: Path) -> dict:
    """Launch one side with timers; rank 0's and rank 1's sections."""
    from benchmarks.learning import per_hour

    env = profile_env(out, args.warmup, args.steps)
    args.budget_s = 1e9  # the step count ends the run, not the clock
    if side == "ours":
        cmd = per_hour.ours_command(
            shards,
            work / "ours",
            args,
            max_steps=args.warmup + args.steps + 1,
            max_time_hours=None,
            save_interval_minutes=None,
            save_final=False,
            script=Path(__file__).resolve(),  # pretrain/main.py's main with timers
        )
    else:
        cmd = per_hour.hf_command(shards, work / "hf", args, time.time())
        cmd[cmd.index("benchmarks.learning.per_hour")] = "benchmarks.training.step_profile"
    clear_reports(out)
    per_hour.launch(cmd, args, work / f"{side}_profile.log", env)
    return rank_reports(out)


def profile_env(out: Path, warmup: int, steps: int) -> dict[str, str]:
    """What a side's ranks need to time themselves and write their reports (OUT.rankN.json)."""
    return {ENV_OUT: str(out), ENV_STEPS: f"{warmup},{steps}", "PYTHONPATH": str(REPO)}


def clear_reports(out: Path) -> None:
    for old in Path(out).parent.glob(Path(out).name + ".rank*.json"):
        old.unlink()


def rank_reports(out: Path) -> dict[str, dict]:
    """{rank: its sections} from the reports the ranks wrote."""
    return {
        p.stem.split(".rank")[-1]: json.loads(p.read_text())["sections"]
        for p in sorted(Path(out).parent.glob(Path(out).name + ".rank*.json"))
    }


def print_table(results: list[dict]) -> None:
    """Per side: rank 0's ms per step of each section, one column per repeat."""
    for side in ("hf", "ours"):
        runs = [r["ranks"]["0"] for r in results if r["side"] == side]
        if not runs:
            continue
        print(f"\n{side}: rank 0, ms per optimizer step (mean of the measured steps)")
        print("| section | " + " | ".join(f"run {i + 1}" for i in range(len(runs))) + " | calls |")
        print("|---|" + "---:|" * (len(runs) + 1))
        for name in runs[0]:
            cells = [f"{r[name]['ms_per_step']:.1f}" if name in r else "-" for r in runs]
            calls = runs[0][name]["calls_per_step"]
            label = name.replace(" ", "&nbsp;", len(name) - len(name.lstrip()))
            print(f"| {label} | {' | '.join(cells)} | {calls:g} |")


def main(argv: list[str] | None = None) -> int:
    """Prepare per_hour's data and seeded folder once, then run the sides alternating."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--hf_worker" in argv:  # a rank of the HF side (torchrun)
        return hf_rank_main(argv)
    import argparse
    import tempfile

    from benchmarks.common import write_results
    from benchmarks.learning import per_hour

    own = argparse.ArgumentParser(prog="python -m benchmarks.training.step_profile")
    own.add_argument("--steps", type=int, default=8, help="measured optimizer steps")
    own.add_argument("--warmup", type=int, default=3, help="steps left out first")
    own.add_argument("--repeats", type=int, default=2, help="runs per side, alternating")
    own.add_argument("--out", type=Path, default=None, help="results JSON")
    mine, rest = own.parse_known_args(argv)
    args = per_hour.parse_args(rest)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="step_profile_"))
    work.mkdir(parents=True, exist_ok=True)
    args.init_model = per_hour.init_model(args, work)
    shards, _stats, _batches = per_hour.prepare(args, work)
    args.steps, args.warmup = mine.steps, mine.warmup
    # The lr warmup does not change a step's time; the trainer refuses one longer than the run.
    args.warmup_steps = min(args.warmup_steps, mine.warmup + mine.steps)
    results = []
    for rep in range(mine.repeats):
        for side in args.sides:
            start = time.time()
            load = os.getloadavg()[0]
            ranks = run_side(side, args, shards, work, work / f"{side}_{rep}")
            results.append({"side": side, "repeat": rep, "load_1min": load, "ranks": ranks})
            log.info(f"{side} run {rep + 1}: {time.time() - start:.0f} s, load {load:.2f}")
    print_table(results)
    out = mine.out or work / "step_profile.json"
    write_results(out, {"args": vars(mine) | {"per_hour": rest}, "runs": results}, run=work)
    log.info(f"wrote {out}")
    return 0


if __name__ == "__main__":
    if os.environ.get(ENV_OUT) and "--hf_worker" not in sys.argv:
        sys.exit(ours_rank_main())  # a rank of ours, started by the DeepSpeed launcher
    sys.exit(main())
