"""The sweep part of benchmarks.kernels.speed: softmax-CE forward + backward on [N_m x V]
logits, torch eager / torch.compile / Liger / ours, as GB/s and as a fraction of the HBM peak.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from benchmarks.kernels.cuda import hbm_peak_gbps
from benchmarks.kernels.measure import (
    Result,
    _error_note,
    liger_loss,
    measure,
    triton_unavailable,
)
from bertforge.kernels import api
from bertforge.kernels.constants import IGNORE_INDEX


def sweep_grid(rows_arg: str, vocabs_arg: str, dtypes_arg: str) -> list[tuple[int, int, int, str]]:
    """(n_masked, width, vocab, dtype) for every point of the sweep, from the three flags
    (e.g. "4915,19661", "30522,30528/30522", "bfloat16,float16")."""
    try:
        rows = [int(n) for n in rows_arg.split(",")]
        widths = []
        for item in vocabs_arg.split(","):
            width, _, vocab = item.partition("/")
            widths.append((int(width), int(vocab or width)))
    except ValueError as exc:
        raise SystemExit(
            f"--sweep_rows must be like 4915,19661 and --sweep_vocabs like "
            f"30522,30528/30522 (WIDTH or WIDTH/VOCAB): {exc}"
        ) from None
    dtypes = dtypes_arg.split(",")
    for d in dtypes:
        if not isinstance(getattr(torch, d, None), torch.dtype):
            raise SystemExit(f"--sweep_dtypes: {d!r} is not a torch dtype (e.g. bfloat16,float16)")
    return [(n, w, v, d) for n in rows for (w, v) in widths for d in dtypes]


@functools.cache
def compiled_cross_entropy() -> Callable:
    """One torch.compile'd CE for every sweep point: after the first shape, automatic dynamic
    shapes reuse its graph instead of compiling again for each (N_m, V), which would take most of
    a sweep's time."""

    def cross_entropy(x: torch.Tensor, labels: torch.Tensor, vocab: int) -> torch.Tensor:
        return F.cross_entropy(x[:, :vocab], labels)

    return torch.compile(cross_entropy)


def loss_only_candidates(
    labels: torch.Tensor, vocab: int, width: int, device: torch.device, compile_: bool
) -> dict[str, Callable | str]:
    """name -> loss(logits) for the sweep, or why the variant is skipped."""
    cands: dict[str, Callable | str] = {
        # Baselines see the true-vocabulary columns only (a view when the logits are padded).
        "torch_eager": lambda x: F.cross_entropy(x[:, :vocab], labels),
        "torch_compile": "skipped (--no-compile)",
    }
    if compile_:
        compiled = compiled_cross_entropy()
        cands["torch_compile"] = lambda x: compiled(x, labels, vocab)
    liger = liger_loss()
    if isinstance(liger, str) or device.type != "cuda":
        cands["liger"] = liger if isinstance(liger, str) else "skipped: Liger needs CUDA"
    else:
        cands["liger"] = lambda x: liger(x[:, :vocab].contiguous() if vocab != width else x, labels)
    why = triton_unavailable(device)
    cands["ours_softmax_cross_entropy"] = (
        (lambda x: api.softmax_cross_entropy(x, labels, vocab_size=vocab, impl="triton"))
        if why is None
        else f"skipped: {why}"
    )
    return cands


def loss_only(
    n_masked: int,
    width: int,
    vocab: int,
    dtype_name: str,
    device: torch.device,
    compile_: bool = True,
    repeat: int = 5,
) -> list[Result]:
    """Softmax-CE fwd+bwd on [n_masked x width] logits (true vocab `vocab`): torch eager, compiled,
    Liger, ours (softmax_cross_entropy, and the in-place kernel pair masked_lm_loss runs); each
    with GB/s for the minimum traffic and, on a known GPU, its fraction of the HBM peak."""
    dtype = getattr(torch, dtype_name)
    tag = f"loss_only[{n_masked}x{width}{f'/{vocab}' if vocab != width else ''},{dtype_name}]"
    g = torch.Generator().manual_seed(n_masked + width)
    logits = torch.randn(n_masked, width, generator=g).to(device, dtype)
    labels = torch.randint(0, vocab, (n_masked,), generator=g).to(device)
    results = []
    for name, fn in loss_only_candidates(labels, vocab, width, device, compile_).items():
        ours = name.startswith("ours")
        if isinstance(fn, str):
            status = "failed" if ours and device.type == "cuda" else "skipped"
            results.append(Result(f"{tag}/{name}", status, note=fn, ours=ours))
            continue
        x = logits.clone().requires_grad_()

        def run(fn=fn, x=x):
            x.grad = None
            fn(x).backward()

        results.append(_measured(f"{tag}/{name}", run, device, repeat, ours))
        del x
    if triton_unavailable(device) is None:
        results.append(_kernel_pair(tag, logits, labels, vocab, device, repeat))
    nbytes_min = 2 * logits.numel() * logits.element_size()  # read logits once, write grad once
    _add_bandwidth(results, nbytes_min, device)
    return results


def _measured(
    name: str, run: Callable[[], None], device: torch.device, repeat: int, ours: bool
) -> Result:
    try:
        ms, mb = measure(run, device, repeat)
    except Exception as exc:  # noqa: BLE001  (report it, measure the others)
        return Result(name, "failed", note=_error_note(exc), ours=ours)
    return Result(name, "ok", ms, mb, ours=ours)


def _kernel_pair(
    tag: str,
    logits: torch.Tensor,
    labels: torch.Tensor,
    vocab: int,
    device: torch.device,
    repeat: int,
) -> Result:
    """The kernel pair as masked_lm_loss runs it: forward (lse saved), backward in place."""
    from bertforge.kernels import triton_ce

    buf = logits.clone()

    def kernel_pair():  # values drift (they become gradients) but stay finite; timing is the point
        loss, lse, _ = triton_ce.ce_forward(buf, labels, IGNORE_INDEX, vocab)
        triton_ce.ce_backward(buf, labels, lse, torch.ones_like(loss), buf, IGNORE_INDEX, vocab)

    r = _measured(f"{tag}/ours_kernels_inplace", kernel_pair, device, repeat, True)
    r.note = "3 passes: fwd read, bwd read + write in place"
    return r


def _add_bandwidth(results: list[Result], nbytes_min: int, device: torch.device) -> None:
    """GB/s on the minimum bytes (and on the 1.5x the in-place pair moves), as HBM fractions."""
    peak = hbm_peak_gbps(torch.cuda.get_device_name()) if device.type == "cuda" else None
    for r in results:
        if r.status != "ok":
            continue
        gbps = nbytes_min / r.time_ms / 1e6
        r.extra["GBps_min_bytes"] = round(gbps, 1)
        if r.name.endswith("inplace"):
            r.extra["GBps_moved"] = round(1.5 * gbps, 1)
        if peak:
            r.extra["frac_hbm_min_bytes"] = round(gbps / peak, 3)
            if "GBps_moved" in r.extra:
                r.extra["frac_hbm_moved"] = round(1.5 * gbps / peak, 3)
