"""Benchmark of the masked-LM head + loss: HF-style all-position logits vs masked rows only.

    python -m benchmarks.kernels.speed [--batch 32 --seq 128 --hidden 768 --vocab 30522] [--out DIR]
    python -m benchmarks.kernels.speed --sweep [--no-head]  # also the loss alone, N_m x V x dtype

The head part: every variant does the decoder matmul + softmax-CE, forward and backward, on the
same tensors:
  hf_all_positions   logits at every position + F.cross_entropy(ignore_index)   (HF, Megatron)
  gathered_torch_ce  masked rows gathered, then F.linear + F.cross_entropy     (NVIDIA, MosaicBERT)
  gathered_compiled  torch.compile of that linear + CE                         (--no-compile skips)
  gathered_liger     Liger-Kernel's cross entropy on gathered logits          (CUDA, if installed)
  ours_torch         kernels.masked_lm_loss(impl="torch")
  ours_triton        kernels.masked_lm_loss(impl="triton")                     (CUDA)
The sweep part (--sweep): the loss alone, forward + backward, on [N_m x V] logits for each
N_m in --sweep_rows, width in --sweep_vocabs and dtype in --sweep_dtypes: torch eager,
torch.compile, Liger (CUDA, if installed), kernels.softmax_cross_entropy and the kernel pair as
masked_lm_loss runs it (in place), as achieved GB/s and % of the device's HBM peak, plus peak
memory.

On CUDA: triton.testing.do_bench (median) and torch.cuda.max_memory_allocated. On CPU:
time.perf_counter (median), torch.profiler(profile_memory=True) for peak memory, a small
interpreter-mode correctness pass, and the Triton variants only under TRITON_INTERPRET=1.
Writes bench_kernels.json and bench_kernels.png into --out (default: the current directory).
Exit status 1 when a variant of ours failed (a baseline that fails, e.g. torch.compile without a
C compiler, is reported as failed and does not fail the command); every row says ok, skipped
(and why) or failed (and the error), never a silent NaN.
Modules: this one (config, head part, report, CLI); benchmarks.kernels.sweep (the sweep part);
benchmarks.kernels.measure (how one variant is timed and its memory read); benchmarks.kernels.cuda
(the HBM peak table and do_bench).
"""

from __future__ import annotations

import argparse
import io
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.common import write_results
from benchmarks.kernels.cuda import hbm_peak_gbps, measure_cuda
from benchmarks.kernels.measure import (
    Result,
    _error_note,
    _leaves,
    cpu_peak_bytes,
    liger_loss,
    triton_unavailable,
)
from benchmarks.kernels.sweep import loss_only, sweep_grid
from bertforge.cli import ArgumentParser, field_help, opt
from bertforge.files import write_bytes_atomic
from bertforge.kernels import api
from bertforge.kernels.constants import IGNORE_INDEX
from bertforge.logs import get_logger

# __spec__.name, not __name__: run with `python -m`, this module's __name__ is "__main__"
log = get_logger(__spec__.name)


@dataclass
class BenchConfig:
    """What to measure."""

    batch: int = opt(0, "sequences per batch; 0 = 32 on CPU, 256 on a GPU")
    seq: int = opt(128, "tokens per sequence")
    hidden: int = opt(768, "H (BERT-base 768, BERT-large 1024)")
    vocab: int = opt(30522, "true vocabulary; the weight is padded to a multiple of 8")
    mask_prob: float = opt(0.15, "fraction of positions with a label")
    dtype: str = opt("auto", "parameter/activation dtype; auto = float32 on CPU, bfloat16 on a GPU")
    repeat: int = opt(5, "timed repetitions per variant (CPU); do_bench decides on GPU")
    compile: bool = opt(True, "include the torch.compile variants")
    out: str = opt(".", "folder for bench_kernels.json and bench_kernels.png")
    seed: int = opt(0, "input generation")
    head: bool = opt(True, "the head part: decoder + loss, all positions vs masked rows")
    sweep: bool = opt(
        False, "the sweep part: the loss alone on [N_m x V] logits over the grid below"
    )
    sweep_rows: str = opt("4915,19661", "N_m of the sweep (256 and 1024 x 128 tokens at 15 %)")
    sweep_vocabs: str = opt("30522,30528/30522,21128", "logits widths; WIDTH/VOCAB when padded")
    sweep_dtypes: str = opt("bfloat16,float16", "logits dtypes of the sweep")


