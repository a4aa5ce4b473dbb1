"""Training metrics: console progress (rank 0), RUN/metrics.jsonl (one object per step), and
DeepSpeed's monitor (whichever of TensorBoard, CSV, Weights & Biases, Comet the config enables).

All values are computed by the caller; this module times the step, derives rates (tokens/s,
TFLOPs, MFU), and writes. Only rank 0 writes anything. The console shows a tqdm bar when stderr
is a terminal and one plain line per ``log_interval`` steps (or per ``progress_interval_s``
seconds) otherwise (see :mod:`data_prep.progress`); what those lines say of a record is
:mod:`.console`'s. A resumed launch writes a ``"split": "resume"`` record. The monitor gets
``Train/<key>`` (every numeric key of the step record, masking statistics ``mask_*`` included)
by samples, ``Validation/[<source>/]<metric>`` by samples and ``Downstream/<task>/<metric>`` by
step.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import torch

from bertforge.data_prep.progress import Progress
from bertforge.files import write_text_atomic
from bertforge.logs import format_line
from bertforge.pretrain.components.console import progress_fields, validation_line
from bertforge.pretrain.run_folder.layout import RunFolder
from bertforge.pretrain.stability.guard import outcome

# Dense peak throughput by device name substring (TFLOPs, bf16/fp16 tensor cores), for MFU.
# The first key found in the name wins: specific variants come before their family's name.
_PEAK_TFLOPS = {
    "H100 PCIe": 756.0,
    "H100 NVL": 835.0,
    "H200": 989.0,
    "H100": 989.0,
    "A100": 312.0,
    "A10G": 125.0,
    "L40S": 362.0,
    "L40": 181.0,
    "L4": 121.0,
    "V100": 125.0,
    "T4": 65.0,
    "A6000": 155.0,
    "4090": 165.0,
}


def peak_tflops_for(device_name: str, precision: str) -> float | None:
    """Dense bf16/fp16 peak of the device called ``device_name``, or None when unknown or fp32."""
    for key, peak in _PEAK_TFLOPS.items():
        if key in device_name:
            return peak if precision in ("bf16", "fp16") else None  # fp32 peaks vary (TF32)
    return None


def device_peak_tflops(precision: str) -> float | None:
    """Peak dense TFLOPs of this device at ``precision``, or None when unknown (CPUs)."""
    if not torch.cuda.is_available():
        return None
    return peak_tflops_for(torch.cuda.get_device_name(), precision)


def memory_stats() -> dict[str, float]:
    """Accelerator memory in GiB (allocated, peak) or the process RSS on CPU."""
    if torch.cuda.is_available():
        return {
            "mem_alloc_gib": torch.cuda.memory_allocated() / 2**30,
            "mem_peak_gib": torch.cuda.max_memory_allocated() / 2**30,
        }
    try:
        # Lazy and guarded: metrics go on without psutil (the except below).
        import psutil

        return {"mem_rss_gib": psutil.Process(os.getpid()).memory_info().rss / 2**30}
    except ImportError:  # psutil is a dependency; keep metrics working without it anyway
        return {}


class StepTimer:
    """Wall time of an optimizer step and the part of it spent waiting for the data loader."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.data_wait = 0.0

    def restart(self) -> None:
        self.start = time.perf_counter()
        self.data_wait = 0.0

    def waited(self, seconds: float) -> None:
        self.data_wait += seconds

    def elapsed(self) -> float:
        return time.perf_counter() - self.start


