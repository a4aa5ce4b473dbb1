"""How benchmarks.kernels.speed measures one variant: a Result row (ok, skipped or failed,
never NaN), peak memory and median time on CUDA or on the CPU, and what is available here.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from benchmarks.kernels.cuda import measure_cuda
from bertforge.kernels import api


@dataclass
class Result:
    """One variant's measurement; time and memory are None unless status == "ok"."""

    name: str
    status: str  # "ok", "skipped" or "failed"
    time_ms: float | None = None  # median fwd+bwd
    peak_mb: float | None = None  # peak bytes allocated during one fwd+bwd above the start
    note: str = ""
    ours: bool = False  # a failure of ours fails the command
    extra: dict = field(default_factory=dict)


def _error_note(exc: BaseException) -> str:
    first = (str(exc).splitlines() or [""])[0][:160]
    return f"{type(exc).__name__}: {first}"


def triton_unavailable(device: torch.device) -> str | None:
    """Why ours_triton cannot run on `device` here (None when it can)."""
    if not api._triton_available():
        return f"triton cannot be imported ({api._TRITON_ERROR})"
    from bertforge.kernels.triton_ce import interpreting

    if device.type == "cpu" and not interpreting():
        return "needs CUDA, or TRITON_INTERPRET=1 set before Python starts"
    return None


def liger_loss() -> Callable | str:
    """Liger-Kernel's cross-entropy module, or why it is not available."""
    try:
        from liger_kernel.transformers import LigerCrossEntropyLoss
    except ImportError as exc:
        return f"skipped: liger-kernel not importable ({_error_note(exc)})"
    return LigerCrossEntropyLoss()


def _leaves(tensors):
    return [t.detach().clone().requires_grad_(t.is_floating_point()) for t in tensors]


def cpu_peak_bytes(run: Callable[[], None]) -> int:
    """Peak CPU bytes allocated during run() above the level at its start (profiler trace)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
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
    # The start level is itself a point of the run: a run whose first events free memory (a
    # cached buffer released) peaks there, at 0 above the start, not below it.
    return max(start, *(m["Total Allocated"] for m in mem)) - start


def measure_cpu(run: Callable[[], None], repeat: int) -> tuple[float, float]:
    """(median ms of `repeat` runs, peak MB of one run) after one warm-up run."""
    run()  # warm-up (and torch.compile's compilation)
    mb = cpu_peak_bytes(run) / 2**20
    times = []
    for _ in range(max(repeat, 1)):
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), mb


def measure(run: Callable[[], None], device: torch.device, repeat: int) -> tuple[float, float]:
    """(median ms, peak MB above the start) of run() on `device`."""
    return measure_cuda(run) if device.type == "cuda" else measure_cpu(run, repeat)
