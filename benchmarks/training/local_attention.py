"""Sliding-window attention at long context: what a ModernBERT local layer costs, blocked vs dense.

    python -m benchmarks.training.local_attention [--quick] [--lengths 1024 2048 4096 8192]
        [--repeat 5] [--out docs/bench/local_attention.json]

One attention layer (batch 1, modernbert-base heads: 12 x 64, ``--local_attention 128`` so
|q - k| <= 64, one document), forward + backward, three arms:
- ``blocked``: the local layers' path (``attention_paths.blocked_local_attention``, O(T * w));
- ``dense band``: the same local layer as SDPA with the dense [T, T] band mask (what every local
  layer cost before the blocked path);
- ``full``: a global layer (``global_document_attention``: SDPA with the additive document
  mask, no band).
Then a whole model step (forward + backward + loss) at the longest length: modernbert-tiny's shape
(3 layers, hidden 128, 2 heads of 64, GeGLU 192) with 8192 positions, every layer global vs the
released 1-in-3 pattern (layer 0 global, 1 and 2 local).

The arms alternate within each of ``--repeat`` rounds (the order reversed every other round), so
background load on a shared machine hits them alike; reported: median seconds, min-max spread,
the ratio to the blocked (or 1-in-3) arm, and the peak of tensor memory allocated during one
extra run of each arm (torch profiler, ``profile_memory``: tensors only, not the process's RSS).
``--quick`` runs small lengths in seconds (the test). CPU only; the GPU path (varlen
flash-attention) is measured by ``make gpu-check``.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path

from benchmarks.common import REPO, write_results

HEADS, HEAD_DIM, LOCAL_ATTENTION = 12, 64, 128
MODEL_VOCAB = 2000


def peak_tensor_mib(fn: Callable[[], None]) -> float:
    """Peak of the bytes torch allocates while ``fn`` runs, from the profiler's memory events."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    current = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        current += e.nbytes()
        peak = max(peak, current)
    return peak / (1 << 20)


def measure(arms: dict[str, Callable[[], None]], repeat: int) -> dict[str, dict]:
    """Seconds of each arm over ``repeat`` alternating rounds (after one warm-up each), and its
    peak tensor memory."""
    times: dict[str, list[float]] = {name: [] for name in arms}
    for fn in arms.values():
        fn()
    names = list(arms)
    for r in range(repeat):
        for name in names if r % 2 == 0 else names[::-1]:
            t0 = time.perf_counter()
            arms[name]()
            times[name].append(time.perf_counter() - t0)
    return {
        name: {
            "median_s": round(statistics.median(ts), 4),
            "min_s": round(min(ts), 4),
            "max_s": round(max(ts), 4),
            "peak_tensor_mib": round(peak_tensor_mib(arms[name]), 1),
        }
        for name, ts in times.items()
    }


def layer_arms(T: int) -> dict[str, Callable[[], None]]:
    """Forward + backward of one attention layer at length T, per arm (module doc)."""
    import torch

    from bertforge.pretrain.model.attention_paths import (
        DocumentLayout,
        blocked_local_attention,
        dense_document_attention,
        global_document_attention,
    )

    g = torch.Generator().manual_seed(T)
    q, k, v = (torch.randn(1, HEADS, T, HEAD_DIM, generator=g, requires_grad=True) for _ in "qkv")
    docs = torch.zeros(1, T, dtype=torch.long)
    w = LOCAL_ATTENTION // 2

    def step(attend):
        def run():
            q.grad = k.grad = v.grad = None
            attend().sum().backward()

        return run

    return {
        "blocked": step(lambda: blocked_local_attention(q, k, v, docs, w)),
        "dense band": step(lambda: dense_document_attention(q, k, v, docs, w)),
        "full": step(lambda: global_document_attention(q, k, v, DocumentLayout(docs))),
    }


