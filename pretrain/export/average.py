"""Checkpoint averaging for export: ``bertforge export RUN --average last:K`` (or
``--average 100,200,300``, steps) exports the element-wise mean of those checkpoints' weights.

The last checkpoints of a stable or decay phase average into a model that is usually better than
any one of them (mmBERT merges its decay checkpoints). Each checkpoint is consolidated from its
ZeRO-2/3 shards (:func:`~pretrain.run_folder.run_checkpoints.consolidated_state_dict`) one at a
time and added into a running fp32 sum, so memory stays at about two models: the sum and the one
being added. Checkpoints of another architecture or vocabulary (other keys or shapes, another
tokenizer) are refused, naming the two checkpoints and the first key that differs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from bertforge.errors import UserError
from bertforge.pretrain.run_folder.layout import RunFolder
from bertforge.pretrain.run_folder.run_checkpoints import (
    consolidated_state_dict,
    describe_problems,
    list_complete,
    read_state,
    verify,
)


class AverageError(UserError, ValueError):
    """An --average that names no usable checkpoints, or checkpoints that cannot be averaged."""


def parse_average(spec: str) -> int | list[int]:
    """``last:K`` -> K; ``100,200,300`` -> [100, 200, 300] (steps, each once)."""
    m = re.fullmatch(r"last:(\d+)", spec.strip())
    if m:
        k = int(m.group(1))
        if k < 1:
            raise AverageError(f"--average {spec}: K must be at least 1")
        return k
    try:
        steps = [int(s) for s in spec.split(",") if s.strip()]
    except ValueError:
        steps = []
    if not steps or len(set(steps)) != len(steps):
        raise AverageError(
            f"--average {spec!r}: give last:K (the newest K checkpoints) or steps once each, "
            "comma-separated (100,200,300)"
        )
    return steps


def select_checkpoints(run: Path, spec: str) -> list[tuple[int, Path]]:
    """(step, folder) of the complete, verified checkpoints ``spec`` names, oldest first."""
    root = RunFolder(run).checkpoints
    good = [(step, p) for step, p in list_complete(root) if not verify(p)]
    have = ", ".join(str(s) for s, _ in good) or "none"
    wanted = parse_average(spec)
    if isinstance(wanted, int):
        if len(good) < wanted:
            raise AverageError(
                f"--average {spec}: {root} holds {len(good)} complete checkpoint(s) that verify "
                f"(steps {have}); average fewer, or keep more while training (--keep_last)"
            )
        return good[-wanted:]
    by_step = dict(good)
    for step in wanted:
        if step not in by_step:
            folder = root / f"step_{step:08d}"
            why = describe_problems(verify(folder)) if folder.is_dir() else "no such checkpoint"
            raise AverageError(
                f"--average: step {step} of {root} cannot be averaged ({why}); complete "
                f"checkpoints that verify: steps {have}"
            )
    return sorted((step, by_step[step]) for step in wanted)


def _first_difference(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """The first key (in sorted order) missing from one dict or of another shape/dtype kind."""
    for key in sorted(set(a) | set(b)):
        if key not in a or key not in b:
            return f"{key} (only in the {'first' if key in a else 'second'})"
        x, y = a[key], b[key]
        if x.shape != y.shape or x.is_floating_point() != y.is_floating_point():
            return f"{key} (shape {tuple(x.shape)} vs {tuple(y.shape)})"
    return None


def _check_same_tokenizer(first: Path, other: Path) -> None:
    """Refuse checkpoints trained on another tokenizer of the same size (same shapes, other
    meaning of each row)."""
    a, b = (
        read_state(first).get("tokenizer_fingerprint"),
        read_state(other).get("tokenizer_fingerprint"),
    )
    if a != b:
        raise AverageError(
            f"--average: {first} and {other} were trained with different tokenizers "
            f"(fingerprint {a} vs {b}); average checkpoints of one run"
        )


def average_checkpoints(ckpts: list[Path]) -> dict[str, torch.Tensor]:
    """The element-wise mean of the consolidated weights of ``ckpts``: a running fp32 sum divided
    by their number once at the end. Non-float entries (integer buffers) must be equal in all
    and are kept. An AverageError names the two checkpoints and the first key that differs."""
    first = ckpts[0]
    total: dict[str, torch.Tensor] = {}
    for ckpt in ckpts:
        sd = consolidated_state_dict(ckpt)
        if not total:  # copies, so that tied weights (one tensor, two keys) are summed once each
            total = {
                k: v.detach().to(torch.float32).clone() if v.is_floating_point() else v.clone()
                for k, v in sd.items()
            }
            continue
        diff = _first_difference(total, sd)
        if diff is not None:
            raise AverageError(
                f"--average: {first} and {ckpt} do not hold the same weights (first difference: "
                f"{diff}): another architecture or vocabulary; average checkpoints of one run"
            )
        _check_same_tokenizer(first, ckpt)
        for k, v in sd.items():
            if v.is_floating_point():
                total[k].add_(v.detach().to(torch.float32))
            elif not torch.equal(total[k], v):
                raise AverageError(
                    f"--average: {first} and {ckpt} differ in the buffer {k}, which cannot be "
                    "averaged; average checkpoints of one run"
                )
        del sd  # one loaded checkpoint at a time beside the sum
    for v in total.values():
        if v.is_floating_point():
            v.div_(len(ckpts))
    return total
