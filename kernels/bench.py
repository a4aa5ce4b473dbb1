"""Benchmark of the masked-LM head + loss: HF-style all-position logits vs masked rows only.

    python -m kernels.bench [--batch 32 --seq 128 --hidden 768 --vocab 30522] [--out DIR]

Every variant does the decoder matmul + softmax-CE, forward and backward, on the same tensors:
  hf_all_positions   logits at every position + F.cross_entropy(ignore_index)   (HF, Megatron)
  gathered_torch_ce  masked rows gathered, then F.linear + F.cross_entropy     (NVIDIA, MosaicBERT)
  gathered_compiled  torch.compile of that linear + CE                         (--no-compile skips)
  gathered_liger     Liger-Kernel's cross entropy on gathered logits          (CUDA, if installed)
  ours_torch         kernels.masked_lm_loss(impl="torch")
  ours_triton        kernels.masked_lm_loss(impl="triton")                     (CUDA)
On CUDA it also times the loss alone on [masked rows x V] logits and reports bandwidth against the
device's HBM peak. On CPU it times with perf_counter (median), measures peak memory with
torch.profiler(profile_memory=True) and runs a small interpreter-mode correctness pass.
Writes bench_kernels.json and bench_kernels.png into --out (default: the current directory).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from . import api


@dataclass
class BenchConfig:
    """What to measure."""

    batch: int = 0  # sequences per batch; 0 = 32 on CPU, 256 on a GPU
    seq: int = 128  # tokens per sequence
    hidden: int = 768  # H (BERT-base 768, BERT-large 1024)
    vocab: int = 30522  # true vocabulary; the weight is padded to a multiple of 8
    mask_prob: float = 0.15  # fraction of positions with a label
    dtype: str = "float32"  # parameter/activation dtype (CPU: float32; GPU: bfloat16)
    repeat: int = 5  # timed repetitions per variant (CPU); do_bench decides on GPU
    compile: bool = True  # include the torch.compile variant
    out: str = "."  # folder for bench_kernels.json and bench_kernels.png
    seed: int = 0  # input generation
    sweep: bool = False  # CUDA: also time the loss alone over the notes' grid (N_m, V, dtype)


@dataclass
class Result:
    """One variant's measurement."""

    name: str
    time_ms: float  # median fwd+bwd
    peak_mb: float  # peak bytes allocated during one fwd+bwd above what existed before
    note: str = ""
    extra: dict = field(default_factory=dict)


def make_inputs(cfg: BenchConfig, device: torch.device):
    """hidden [B, T, H], padded weight [V8, H], bias [V8], labels [B, T] (~mask_prob labelled)."""
    g = torch.Generator().manual_seed(cfg.seed)
    dtype = getattr(torch, cfg.dtype)
    v_pad = (cfg.vocab + 7) // 8 * 8
    hidden = torch.randn(cfg.batch, cfg.seq, cfg.hidden, generator=g).to(device, dtype)
    weight = (torch.randn(v_pad, cfg.hidden, generator=g) * 0.02).to(device, dtype)
    bias = torch.zeros(v_pad, dtype=dtype, device=device)
    labels = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq), generator=g)
    labels[torch.rand(cfg.batch, cfg.seq, generator=g) >= cfg.mask_prob] = -100
    return hidden, weight, bias, labels.to(device)