class MetricsWriter:
    """Writes one JSON object per optimizer step; console and TensorBoard every ``log_interval``."""

    def __init__(
        self,
        output_dir: str | os.PathLike,
        *,
        rank: int,
        max_steps: int,
        start_step: int,
        log_interval: int,
        flops_per_token: float | None,
        peak_tflops: float | None,
        world_size: int,
        monitor: Any = None,
        progress: str | bool = "auto",
        progress_interval_s: float = 0.0,
        loss_scaling: bool = False,
    ) -> None:
        self.rank = rank
        self.log_interval = max(1, log_interval)
        self.flops_per_token = flops_per_token
        self.peak_tflops = peak_tflops
        self.world_size = world_size
        self.monitor = monitor
        self.loss_scaling = loss_scaling
        self._file = None
        self._bar = None
        if rank != 0:
            return
        path = RunFolder(output_dir).metrics
        path.parent.mkdir(parents=True, exist_ok=True)
        if start_step > 0 and path.exists():
            _truncate_after(
                path, start_step
            )  # a resumed run rewrites the steps after its checkpoint
        elif start_step == 0 and path.exists():
            path.unlink()
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open for the whole run
        self._bar = Progress(
            max_steps,
            desc="train",
            unit="step",
            mode=progress,
            initial=start_step,
            every_steps=self.log_interval,
            every_s=progress_interval_s,
        )

    def step(self, record: dict[str, Any], seconds: float, global_samples: int) -> dict[str, Any]:
        """Add rates to ``record`` (needs tokens, masked, samples), write it, return it."""
        if self.rank != 0:
            return record
        secs = max(seconds, 1e-9)
        record["step_time_s"] = seconds
        record["tokens_per_s"] = record["tokens"] / secs
        record["masked_tokens_per_s"] = record["masked"] / secs
        record["samples_per_s"] = record["samples"] / secs
        if self.flops_per_token:
            tflops = self.flops_per_token * record["tokens"] / secs / 1e12
            record["tflops"] = tflops
            record["tflops_per_device"] = tflops / self.world_size
            if self.peak_tflops:
                record["mfu"] = tflops / self.world_size / self.peak_tflops
        record.update(memory_stats())
        self._file.write(json.dumps(_finite(record)) + "\n")
        self._file.flush()
        step = record["step"]
        if self._bar is not None:
            self._bar.update(1, **progress_fields(record, self.loss_scaling))
        if (
            self.monitor is not None
            and getattr(self.monitor, "enabled", False)
            and step % self.log_interval == 0
        ):
            events = [
                (f"Train/{k}", float(v), global_samples)
                for k, v in record.items()
                if isinstance(v, (int, float))
                and not isinstance(v, bool)
                and k != "step"
                and math.isfinite(float(v))
            ]
            self.monitor.write_events(events)
        return record

    def eval(self, record: dict[str, Any], global_samples: int) -> None:
        """Write a validation record (``"split": "validation"``, with ``"source"`` for one source
        of a mixture) to metrics.jsonl and TensorBoard (``Validation/[source/]loss`` ...)."""
        if self.rank != 0:
            return
        self._file.write(json.dumps(_finite(record)) + "\n")
        self._file.flush()
        source = record.get("source")
        self.print(validation_line(record))
        if self.monitor is not None and getattr(self.monitor, "enabled", False):
            prefix = f"Validation/{source}" if source else "Validation"
            self.monitor.write_events(
                [
                    (f"{prefix}/{k.removeprefix('val_')}", float(v), global_samples)
                    for k, v in record.items()
                    if k.startswith("val_") and math.isfinite(float(v))
                ]
            )

    def resumed(self, step: int, checkpoint: str, elapsed_s: float) -> None:
        """Write a ``"split": "resume"`` record: this launch continues from ``checkpoint``, saved
        after ``step`` at ``elapsed_s`` of training time, on ``world_size`` ranks (the plots
        mark the step)."""
        if self.rank != 0:
            return
        record = {
            "step": step,
            "split": "resume",
            "checkpoint": checkpoint,
            "elapsed_s": elapsed_s,
            "world_size": self.world_size,
        }
        self._file.write(json.dumps(_finite(record)) + "\n")
        self._file.flush()

    def downstream(self, record: dict[str, Any]) -> None:
        """Write a ``"split": "downstream"`` record (task, metric, value at a checkpoint's step)
        to metrics.jsonl, the console and TensorBoard (``Downstream/<task>/<metric>``, by step)."""
        if self.rank != 0:
            return
        self._file.write(json.dumps(_finite(record)) + "\n")
        self._file.flush()
        self.print(
            f"downstream step {record['step']}: {record['task']} {record['metric']} "
            f"{record['value']:.4f}"
        )
        if self.monitor is not None and getattr(self.monitor, "enabled", False):
            self.monitor.write_events(
                [
                    (
                        f"Downstream/{record['task']}/{record['metric']}",
                        float(record["value"]),
                        int(record["step"]),
                    )
                ]
            )

    def guard(self, record: dict[str, Any]) -> None:
        """Write a ``"split": "guard"`` record (pretrain.stability.guard: a skipped step, a
        rollback, the guard giving up) to metrics.jsonl and say it in one console line."""
        if self.rank != 0:
            return
        self._file.write(json.dumps(_finite(record)) + "\n")
        self._file.flush()
        line = (
            f"guard step {record['step']}: {record['event']} {record['value']:.4g} "
            f"(median {record['median']:.4g}, z {record['z']:.3g}) -> {outcome(record)}"
        )
        if record["action"] == "rollback":
            line += f" to step {record['to_step']} (rollback {record['rollbacks']})"
        if "skipped_samples" in record:
            first, end = record["skipped_samples"]
            line += f", samples [{first}, {end}) skipped"
        if "reason" in record:
            line += f" ({record['reason']})"
        self.info(line)

    def print(self, msg: str) -> None:
        """A line on rank 0's console that does not break the progress bar."""
        if self.rank != 0:
            return
        if self._bar is not None:
            self._bar.write(msg)
        else:
            print(msg, flush=True)

    def info(self, msg: str) -> None:
        """A note in the one log format (bertforge.logs), through the progress bar."""
        self.print(format_line("pretrain", logging.INFO, msg))

    def warning(self, msg: str) -> None:
        """A warning in the one log format (bertforge.logs), through the progress bar."""
        self.print(format_line("pretrain", logging.WARNING, msg))

    def error(self, msg: str) -> None:
        """An error in the one log format (bertforge.logs), through the progress bar."""
        self.print(format_line("pretrain", logging.ERROR, msg))

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._file is not None:
            self._file.close()


def _finite(record: dict[str, Any]) -> dict[str, Any]:
    """JSON has no inf/NaN: write them as strings so every line stays valid JSON."""
    return {
        k: (str(v) if isinstance(v, float) and not math.isfinite(v) else v)
        for k, v in record.items()
    }


def _truncate_after(path: Path, step: int) -> None:
    """Keep only records with ``step <= step`` (atomic rewrite)."""
    keep = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                if json.loads(line).get("step", 0) <= step:
                    keep.append(line)
            except json.JSONDecodeError:  # a half-written last line from a killed run
                continue
    write_text_atomic(path, "".join(keep))


def read_metrics(path: str | os.PathLike, split: str = "train") -> list[dict[str, Any]]:
    """Records of ``split`` ("train", "validation", "guard", "downstream" or "resume") from a
    metrics.jsonl."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("split", "train") == split:
                out.append(rec)
    return out
