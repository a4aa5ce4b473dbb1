"""Start-up cost of the rendezvous check: `pretrain.distributed.startup.init_distributed`
(registration in a TCP store, then the process group on the same store) against plain
`deepspeed.init_distributed` (env://), two local ranks, the time from the call to the end of a first
all-reduce.

    python -m benchmarks.training.launch [--repeats 5] [--ranks 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import textwrap

from benchmarks.common import REPO

RANK_SCRIPT = textwrap.dedent("""
    import sys, time, torch, deepspeed, torch.distributed as dist
    variant = sys.argv[1]
    t0 = time.perf_counter()
    if variant == "ours":
        from bertforge.pretrain.distributed.startup import init_distributed
        init_distributed(timeout_s=120)
    else:
        deepspeed.init_distributed()
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"INIT_MS {1000 * (time.perf_counter() - t0):.1f}", flush=True)
    dist.destroy_process_group()
""")


def one_launch(variant: str, ranks: int) -> float:
    """Milliseconds rank 0 spent in init + first all-reduce."""
    from bertforge.pretrain.distributed.startup import free_port

    port = free_port()
    procs = []
    for r in range(ranks):
        env = {
            **os.environ,
            "RANK": str(r),
            "WORLD_SIZE": str(ranks),
            "LOCAL_RANK": str(r),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(REPO),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", RANK_SCRIPT, variant],
                env=env,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        )
    outs = [p.communicate(timeout=300)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"{variant}: a rank failed")
    return float(next(x for x in outs[0].splitlines() if x.startswith("INIT_MS")).split()[1])


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.training.launch", description=__doc__)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--ranks", type=int, default=2)
    args = p.parse_args()
    times: dict[str, list[float]] = {"deepspeed": [], "ours": []}
    for _ in range(args.repeats):  # interleaved, so background load hits both alike
        for variant, runs in times.items():
            runs.append(one_launch(variant, args.ranks))
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in times.items():
        print(f"{k:>9}: median {med[k]:7.1f} ms  (runs: {', '.join(f'{x:.0f}' for x in v)})")
    print(
        f"ours / deepspeed: {med['ours'] / med['deepspeed']:.2f}x "
        f"({med['ours'] - med['deepspeed']:+.1f} ms)"
    )


if __name__ == "__main__":
    main()
