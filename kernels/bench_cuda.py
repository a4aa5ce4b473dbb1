"""The CUDA half of `python -m kernels.bench`: time, peak memory and HBM bandwidth of the loss.

Imported only when a GPU is present (kernels.bench does it lazily).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from . import api

# HBM bandwidth in GB/s by device-name substring (vendor data sheets); first match wins.
HBM_PEAK_GBPS = [
    ("GH200", 4000.0),
    ("H200", 4800.0),
    ("H100 NVL", 3900.0),
    ("H100 PCIe", 2000.0),
    ("H100", 3350.0),
    ("A100-SXM4-80GB", 2039.0),
    ("A100 80GB PCIe", 1935.0),
    ("A100", 1555.0),
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


def loss_only(
    n_masked: int,
    width: int,
    vocab: int,
    dtype_name: str,
    compile_: bool = True,
    device: str = "cuda",
) -> list[dict]:
    """Softmax-CE fwd+bwd on [n_masked x width] logits (true vocab `vocab`): torch eager, compiled,
    Liger, ours; each as a dict of kernels.bench.Result fields with GB/s vs the HBM peak."""
    from . import triton_ce

    dev = torch.device(device)
    dtype = getattr(torch, dtype_name)
    padded = f"/{vocab}" if vocab != width else ""
    tag = f"loss_only[{n_masked}x{width}{padded},{dtype_name}]"
    logits = torch.randn(n_masked, width, device=dev, dtype=dtype)
    labels = torch.randint(0, vocab, (n_masked,), device=dev)
    nbytes_min = 2 * logits.numel() * logits.element_size()  # read logits once, write grad once
    peak = hbm_peak_gbps(torch.cuda.get_device_name())
    # Baselines see the true-vocabulary columns only (a view when the logits are padded).
    cands: dict[str, Callable] = {
        "torch_eager": lambda x: F.cross_entropy(x[:, :vocab], labels),
        "ours_softmax_cross_entropy": lambda x: api.softmax_cross_entropy(
            x, labels, vocab_size=vocab, impl="triton"
        ),
    }
    if compile_:
        cands["torch_compile"] = torch.compile(lambda x: F.cross_entropy(x[:, :vocab], labels))
    try:
        from liger_kernel.transformers import LigerCrossEntropyLoss

        liger = LigerCrossEntropyLoss()
        cands["liger"] = lambda x: liger(x[:, :vocab].contiguous() if vocab != width else x, labels)
    except ImportError:
        pass

    results = []
    for name, fn in cands.items():
        x = logits.clone().requires_grad_()

        def run(fn=fn, x=x):
            x.grad = None
            fn(x).backward()

        ms, mb = measure_cuda(run)
        results.append({"name": f"{tag}/{name}", "time_ms": ms, "peak_mb": mb, "extra": {}})
        del x
    # The kernel pair as masked_lm_loss runs it: forward (lse saved), backward in place.
    buf = logits.clone()

    def kernel_pair():  # values drift (they become gradients) but stay finite; timing is the point
        loss, lse, _ = triton_ce.ce_forward(buf, labels, -100, vocab)
        triton_ce.ce_backward(buf, labels, lse, torch.ones_like(loss), buf, -100, vocab)

    ms, mb = measure_cuda(kernel_pair)
    results.append(
        {
            "name": f"{tag}/ours_kernels_inplace",
            "time_ms": ms,
            "peak_mb": mb,
            "note": "3 passes: fwd read, bwd read + write in place",
            "extra": {},
        }
    )
    for r in results:
        gbps = nbytes_min / r["time_ms"] / 1e6
        r["extra"]["GBps_min_bytes"] = round(gbps, 1)
        if r["name"].endswith("inplace"):
            r["extra"]["GBps_moved"] = round(1.5 * gbps, 1)
        if peak:
            r["extra"]["frac_hbm_min_bytes"] = round(gbps / peak, 3)
            if "GBps_moved" in r["extra"]:
                r["extra"]["frac_hbm_moved"] = round(1.5 * gbps / peak, 3)
    return results
