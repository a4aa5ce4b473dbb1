"""The CUDA half of benchmarks.kernels.speed: device HBM peaks and the do_bench measurement.

The one table of HBM bandwidth in the project (pretrain/components/metrics.py holds the compute
peaks).
Importing this module needs neither a GPU nor triton; `measure_cuda` needs both.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# HBM bandwidth in GB/s by CUDA device-name substring (vendor data sheets); first match wins, so
# the more specific names come first ("NVIDIA H100 PCIe" before "H100").
HBM_PEAK_GBPS = [
    ("GH200", 4000.0),
    ("H200", 4800.0),
    ("H100 NVL", 3900.0),
    ("H100 PCIe", 2000.0),
    ("H100", 3350.0),  # SXM5, "NVIDIA H100 80GB HBM3"
    ("A100-SXM4-80GB", 2039.0),
    ("A100 80GB PCIe", 1935.0),
    ("A100", 1555.0),  # 40 GB SXM4 / PCIe
    ("L40S", 864.0),
    ("A10", 600.0),
]


def hbm_peak_gbps(name: str) -> float | None:
    """Data-sheet HBM bandwidth of the device called `name` (GB/s), None when unknown."""
    for key, gbps in HBM_PEAK_GBPS:
        if key in name:
            return gbps
    return None


def measure_cuda(run: Callable[[], None]) -> tuple[float, float]:
    """(median ms via triton.testing.do_bench, peak MB allocated above the level at the start)."""
    import triton.testing

    run()  # warm-up: compilation, autotuning, allocator
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    run()
    torch.cuda.synchronize()
    mb = (torch.cuda.max_memory_allocated() - base) / 2**20
    return float(triton.testing.do_bench(run, return_mode="median")), mb