def make_inputs(cfg: BenchConfig, device: torch.device):
    """hidden [B, T, H], padded weight [V8, H], bias [V8], labels [B, T] (~mask_prob labelled)."""
    g = torch.Generator().manual_seed(cfg.seed)
    dtype = getattr(torch, cfg.dtype)
    v_pad = (cfg.vocab + 7) // 8 * 8
    hidden = torch.randn(cfg.batch, cfg.seq, cfg.hidden, generator=g).to(device, dtype)
    weight = (torch.randn(v_pad, cfg.hidden, generator=g) * 0.02).to(device, dtype)
    bias = torch.zeros(v_pad, dtype=dtype, device=device)
    labels = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq), generator=g)
    labels[torch.rand(cfg.batch, cfg.seq, generator=g) >= cfg.mask_prob] = IGNORE_INDEX
    return hidden, weight, bias, labels.to(device)


def variants(cfg: BenchConfig, device: torch.device) -> dict[str, Callable | str]:
    """name -> fwd+bwd step(hidden, weight, bias, labels), or a string saying why it is skipped.

    The baselines get the unpadded [V, H] decoder (as in HF); "ours_*" get the padded one with
    vocab_size=V (as in NVIDIA's BERT and our model).
    """
    V = cfg.vocab

    def hf_all_positions(h, w, b, y):
        logits = F.linear(h.reshape(-1, h.shape[-1]), w, b)
        F.cross_entropy(logits, y.reshape(-1), ignore_index=IGNORE_INDEX).backward()

    def gather(h, y):
        rows = (y.reshape(-1) != IGNORE_INDEX).nonzero().squeeze(1)
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
    out["gathered_compiled"] = "skipped (--no-compile)"
    if cfg.compile:
        compiled = torch.compile(head_ce, dynamic=False)

        def gathered_compiled(h, w, b, y):
            hr, yr = gather(h, y)
            compiled(hr, w, b, yr).backward()

        out["gathered_compiled"] = gathered_compiled
    liger = liger_loss()
    if isinstance(liger, str) or device.type != "cuda":
        out["gathered_liger"] = liger if isinstance(liger, str) else "skipped: Liger needs CUDA"
    else:

        def gathered_liger(h, w, b, y):
            hr, yr = gather(h, y)
            liger(F.linear(hr, w, b), yr).backward()

        out["gathered_liger"] = gathered_liger

    def ours(impl):
        def step(h, w, b, y):
            api.masked_lm_loss(h, w, b, y, vocab_size=V, impl=impl).loss.backward()

        return step

    out["ours_torch"] = ours("torch")
    why = triton_unavailable(device)
    if device.type == "cpu" and why is None:
        why = "the CPU interpreter is a correctness tool here (see interpreter_check)"
    out["ours_triton"] = ours("triton") if why is None else f"skipped: {why}"
    return out


def time_cpu_rounds(steps: dict[str, tuple[Callable, tuple]], repeat: int) -> dict[str, list]:
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


def measure_head_variant(
    step: Callable, inputs, device: torch.device
) -> tuple[float | None, float]:
    """CUDA: (median ms, peak MB); CPU: (None, peak MB): timed later, in rounds."""
    leaves = _leaves(inputs)

    def run():
        for t in leaves:
            t.grad = None
        step(*leaves)

    if device.type == "cuda":
        return measure_cuda(run)
    step(*_leaves(inputs))  # warm-up (compilation) outside the profiled run
    return None, cpu_peak_bytes(run) / 2**20


