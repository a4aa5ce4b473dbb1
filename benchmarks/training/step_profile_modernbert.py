"""Where one optimizer step's time goes on the ModernBERT path: ours (``--arch modernbert``,
DeepSpeed ZeRO-2) vs transformers' ``ModernBertForMaskedLM`` under HF Trainer (DDP), on 2 ranks.

    python -m benchmarks.training.step_profile_modernbert [--seq 512] [--attention document]
        [--steps 8] [--warmup 3] [--repeats 2] [--out FILE.json] [FLAGS of training.modernbert]

Both sides run exactly as :mod:`benchmarks.training.modernbert` runs its throughput part (its
shards, seeded initial weights, batch of ``--batch_tokens`` tokens, mask rate, lr, precision: bf16
unless ``--precision fp32``), for ``warmup + steps`` optimizer steps, with the wall-clock timers
of :mod:`benchmarks.training.step_profile` (nested sections; rank 0's mean ms per measured step,
each side ``--repeats`` times, alternating HF, ours). Both models are transformers' own ModernBERT
blocks, so the same three sections are timed inside both forwards: the encoder
(``ModernBertModel.forward``), the attention function each calls per layer (ours: the document
and blocked sliding-window path; HF: SDPA with its masks), and the prediction head on the rows
each side predicts (ours: the masked rows; HF: ``sparse_prediction``'s masked rows).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.training import step_profile as sp
from bertforge.logs import get_logger

log = get_logger("benchmarks.training.step_profile_modernbert")

HF_WORKER = "--profile_hf_worker"  # marks a rank of the HF side (started by torchrun)


def time_modernbert(sections: sp.Sections, attention: str) -> None:
    """Timers on the ModernBERT pieces both sides share, and on the attention function the
    config names (registered with transformers' AttentionInterface, wrapped in place)."""
    from transformers import AttentionInterface
    from transformers.models.modernbert import modeling_modernbert as mm

    sp.timed(mm.ModernBertModel, "forward", "   encoder (ModernBertModel)", sections)
    sp.timed(mm.ModernBertPredictionHead, "forward", "   prediction head", sections)
    inner = AttentionInterface._global_mapping[attention]

    def attention_timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            sections.add(f"    attention ({attention}, all layers)", time.perf_counter() - start)

    AttentionInterface.register(attention, attention_timed)


def hf_rank_main(argv: list[str]) -> int:
    """One rank of HF (under torchrun): benchmarks.training.modernbert_hf's worker with timers."""
    from benchmarks.training import modernbert_hf

    sections = sp.sections_from_env()
    sp.instrument_hf_trainer(sections, "ModernBertForMaskedLM")
    time_modernbert(sections, "sdpa")
    modernbert_hf.step_clock = lambda times: sp.stop_clock(sections, times)
    return modernbert_hf.main(argv)


def ours_rank_main() -> int:
    """One rank of ours (under the DeepSpeed launcher): step_profile's trainer timers plus the
    ModernBERT pieces; the attention path registers itself when imported."""
    from bertforge.pretrain.model import attention_paths

    return sp.ours_rank_main(lambda s: time_modernbert(s, attention_paths.ATTN_IMPLEMENTATION))


def run_side(side: str, args, data: dict, seq: int, mine, work: Path, out: Path) -> dict:
    """Launch one side with timers; {rank: sections}."""
    from benchmarks.learning.per_hour import launch
    from benchmarks.training import modernbert as mb
    from benchmarks.training.modernbert_hf import hf_command

    total = mine.warmup + mine.steps
    run = work / f"{side}_run"
    run.mkdir(parents=True, exist_ok=True)
    if side == "ours":
        ns = argparse.Namespace(**{**vars(args), "steps": total + 1})
        script = Path(__file__).resolve()  # the trainer's main with timers (ours_rank_main)
        cmd = mb.ours_train_cmd(
            ns,
            data["shards"][seq],
            data["init"],
            run,
            seq,
            mine.attention,
            script=script,
            compile_=args.compile[-1] == "on",
        )
    else:
        ns = argparse.Namespace(
            **{
                **vars(args),
                "global_batch": args.batch_tokens // seq,
                "hf_compile": args.hf_compile[-1] == "on",
            }
        )
        # one step past the measured ones, as ours: the clock reports when the next step begins
        cmd = hf_command(data["shards"][seq], data["init"], run, ns, steps=total + 1, warmup=1)
        cmd[cmd.index("benchmarks.training.modernbert_hf")] = __spec__.name
        cmd.append(HF_WORKER)
    sp.clear_reports(out)
    launch(cmd, args, work / f"{side}_profile.log", sp.profile_env(out, mine.warmup, mine.steps))
    return sp.rank_reports(out)


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, argparse.Namespace]:
    """(this profile's own flags, benchmarks.training.modernbert's flags for the rest)."""
    from benchmarks.training import modernbert as mb

    own = argparse.ArgumentParser(prog="python -m benchmarks.training.step_profile_modernbert")
    own.add_argument("--seq", type=int, default=512, help="sequence length (tokens)")
    own.add_argument("--attention", default="document", choices=("document", "full"))
    own.add_argument("--steps", type=int, default=8, help="measured optimizer steps")
    own.add_argument("--warmup", type=int, default=3, help="steps left out first")
    own.add_argument("--repeats", type=int, default=2, help="runs per side, alternating")
    own.add_argument("--out", type=Path, default=None, help="results JSON")
    mine, rest = own.parse_known_args(argv)
    args = mb.parse_args([*rest, "--budget_s", "0"])  # throughput only: no learning part
    if not args.quick:
        args.seq_lens = [mine.seq]
        args.learn_seq = mine.seq
    # the lr warm-up inside the steps left out (both sides): a run shorter than its warm-up is
    # refused, and the lr does not change a step's time
    args.warmup_steps = min(args.warmup_steps, mine.warmup)
    if args.precision == "auto":
        args.precision = "bf16"  # the precision both sides train the measured runs in
    return mine, args


def main(argv: list[str] | None = None) -> int:
    """Prepare training.modernbert's shards and initial weights once, then run the sides."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if HF_WORKER in argv:
        argv.remove(HF_WORKER)
        return hf_rank_main(argv)
    from benchmarks.common import write_results
    from benchmarks.training import modernbert as mb

    mine, args = parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="step_profile_modernbert_"))
    work.mkdir(parents=True, exist_ok=True)
    data = mb.prepare(args, work)
    seq = args.seq_lens[0]
    results = []
    for rep in range(mine.repeats):
        for side in ("hf", "ours"):
            start, load = time.time(), os.getloadavg()[0]
            ranks = run_side(side, args, data, seq, mine, work, work / f"{side}_{rep}")
            results.append({"side": side, "repeat": rep, "load_1min": load, "ranks": ranks})
            log.info(f"{side} run {rep + 1}: {time.time() - start:.0f} s, load {load:.2f}")
    sp.print_table(results)
    out = mine.out or work / "step_profile_modernbert.json"
    settings = {**vars(mine), "seq": seq, "precision": args.precision, "modernbert": argv}
    write_results(out, {"args": settings, "runs": results}, run=work)
    log.info(f"wrote {out}")
    return 0


if __name__ == "__main__":
    if os.environ.get(sp.ENV_OUT) and HF_WORKER not in sys.argv:
        sys.exit(ours_rank_main())  # a rank of ours, started by the DeepSpeed launcher
    sys.exit(main())
