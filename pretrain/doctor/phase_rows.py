"""The doctor's view of a ``--phases`` plan: the plan checked and resolved for the job's batch
plan (a FAIL row names the file, phase and key as the trainer would), the shard folders its
phases add (checked on every node like --data's), and the phase with the longest sequences, whose
folder sizes the memory estimate. The micro-batch stays fixed in a plan (a larger global batch is
more accumulation), so the longest sequence is what raises a rank's memory."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bertforge.data_prep.reader import ShardError, load_manifest
from bertforge.data_prep.sources import parse_mixture
from bertforge.errors import UserError
from bertforge.pretrain.config.batching import BatchPlan
from bertforge.pretrain.config.phase_plan import load_phase_file, resolve_for_batch
from bertforge.pretrain.doctor.checks import FAIL, OK, Row

CHECK_FIX = "bertforge phases FILE --global_batch_size ... checks a plan alone"


@dataclass
class PlanView:
    """What the other checks need from the plan: its extra folders, the folder whose sequences
    are the longest (None: --data's), and the report rows."""

    folders: list[str] = field(default_factory=list)
    longest_folder: Path | None = None
    rows: list[Row] = field(default_factory=list)


def _seq_len(folder: Path) -> int | None:
    """The build's max_seq_len from its manifest on this node (None: not readable here; the
    data check reports the folder)."""
    try:
        return int(load_manifest(folder)["max_seq_len"])
    except (ShardError, OSError, KeyError, ValueError):
        return None


def plan_view(cfg, plan: BatchPlan | None, run_folder: Path) -> PlanView:
    """The plan of ``cfg.run.phases`` against the job's batch ``plan`` (None: the batch check
    failed; the plan's folders are still checked) and --data's first folder ``run_folder``."""
    view = PlanView()
    path = cfg.run.phases
    if not path:
        return view
    first: dict[tuple[str, ...], Path] = {}  # a phase's data -> its first source's folder
    try:
        phases = load_phase_file(path)
        for ph in phases:
            sources = parse_mixture(ph.data) if ph.data else []
            if sources:
                first[tuple(ph.data)] = Path(sources[0].path)
            for s in sources:
                if str(s.path) not in view.folders:
                    view.folders.append(str(s.path))
    except UserError as e:
        view.rows.append(Row("phases", "-", FAIL, str(e), CHECK_FIX))
        return view
    if plan is None:
        return view
    run_len = _seq_len(run_folder) or 0

    def seq_len(data: list[str] | None) -> int:
        return run_len if data is None else (_seq_len(first[tuple(data)]) or run_len)

    try:
        resolved = resolve_for_batch(
            phases, path, plan, seq_len, cfg.optim.min_lr_ratio, cfg.model_cfg.arch
        )
    except UserError as e:
        view.rows.append(Row("phases", "-", FAIL, str(e), CHECK_FIX))
        return view
    longest = max(resolved, key=lambda ph: ph.seq_len)
    if longest.data is not None:
        view.longest_folder = first[tuple(longest.data)]
    batches = [b for ph in resolved for b in (ph.batch_start, ph.batch_end)]
    block = plan.micro_batch * plan.world_size
    view.rows.append(
        Row(
            "phases",
            "-",
            OK,
            f"{path}: {len(resolved)} phases, {resolved[-1].end_step} steps; global batch "
            f"{min(batches)} to {max(batches)} (micro {plan.micro_batch} fixed: accumulation "
            f"{min(batches) // block} to {max(batches) // block}); longest sequences "
            f"{longest.seq_len} tokens in phase {longest.name!r} (the memory estimate's)",
        )
    )
    return view