def head_results(cfg: BenchConfig, device: torch.device) -> tuple[list[Result], int]:
    """The head part: every variant of `variants` on the same inputs; (results, masked rows)."""
    padded = make_inputs(cfg, device)
    unpadded = (padded[0], padded[1][: cfg.vocab], padded[2][: cfg.vocab], padded[3])
    n_masked = int((padded[3] != IGNORE_INDEX).sum())
    results: list[Result] = []
    runnable: dict[str, tuple[Callable, tuple]] = {}
    for name, step in variants(cfg, device).items():
        ours = name.startswith("ours")
        if isinstance(step, str):
            status = "failed" if ours and device.type == "cuda" else "skipped"
            results.append(Result(name, status, note=step, ours=ours))
            print(
                f"{name:20s} {step}" if status == "skipped" else f"{name:20s} failed: {step}",
                flush=True,
            )
            continue
        inputs = padded if ours else unpadded
        try:  # the first call is the warm-up (and torch.compile's compilation)
            ms, mb = measure_head_variant(step, inputs, device)
        except Exception as exc:  # noqa: BLE001  (report it, measure the others)
            results.append(Result(name, "failed", note=_error_note(exc), ours=ours))
            print(f"{name:20s} failed: {_error_note(exc)}", flush=True)
            continue
        results.append(Result(name, "ok", ms, mb, ours=ours))
        runnable[name] = (step, inputs)
        print(f"{name:20s} peak {mb:10.1f} MB", flush=True)
    if device.type == "cpu":
        times = time_cpu_rounds(runnable, cfg.repeat)
        for r in results:
            if r.name in times:
                r.time_ms = statistics.median(times[r.name])
                r.extra["min_ms"] = round(min(times[r.name]), 1)
                r.extra["all_ms"] = [round(t, 1) for t in times[r.name]]
    base = next(r for r in results if r.name == "hf_all_positions")
    for r in results:
        if r.status == "ok" and base.status == "ok":
            r.extra["speedup_vs_hf"] = round(base.time_ms / r.time_ms, 2)
            r.extra["memory_ratio_vs_hf"] = round(base.peak_mb / max(r.peak_mb, 1e-9), 2)
    return results, n_masked


def interpreter_check() -> str:
    """Small correctness pass of the Triton kernel on CPU (TRITON_INTERPRET=1) vs impl='torch'."""
    why = triton_unavailable(torch.device("cpu"))
    if why is not None:
        return f"skipped: {why}"
    g = torch.Generator().manual_seed(1)
    h = torch.randn(48, 64, generator=g)
    w = torch.randn(30528, 64, generator=g) * 0.05
    b = torch.randn(30528, generator=g) * 0.01
    y = torch.randint(0, 30522, (48,), generator=g)
    y[::3] = IGNORE_INDEX
    got = []
    for impl in ("torch", "triton"):
        leaves = _leaves((h, w, b))
        try:
            out = api.masked_lm_loss(*leaves, y, vocab_size=30522, impl=impl)
            out.loss.backward()
        except Exception as exc:  # noqa: BLE001  (a result of ours: reported, fails the command)
            return f"FAILED: impl={impl!r}: {_error_note(exc)}"
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
    """Horizontal bars of time and peak memory per measured variant, written atomically."""
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
        ax.bar_label(bars, fmt="%.1f")
        ax.set_xlabel(label)
        ax.margins(x=0.15)
        ax.invert_yaxis()
    axes[1].set_yticklabels([])
    fig.suptitle(title)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    plt.close(fig)
    write_bytes_atomic(path, png.getbuffer())


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name()
    return f"CPU ({platform.machine()}, {torch.get_num_threads()} threads)"


def resolve(cfg: BenchConfig, device: torch.device) -> None:
    """Fill the device-dependent defaults (batch, dtype) in place; reject a bad dtype."""
    if cfg.dtype == "auto":
        cfg.dtype = "bfloat16" if device.type == "cuda" else "float32"
    if not isinstance(getattr(torch, cfg.dtype, None), torch.dtype):
        raise SystemExit(f"--dtype: {cfg.dtype!r} is not a torch dtype (float32, bfloat16, ...)")
    if not cfg.batch:
        cfg.batch = 256 if device.type == "cuda" else 32


