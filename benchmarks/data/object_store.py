"""Training from object storage vs local disk: tokens/s of a 2-rank run (issue 53, "Fast").

    python -m benchmarks.data.object_store [--rounds 5] [--steps 80] [--out DIR]

Builds the pydoc corpus re-cut into documents of about 2,000 characters, ``--copies`` times over
(8: 3.7 MB of text; repeated text trains as fast), in shards of ``--shard_docs`` documents (64:
about 28 training shards of one size, 80 kB each). Starts moto's S3 server (``moto_server``, the
``moto[server]`` package) on 127.0.0.1, uploads the folder, then runs the same 2-rank training
(tiny model, two DeepSpeed CPU ranks, one thread each, ``--data_order window --window_shards 1``,
no checkpoints) from the local folder and from ``s3://`` with ``--cache_limit`` a quarter of the
training data, in alternating order (local first in even rounds, S3 first in odd ones), a fresh
cache each time. A run's tokens/s is its tokens over its step time after the first ``--skip``
steps (the first shards' arrival and the engine's warm-up left out; the cache refills at every
window, so the rest is the steady state of a cache smaller than the data). Prints and writes
(``DIR/object_store.json``) each round's pair, the medians, the spread (min-max) and the ratio
S3/local of the medians, the data wait per step, the bytes each rank fetched against the data's
size, its cache's peak against its limit, and the machine's load. Then the loader alone, in this
process, local and S3 taking turns (``--loader_batches``): batches per wall and per CPU second,
the second steadier than any wall clock on a machine other jobs share. Target: a ratio of 0.95 or
more.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks.common import CPU_DS_CONFIG, REPO, build_shards, one_thread_env
from bertforge.data_prep.sample_corpus import write_english_corpus
from bertforge.files import write_json_atomic
from bertforge.pretrain.components.metrics import read_metrics
from bertforge.pretrain.config import command_line

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
}
URL = "s3://bench/shards"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def niced(nice: int):
    """A subprocess's preexec_fn that changes its priority by ``nice`` (None for 0)."""
    return (lambda: os.nice(nice)) if nice else None


def start_moto(log: Path, nice: int = 0) -> tuple[subprocess.Popen, str]:
    """moto's S3 server on a free port of 127.0.0.1: (its process, its endpoint)."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    exe = shutil.which("moto_server")
    cmd = [exe] if exe else [sys.executable, "-m", "moto.server"]
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [*cmd, "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=niced(nice),
        )
    for _ in range(300):
        try:
            urllib.request.urlopen(endpoint + "/moto-api/", timeout=2)
            return proc, endpoint
        except OSError:
            time.sleep(0.2)
    stop(proc)
    raise RuntimeError(f"moto_server did not start (see {log})")


def stop(proc: subprocess.Popen) -> None:
    """Stop the server by its pid (its process group)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def upload(endpoint: str, local: Path) -> None:
    """The shard folder to URL, the manifest last."""
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, **_boto_credentials())
    bucket, prefix = URL.removeprefix("s3://").split("/", 1)
    client.create_bucket(Bucket=bucket)
    files = sorted(p for p in local.rglob("*") if p.is_file())
    files.sort(key=lambda p: p.name == "manifest.json")
    for p in files:
        client.upload_file(str(p), bucket, f"{prefix}/{p.relative_to(local).as_posix()}")


def _boto_credentials() -> dict[str, str]:
    return {
        "aws_access_key_id": CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        "region_name": CREDENTIALS["AWS_DEFAULT_REGION"],
    }