def variants(cfg: BenchConfig, device: torch.device) -> dict[str, Callable | str]:
    """name -> fwd+bwd step(hidden, weight, bias, labels), or a string saying why it is skipped.

    The baselines get the unpadded [V, H] decoder (as in HF); "ours_*" get the padded one with
    vocab_size=V (as in NVIDIA's BERT and our model).
    """
    V = cfg.vocab

    def hf_all_positions(h, w, b, y):
        logits = F.linear(h.reshape(-1, h.shape[-1]), w, b)
        F.cross_entropy(logits, y.reshape(-1), ignore_index=-100).backward()

    def gather(h, y):
        rows = (y.reshape(-1) != -100).nonzero().squeeze(1)
        return h.reshape(-1, h.shape[-1]).index_select(0, rows), y.reshape(-1).index_select(0, rows)

    def head_ce(hr, w, b, yr):
        return F.cross_entropy(F.linear(hr, w, b), yr)

    def gathered_torch_ce(h, w, b, y):
        hr, yr = gather(h, y)
        head_ce(hr, w, b, yr).backward()

    out: dict[str, Callable | str] = {
        "hf_all_positions": hf_all_positions,
        "gathered_torch_ce": gathered_torch_ce,
    }
    if cfg.compile:
        compiled = torch.compile(head_ce, dynamic=False)

        def gathered_compiled(h, w, b, y):
            hr, yr = gather(h, y)
            compiled(hr, w, b, yr).backward()

        out["gathered_compiled"] = gathered_compiled
    else:
        out["gathered_compiled"] = "skipped (--no-compile)"
    try:
        from liger_kernel.transformers import LigerCrossEntropyLoss
    except ImportError:
        out["gathered_liger"] = "skipped: liger-kernel not installed"
    else:
        if device.type != "cuda":
            out["gathered_liger"] = "skipped: Liger's kernels need CUDA"
        else:
            liger = LigerCrossEntropyLoss()

            def gathered_liger(h, w, b, y):
                hr, yr = gather(h, y)
                liger(F.linear(hr, w, b), yr).backward()

            out["gathered_liger"] = gathered_liger

    def ours(impl):
        def step(h, w, b, y):
            api.masked_lm_loss(h, w, b, y, vocab_size=V, impl=impl).loss.backward()

        return step

    out["ours_torch"] = ours("torch")
    out["ours_triton"] = (
        ours("triton")
        if device.type == "cuda" and api._triton_available()
        else "CUDA only here (the CPU interpreter is a correctness tool, see below)"
    )
    return out


def _leaves(tensors):
    return [t.detach().clone().requires_grad_(t.is_floating_point()) for t in tensors]


def cpu_peak_bytes(step: Callable, inputs) -> int:
    """Peak CPU bytes allocated during one step above the level at its start (profiler trace)."""
    from torch.profiler import ProfilerActivity, profile

    leaves = _leaves(inputs)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step(*leaves)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    mem = [
        e["args"]
        for e in events
        if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0
    ]
    if not mem:
        return 0
    start = mem[0]["Total Allocated"] - mem[0]["Bytes"]
    return max(m["Total Allocated"] for m in mem) - start