def run(cfg: BenchConfig) -> dict:
    """Measure the parts `cfg` asks for; print the table; write the JSON and the plot."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolve(cfg, device)
    grid = sweep_grid(cfg.sweep_rows, cfg.sweep_vocabs, cfg.sweep_dtypes) if cfg.sweep else []
    results, n_masked = head_results(cfg, device) if cfg.head else ([], 0)
    for point in grid:
        results += loss_only(*point, device=device, compile_=cfg.compile, repeat=cfg.repeat)
    cpu = device.type == "cpu"
    report = {
        "config": asdict(cfg),
        "n_positions": cfg.batch * cfg.seq if cfg.head else 0,
        "n_masked": n_masked,
        "device": device_name(device),
        "hbm_peak_GBps": hbm_peak_gbps(device_name(device)) if not cpu else None,
        "torch": torch.__version__,
        "timing": f"time.perf_counter, median of {cfg.repeat} runs after 1 warm-up"
        if cpu
        else "triton.testing.do_bench median",
        "memory": "torch.profiler(profile_memory=True): max 'Total Allocated' of the CPU allocator "
        "during one fwd+bwd, above its level at the start (inputs and parameters excluded, "
        "gradients included)"
        if cpu
        else "torch.cuda.max_memory_allocated above start",
        "interpreter_check": interpreter_check()
        if cpu and cfg.head
        else "not run (the kernel runs on CUDA here)"
        if not cpu
        else "not run (--no-head)",
        "fp16_gradient_underflow": fp16_underflow_check(cfg.vocab),
        "results": [asdict(r) for r in results],
        "failed_ours": [r.name for r in results if r.ours and r.status == "failed"],
    }
    if report["interpreter_check"].startswith(("FAILED", "MISMATCH")):
        report["failed_ours"].append("interpreter_check")
    print_table(report)
    write_outputs(report, results, Path(cfg.out), cfg)
    return report


def write_outputs(report: dict, results: list[Result], out: Path, cfg: BenchConfig) -> None:
    """bench_kernels.json (atomically) and bench_kernels.png (the head part's measured rows)."""
    out.mkdir(parents=True, exist_ok=True)
    write_results(out / "bench_kernels.json", report, run=out, indent=2)
    measured = [r for r in results if r.status == "ok" and not r.name.startswith("loss_only")]
    if measured:
        plot(
            measured,
            out / "bench_kernels.png",
            f"MLM head+loss fwd+bwd, {cfg.batch}x{cfg.seq} positions, {report['n_masked']} "
            f"masked, H={cfg.hidden}, V={cfg.vocab}, {cfg.dtype}, {report['device']}",
        )
    print(f"wrote {out / 'bench_kernels.json'}" + (" and bench_kernels.png" if measured else ""))


def _fmt(value: float | None, width: int, digits: int = 1) -> str:
    return f"{'-':>{width}s}" if value is None else f"{value:{width}.{digits}f}"


def print_table(report: dict) -> None:
    print(
        f"\n{report['n_positions']} positions, {report['n_masked']} masked, "
        f"device {report['device']}"
    )
    print(
        f"{'variant':50s} {'status':>7s} {'ms':>9s} {'peak MB':>9s} {'speedup':>8s} "
        f"{'mem x':>7s}  notes"
    )
    for r in report["results"]:
        e = r["extra"]
        extra = " ".join(
            f"{k}={v}"
            for k, v in e.items()
            if k not in ("speedup_vs_hf", "memory_ratio_vs_hf", "all_ms")
        )
        print(
            f"{r['name']:50s} {r['status']:>7s} {_fmt(r['time_ms'], 9, 3)} "
            f"{_fmt(r['peak_mb'], 9)} {_fmt(e.get('speedup_vs_hf'), 8, 2)} "
            f"{_fmt(e.get('memory_ratio_vs_hf'), 7, 2)}  {r['note']} {extra}"
        )
    print(f"interpreter check: {report['interpreter_check']}")
    for k, v in report["fp16_gradient_underflow"].items():
        print(
            f"fp16 logit gradient, {k}: {100 * v['zeroed_fraction']:.1f}% of entries flushed "
            f"to 0, relative L2 error {v['rel_l2_error']:.2e}"
        )


def build_parser(prog: str) -> argparse.ArgumentParser:
    """One flag per BenchConfig field; booleans get --NAME and --no-NAME."""
    p = ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    helps = field_help(BenchConfig)
    for f in BenchConfig.__dataclass_fields__.values():
        text = helps.get(f.name, "").replace("%", "%%")
        if f.type in ("bool", bool):
            p.add_argument(
                f"--{f.name}",
                action=argparse.BooleanOptionalAction,
                default=f.default,
                help=f"{text} (default: {'on' if f.default else 'off'})",
            )
        else:
            p.add_argument(
                f"--{f.name}",
                type=type(f.default),
                default=f.default,
                help=f"{text} (default: {f.default})",
            )
    return p


def main(argv: list[str] | None = None, prog: str = "python -m benchmarks.kernels.speed") -> int:
    """Parse, run, and return the exit status (1 when a variant of ours failed)."""
    args = build_parser(prog).parse_args(argv)
    if not (args.head or args.sweep):
        raise SystemExit("nothing to measure: --no-head without --sweep")
    report = run(BenchConfig(**vars(args)))
    if report["failed_ours"]:
        log.error(f"FAILED: {', '.join(report['failed_ours'])}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