def model_arms(T: int) -> dict[str, Callable[[], None]]:
    """Forward + backward + loss of a modernbert-tiny-shaped model at length T: every layer
    global vs one in three."""
    import torch

    from bertforge.pretrain.model.registry import PRESETS, build_model

    ids = torch.randint(5, MODEL_VOCAB, (1, T), generator=torch.Generator().manual_seed(0))
    labels = torch.full_like(ids, -100)
    labels[:, ::7] = ids[:, ::7]  # about 15% of the positions predicted
    batch = {
        "input_ids": ids,
        "labels": labels,
        "document_ids": torch.zeros_like(ids),
        "position_ids": torch.arange(T)[None],
    }
    arms = {}
    for name, every in (("all global", 1), ("1-in-3 global", 3)):
        cfg = dataclasses.replace(
            PRESETS["modernbert-tiny"],
            max_position_embeddings=max(T, 512),
            local_attention=LOCAL_ATTENTION,
            global_attn_every_n_layers=every,
            loss_impl="torch",
        )
        torch.manual_seed(0)
        model = build_model(cfg, MODEL_VOCAB)

        def run(model=model):
            model.zero_grad(set_to_none=True)
            model(**batch)["loss"].backward()

        arms[name] = run
    return arms


def with_ratios(rows: dict[str, dict], base: str) -> dict[str, dict]:
    """Each arm's median over ``base``'s median, added to its row."""
    for row in rows.values():
        row["x_base"] = round(row["median_s"] / rows[base]["median_s"], 2)
    return rows


def markdown(layer: dict[int, dict], model: dict[str, dict], model_T: int) -> str:
    """The two result tables as markdown (what docs/benchmarks.md shows)."""
    lines = [
        "| T | arm | median s | spread s | x blocked | peak tensor MiB |",
        "|---|---|---|---|---|---|",
    ]
    for T, rows in layer.items():
        for name, r in rows.items():
            spread = f"{r['min_s']:.3f}-{r['max_s']:.3f}"
            lines.append(
                f"| {T} | {name} | {r['median_s']:.3f} | {spread} | {r['x_base']:.2f} | "
                f"{r['peak_tensor_mib']:.0f} |"
            )
    lines += [
        "",
        f"| model step, T {model_T} | median s | spread s | x 1-in-3 | peak tensor MiB |",
        "|---|---|---|---|---|",
    ]
    for name, r in model.items():
        spread = f"{r['min_s']:.3f}-{r['max_s']:.3f}"
        lines.append(
            f"| {name} | {r['median_s']:.3f} | {spread} | {r['x_base']:.2f} | "
            f"{r['peak_tensor_mib']:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.training.local_attention",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    p.add_argument("--repeat", type=int, default=5, help="alternating rounds per arm")
    p.add_argument("--out", type=Path, default=REPO / "docs" / "bench" / "local_attention.json")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: a 2-core machine)")
    p.add_argument(
        "--quick", action="store_true", help="lengths 256 512, 2 rounds: a smoke run in seconds"
    )
    args = p.parse_args(argv)
    if args.quick:
        args.lengths, args.repeat = [256, 512], 2
    if min(args.lengths) < 1 or args.repeat < 1:
        p.error("--lengths and --repeat must be positive")

    import torch

    torch.set_num_threads(args.threads)
    layer = {}
    for T in args.lengths:
        layer[T] = with_ratios(measure(layer_arms(T), args.repeat), "blocked")
        print(f"T {T}: " + ", ".join(f"{k} {v['median_s']:.3f} s" for k, v in layer[T].items()))
    model_T = max(args.lengths)
    model = with_ratios(measure(model_arms(model_T), args.repeat), "1-in-3 global")
    table = markdown(layer, model, model_T)
    print(table)
    results = {
        "date": date.today().isoformat(),
        "machine": f"{platform.machine()} CPU, {args.threads} torch thread(s), torch "
        f"{torch.__version__}",
        "command": "python -m benchmarks.training.local_attention" + (" --quick" * args.quick),
        "shape": {"heads": HEADS, "head_dim": HEAD_DIM, "local_attention": LOCAL_ATTENTION},
        "repeat": args.repeat,
        "memory": "peak bytes of tensors allocated during one run (torch profiler)",
        "layer": {str(T): rows for T, rows in layer.items()},
        "model_step": {"seq_len": model_T, "arms": model},
        "table": table,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_results(args.out, results, indent=2)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