def time_cpu(steps: dict[str, tuple[Callable, tuple]], repeat: int) -> dict[str, list[float]]:
    """fwd+bwd milliseconds per variant {name: (step, inputs)}; the variants take turns each round,
    so that load from other processes on a shared machine hits all of them alike. Fresh leaves
    each run."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeat):
        for name, (step, inputs) in steps.items():
            leaves = _leaves(inputs)
            t0 = time.perf_counter()
            step(*leaves)
            times[name].append((time.perf_counter() - t0) * 1e3)
    return times


def time_cuda(step: Callable, inputs) -> tuple[float, float]:
    """(median ms via triton.testing.do_bench, peak MB above the starting level)."""
    from .bench_cuda import measure_cuda

    leaves = _leaves(inputs)

    def run():
        for t in leaves:
            t.grad = None
        step(*leaves)

    return measure_cuda(run)


def interpreter_check() -> str:
    """Small correctness pass of the Triton kernel on CPU (TRITON_INTERPRET=1) vs impl='torch'."""
    from .triton_ce import interpreting

    if not interpreting():
        return "skipped: set TRITON_INTERPRET=1 before starting python to run the kernel on CPU"
    g = torch.Generator().manual_seed(1)
    h = torch.randn(48, 64, generator=g)
    w = torch.randn(30528, 64, generator=g) * 0.05
    b = torch.randn(30528, generator=g) * 0.01
    y = torch.randint(0, 30522, (48,), generator=g)
    y[::3] = -100
    got = []
    for impl in ("torch", "triton"):
        leaves = _leaves((h, w, b))
        out = api.masked_lm_loss(*leaves, y, vocab_size=30522, impl=impl)
        out.loss.backward()
        got.append([out.loss.detach()] + [t.grad for t in leaves] + [out.num_correct])
    errs = [
        float((a.double() - c.double()).abs().max() / a.double().abs().max().clamp_min(1e-30))
        for a, c in zip(got[0][:4], got[1][:4])
    ]
    ok = max(errs) < 1e-5 and int(got[0][4]) == int(got[1][4])
    return (
        f"{'OK' if ok else 'MISMATCH'}: triton vs torch on 32 masked rows x V=30522 (padded "
        f"30528), max relative error loss/dh/dW/db = {', '.join(f'{e:.1e}' for e in errs)}"
    )


def fp16_underflow_check(
    vocab: int = 30522, rows: int = 64, normalizer: float = 4915.0, loss_scale: float = 2.0**16
) -> dict:
    """Share of the fp16 logit gradient lost to underflow: gradient stored in forward vs backward.

    In-place-in-forward (Liger) must store d(loss)/d(logits) = (p - onehot) / normalizer before the
    loss scale is known (or, as a variant, p - onehot, scaled afterwards at the cost of an extra
    pass or a fused matmul); recompute-in-backward (ours) stores (p - onehot) * scale / normalizer.
    Logits are N(0, 1) rows, as for an early-training BERT head.
    """
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, vocab, generator=g).half().float()
    y = torch.randint(0, vocab, (rows,), generator=g)
    grad = torch.softmax(x.double(), -1)
    grad[torch.arange(rows), y] -= 1.0
    exact = grad * (loss_scale / normalizer)  # what the optimizer should receive (scaled)
    stored_fwd = (grad / normalizer).half().double() * loss_scale
    stored_fwd_unnormalised = grad.half().double() * (loss_scale / normalizer)
    stored_bwd = exact.half().double()
    out = {}
    for name, got in (
        ("grad_in_forward", stored_fwd),
        ("grad_in_forward_unnormalised", stored_fwd_unnormalised),
        ("recompute_in_backward", stored_bwd),
    ):
        out[name] = {
            "zeroed_fraction": float(((got == 0) & (exact != 0)).double().mean()),
            "rel_l2_error": float((got - exact).norm() / exact.norm()),
        }
    return out


def plot(results: list[Result], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.name for r in results]
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.5 * len(names) + 2))
    for ax, values, label in (
        (axes[0], [r.time_ms for r in results], "fwd+bwd time (ms)"),
        (axes[1], [r.peak_mb for r in results], "peak memory (MB)"),
    ):
        bars = ax.barh(names, values, color="tab:blue")
        ax.bar_label(bars, fmt="%.0f")
        ax.set_xlabel(label)
        ax.margins(x=0.15)
        ax.invert_yaxis()
    axes[1].set_yticklabels([])
    fig.suptitle(title)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


def run(cfg: BenchConfig) -> dict:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda" and cfg.dtype == "float32":
        cfg.dtype = "bfloat16"
    if not cfg.batch:
        cfg.batch = 256 if device.type == "cuda" else 32
    padded = make_inputs(cfg, device)
    unpadded = (padded[0], padded[1][: cfg.vocab], padded[2][: cfg.vocab], padded[3])
    n_masked = int((padded[3] != -100).sum())
    results: list[Result] = []
    runnable: dict[str, tuple[Callable, tuple]] = {}
    for name, step in variants(cfg, device).items():
        if isinstance(step, str):
            print(f"{name:20s} {step}")
            results.append(Result(name, float("nan"), float("nan"), note=step))
            continue
        try:  # the first call is the warm-up (and torch.compile's compilation)
            inputs = padded if name.startswith("ours") else unpadded
            if device.type == "cuda":
                ms, mb = time_cuda(step, inputs)
            else:
                mb, ms = cpu_peak_bytes(step, inputs) / 2**20, float("nan")
        except Exception as exc:  # noqa: BLE001  (e.g. torch.compile without a compiler: report, go on)
            note = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
            print(f"{name:20s} {note}")
            results.append(Result(name, float("nan"), float("nan"), note=note))
            continue
        results.append(Result(name, ms, mb))
        runnable[name] = (step, inputs)
        print(
            f"{name:20s} peak {mb:10.1f} MB" + ("" if math.isnan(ms) else f" {ms:10.1f} ms"),
            flush=True,
        )
    if device.type == "cpu":
        times = time_cpu(runnable, cfg.repeat)
        for r in results:
            if r.name in times:
                r.time_ms = statistics.median(times[r.name])
                r.extra["min_ms"] = round(min(times[r.name]), 1)
                r.extra["all_ms"] = [round(t, 1) for t in times[r.name]]
    if device.type == "cuda":
        v_pad = (cfg.vocab + 7) // 8 * 8
        grid = [(n_masked, v_pad, cfg.vocab, cfg.dtype)]
        if cfg.sweep:  # the shapes of docs: N_m for 256 and 1024 x 128 tokens at 15 %
            grid += [
                (n, w, v, d)
                for n in (4915, 19661)
                for (w, v) in ((30522, 30522), (30528, 30522), (21128, 21128))
                for d in ("bfloat16", "float16")
            ]
        from .bench_cuda import loss_only

        for shape in dict.fromkeys(grid):
            results += [Result(**r) for r in loss_only(*shape, compile_=cfg.compile)]
    base = next(r for r in results if r.name == "hf_all_positions")
    for r in results:
        if not math.isnan(r.time_ms) and not r.name.startswith("loss_only"):
            r.extra["speedup_vs_hf"] = round(base.time_ms / r.time_ms, 2)
            r.extra["memory_ratio_vs_hf"] = round(base.peak_mb / max(r.peak_mb, 1e-9), 2)
    check = interpreter_check() if device.type == "cpu" else "not needed (the kernel ran on CUDA)"
    report = {
        "config": asdict(cfg),
        "n_positions": cfg.batch * cfg.seq,
        "n_masked": n_masked,
        "device": torch.cuda.get_device_name()
        if device.type == "cuda"
        else f"CPU ({platform.machine()}, {torch.get_num_threads()} threads)",
        "torch": torch.__version__,
        "timing": "triton.testing.do_bench median"
        if device.type == "cuda"
        else f"time.perf_counter, median of {cfg.repeat} interleaved rounds after 1 warm-up",
        "memory": "torch.cuda.max_memory_allocated above start"
        if device.type == "cuda"
        else "torch.profiler(profile_memory=True): max 'Total Allocated' of the CPU allocator "
        "during one fwd+bwd, above its level at the start (inputs and parameters excluded, "
        "gradients included)",
        "interpreter_check": check,
        "fp16_gradient_underflow": fp16_underflow_check(cfg.vocab),
        "results": [asdict(r) for r in results],
    }
    print_table(report)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "bench_kernels.json.tmp"
    tmp.write_text(json.dumps(report, indent=2))
    os.replace(tmp, out / "bench_kernels.json")
    measured = [
        r for r in results if not math.isnan(r.time_ms) and not r.name.startswith("loss_only")
    ]
    plot(
        measured,
        out / "bench_kernels.png",
        f"MLM head+loss fwd+bwd, {cfg.batch}x{cfg.seq} positions, {n_masked} masked, "
        f"H={cfg.hidden}, V={cfg.vocab}, {cfg.dtype}, {report['device']}",
    )
    print(f"wrote {out / 'bench_kernels.json'} and {out / 'bench_kernels.png'}")
    return report


def print_table(report: dict) -> None:
    print(
        f"\n{report['n_positions']} positions, {report['n_masked']} masked, "
        f"device {report['device']}"
    )
    print(f"{'variant':34s} {'ms':>9s} {'peak MB':>9s} {'speedup':>8s} {'mem x':>7s}  notes")
    for r in report["results"]:
        e = r["extra"]
        extra = " ".join(
            f"{k}={v}"
            for k, v in e.items()
            if k not in ("speedup_vs_hf", "memory_ratio_vs_hf", "all_ms")
        )
        print(
            f"{r['name']:34s} {r['time_ms']:9.1f} {r['peak_mb']:9.1f} "
            f"{e.get('speedup_vs_hf', math.nan):8.2f} {e.get('memory_ratio_vs_hf', math.nan):7.2f}"
            f"  {r['note']} {extra}"
        )
    print(f"interpreter check: {report['interpreter_check']}")
    for k, v in report["fp16_gradient_underflow"].items():
        print(
            f"fp16 logit gradient, {k}: {100 * v['zeroed_fraction']:.1f}% of entries flushed to 0, "
            f"relative L2 error {v['rel_l2_error']:.2e}"
        )


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m kernels.bench", description=__doc__.split("\n")[0])
    for f in BenchConfig.__dataclass_fields__.values():
        if f.type in ("bool", bool):
            p.add_argument(
                f"--no-{f.name}", dest=f.name, action="store_false", help=f"disable {f.name}"
            )
        else:
            p.add_argument(f"--{f.name}", type=type(f.default), default=f.default)
    return run(BenchConfig(**vars(p.parse_args(argv))))


if __name__ == "__main__":
    main()