def uniform_shards(out: Path, copies: int, shard_docs: int) -> Path:
    """The benchmark's shard folder (built once, kept under ``out``): ``copies`` times the
    re-cut corpus, ``shard_docs`` documents a shard."""
    out = out / f"corpus-{copies}x-{shard_docs}"
    out.mkdir(parents=True, exist_ok=True)
    corpus = write_english_corpus(out / "pydoc.txt")
    lines = [ln for ln in corpus.read_text(encoding="utf-8").splitlines() if ln.strip()]
    docs, doc = [], []
    for line in lines:
        doc.append(line)
        if sum(map(len, doc)) >= 2000:
            docs.append(doc)
            doc = []
    text = out / "uniform.txt"
    text.write_text("".join("\n".join(d) + "\n\n" for d in docs) * copies, encoding="utf-8")
    return build_shards(
        text, out / "shards", vocab_size=2000, max_seq_len=128, shard_docs=shard_docs
    )


def train_bytes(shards: Path) -> int:
    m = json.loads((shards / "manifest.json").read_text())
    return sum(f["bytes"] for s in m["splits"]["train"]["shards"] for f in s["files"].values())


def run(data: str, folder: Path, steps: int, env: dict, extra: dict, nice: int = 0) -> Path:
    """One 2-rank training run into ``folder``; returns it."""
    cmd = command_line.trainer(
        ranks=2,
        master_port=free_port(),
        ds_config=CPU_DS_CONFIG,
        data=data,
        output_dir=folder,
        model="tiny",
        max_steps=steps,
        global_batch_size=32,
        micro_batch_size=8,
        num_workers=1,
        lr=1e-3,
        warmup_steps=5,
        save_final=False,
        eval_batches=1,
        progress=False,
        data_order="window",
        window_shards=1,
        **extra,
    )
    proc = subprocess.run(
        cmd, cwd=REPO, env=env, capture_output=True, text=True, preexec_fn=niced(nice)
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{data}: training failed\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return folder


def throughput(folder: Path, skip: int) -> dict[str, float]:
    """Tokens/s over the steps after ``skip``, and the mean data wait per step."""
    recs = [r for r in read_metrics(folder / "metrics.jsonl") if r["step"] > skip]
    seconds = sum(r["step_time_s"] for r in recs)
    return {
        "tokens_per_s": sum(r["tokens"] for r in recs) / seconds,
        "data_wait_s_per_step": statistics.mean(r["data_wait_s"] for r in recs),
        "steps": len(recs),
    }


def loader_rates(shards: Path, limit: int, cache: Path, batches: int, rounds: int) -> dict:
    """The loader alone, in this process (no workers, window order, batches of 8): batches per
    wall second and per CPU second of the process (its fetch threads included; the server's
    CPU is not), local and S3 (the cache a quarter of the data) taking turns."""
    from bertforge.data_prep import shard_cache
    from bertforge.data_prep.reader import ShardReader
    from bertforge.pretrain.data.loader import DataConfig, build_loader
    from bertforge.pretrain.data.masking import MaskingConfig

    shard_cache.configure(cache, limit)
    cfg = DataConfig(num_workers=0, data_order="window", window_shards=1)
    out: dict[str, list] = {"local": [], "s3": []}
    for rnd in range(rounds):
        for side in ("local", "s3") if rnd % 2 == 0 else ("s3", "local"):
            reader = ShardReader(str(shards) if side == "local" else URL)
            it = iter(build_loader(reader, cfg, MaskingConfig(), micro_batch_size=8))
            next(it)  # the first shards' arrival left out
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(batches):
                next(it)
            out[side].append(
                {
                    "batches_per_s": batches / (time.perf_counter() - wall),
                    "batches_per_cpu_s": batches / (time.process_time() - cpu),
                }
            )
    stats = shard_cache.process_cache().stats()
    shard_cache.close()
    cpu = {k: statistics.median(r["batches_per_cpu_s"] for r in v) for k, v in out.items()}
    return {**out, "cache": stats, "cpu_ratio": cpu["s3"] / cpu["local"], "cpu_median": cpu}


def summary(results: list[dict]) -> dict:
    local = [r["local"]["tokens_per_s"] for r in results]
    s3 = [r["s3"]["tokens_per_s"] for r in results]
    med_local, med_s3 = statistics.median(local), statistics.median(s3)
    return {
        "local_median": med_local,
        "local_spread": [min(local), max(local)],
        "s3_median": med_s3,
        "s3_spread": [min(s3), max(s3)],
        "ratio": med_s3 / med_local,
        "ratio_per_round": [b / a for a, b in zip(local, s3)],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--skip", type=int, default=10, help="steps left out of each run's rate")
    p.add_argument("--copies", type=int, default=8, help="copies of the re-cut pydoc corpus")
    p.add_argument("--shard_docs", type=int, default=64, help="documents per shard")
    p.add_argument(
        "--loader_batches", type=int, default=2000, help="batches per loader-only round (0: none)"
    )
    p.add_argument(
        "--nice",
        type=int,
        default=0,
        help="priority change of the runs and the server (-10 on a machine other jobs share: "
        "needs root; both sides alike)",
    )
    p.add_argument("--out", type=Path, default=REPO / "runs" / "bench" / "object_store")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    shards = uniform_shards(args.out, args.copies, args.shard_docs)
    limit = train_bytes(shards) // 4
    server, endpoint = start_moto(args.out / "moto.log", args.nice)
    try:
        upload(endpoint, shards)
        s3_env = one_thread_env(**CREDENTIALS, AWS_ENDPOINT_URL=endpoint, PYTHONPATH=str(REPO))
        local_env = one_thread_env(PYTHONPATH=str(REPO))
        results = []
        work = Path(tempfile.mkdtemp(prefix="bench-object-store-"))
        for rnd in range(args.rounds):
            got = {}
            for side in ("local", "s3") if rnd % 2 == 0 else ("s3", "local"):
                folder = work / f"{side}-{rnd}"
                if side == "local":
                    run(str(shards), folder, args.steps, local_env, {}, args.nice)
                else:
                    cache = work / f"cache-{rnd}"
                    extra = {"cache_dir": cache, "cache_limit": limit}
                    run(URL, folder, args.steps, s3_env, extra, args.nice)
                got[side] = {**throughput(folder, args.skip), "load_avg_1min": os.getloadavg()[0]}
                if side == "s3":
                    got["cache"] = [
                        json.loads((cache / f"rank-{r}" / "stats.json").read_text()) for r in (0, 1)
                    ]
            results.append(got)
            print(
                f"round {rnd}: local {got['local']['tokens_per_s']:,.0f} tokens/s, "
                f"s3 {got['s3']['tokens_per_s']:,.0f} tokens/s "
                f"(ratio {got['s3']['tokens_per_s'] / got['local']['tokens_per_s']:.3f})",
                flush=True,
            )
        loader = None
        if args.loader_batches:
            os.environ.update(CREDENTIALS, AWS_ENDPOINT_URL=endpoint)
            loader = loader_rates(shards, limit, work / "cache-loader", args.loader_batches, 4)
            print(f"loader alone, batches per CPU second: {loader['cpu_median']}", flush=True)
        shutil.rmtree(work, ignore_errors=True)
    finally:
        stop(server)
    report = {
        "train_bytes": train_bytes(shards),
        "cache_limit_bytes": limit,
        "steps": args.steps,
        "skip": args.skip,
        "nice": args.nice,
        "rounds": results,
        **summary(results),
        "loader_alone": loader,
    }
    write_json_atomic(args.out / "object_store.json", report, indent=1)
    s = report
    print(
        f"local {s['local_median']:,.0f} tokens/s (spread {s['local_spread'][0]:,.0f}-"
        f"{s['local_spread'][1]:,.0f}); s3 {s['s3_median']:,.0f} tokens/s (spread "
        f"{s['s3_spread'][0]:,.0f}-{s['s3_spread'][1]:,.0f}); ratio {s['ratio']:.3f}; "
        f"cache limit {limit:,} B = a quarter of {report['train_bytes']:,} B"
        + (f"; loader alone, S3/local per CPU second {loader['cpu_ratio']:.3f}" if loader else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
