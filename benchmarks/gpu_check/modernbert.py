"""The GPU check's ModernBERT part: ``pretrain/main.py --arch modernbert --model modernbert-base``
on one GPU (ZeRO-2, bf16) at sequence 1024 and 8192, on shards built at those lengths: tokens/s,
TFLOP/s and MFU (from the model's ``flops_per_token``, which counts a local layer's window, not
the whole sequence), peak memory, and the attention the run used.

The trainer picks ModernBERT's attention path itself (document attention by default; the kernel
behind it depends on the device and the installed packages), so the part only reports it: the
mode from the run's config.json and, when the trainer's log names the path, that line.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from benchmarks.gpu_check.common import PartResult, Plan
from benchmarks.gpu_check.train import run_matrix


def path_line() -> re.Pattern:
    """The trainer's log line naming the attention path it chose (padded / unpadded varlen).
    Imported here, not at the top: the module imports torch and transformers (~7 s of CPU), and
    every part's process imports this one."""
    from bertforge.pretrain.model.attention_paths import PATH_LOG_PREFIX

    return re.compile(re.escape(PATH_LOG_PREFIX) + r"([^\n]*)")


def attention_used(run_dir: Path) -> dict:
    """The attention mode the trainer resolved (config.json) and the path its log names."""
    config = json.loads((run_dir / "config.json").read_text())
    found = None
    log = run_dir.parents[1] / "logs" / f"modernbert.{run_dir.name}.log"  # run_matrix's log
    if log.is_file():
        found = path_line().search(log.read_text(errors="replace"))
    return {
        "attention": config["model_cfg"]["attention"],
        "attention path": found.group(1).strip()[:120] if found else "not logged",
    }


def part_modernbert(plan: Plan, out: Path, res: PartResult, deadline: float) -> None:
    """Each --arch modernbert configuration of the plan in turn, a throughput row each."""
    run_matrix(
        plan, out, res, deadline, "modernbert", plan.modernbert, attention_used, arch="modernbert"
    )
    res.details["flops"] = "model.flops_per_token: local layers count their window only"
