"""What one step's gradient exchange costs on this machine's process group: DDP's (and ZeRO
stage 0's) one all-reduce of every gradient, against ZeRO-1/2's reduce-scatter of the gradients
followed by the all-gather of the updated parameters.

    python -m benchmarks.training.collectives [--elements 28_800_000] [--dtype bf16 fp32]
        [--ranks 2] [--repeats 5] [--backend gloo] [--out FILE.json]

The default size is the `small` BERT with BERT's vocabulary (28.8M parameters). Each rank runs
one torch thread (as the trainers here do); the two exchanges alternate, ``--repeats`` times after
one warm-up each, and rank 0 reports the median and range of its wall milliseconds per exchange.
Both exchanges move the same gradients; which one a trainer uses is its choice of ZeRO stage.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

DTYPES = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}


def exchanges(n: int, dtype, world: int) -> dict:
    """name -> a function doing one exchange of ``n`` elements of ``dtype``."""
    import torch
    import torch.distributed as dist

    grads = torch.ones(n, dtype=dtype)
    shard = torch.empty(n // world, dtype=dtype)
    params = torch.empty(n // world * world, dtype=dtype)
    flat = grads[: n // world * world]

    def reduce_scatter_all_gather():
        dist.reduce_scatter_single(shard, flat)
        dist.all_gather_single(params, shard)

    return {
        "all-reduce (DDP, ZeRO-0)": lambda: dist.all_reduce(grads),
        "reduce-scatter + all-gather (ZeRO-1/2)": reduce_scatter_all_gather,
    }


def rank_main(rank: int, args) -> None:
    """One rank: time every exchange in every dtype, alternating; rank 0 prints and saves."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group(args.backend, rank=rank, world_size=args.ranks)
    results = []
    for name in args.dtype:
        funcs = exchanges(args.elements, getattr(torch, DTYPES[name]), args.ranks)
        times = {key: [] for key in funcs}
        for f in funcs.values():  # warm-up
            f()
        for _ in range(args.repeats):
            for key, f in funcs.items():
                dist.barrier()
                start = time.perf_counter()
                f()
                times[key].append(1000.0 * (time.perf_counter() - start))
        for key, ms in times.items():
            results.append({"dtype": name, "exchange": key, "ms": ms})
    dist.destroy_process_group()
    if rank == 0:
        report(results, args)


def report(results: list[dict], args) -> None:
    from benchmarks.common import write_results

    print(f"{args.elements:,} elements, {args.ranks} ranks, {args.backend}, one thread per rank")
    print("| dtype | exchange | median ms [min, max] | vs all-reduce |")
    print("|---|---|---|---:|")
    base = {}
    for r in results:
        med = statistics.median(r["ms"])
        base.setdefault(r["dtype"], med)
        span = f"[{min(r['ms']):.0f}, {max(r['ms']):.0f}]"
        ratio = med / base[r["dtype"]]
        print(f"| {r['dtype']} | {r['exchange']} | {med:.0f} {span} | {ratio:.2f}x |")
    if args.out:
        write_results(args.out, {"args": vars(args), "results": results})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.training.collectives",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--elements", type=int, default=28_800_000, help="gradient elements")
    p.add_argument("--dtype", nargs="+", default=["bf16", "fp32"], choices=sorted(DTYPES))
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--backend", default="gloo")
    p.add_argument("--port", type=int, default=29911)
    p.add_argument("--out", default=None, help="results JSON")
    args = p.parse_args(argv)
    import torch.multiprocessing as mp

    os.environ["MASTER_PORT"] = str(args.port)
    mp.spawn(rank_main, args=(args,), nprocs=args.ranks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
