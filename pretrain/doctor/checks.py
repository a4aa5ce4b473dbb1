"""The per-node checks of `pretrain.doctor`: each turns probe results into report rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bertforge.pretrain.config.batching import resolve_batch
from bertforge.pretrain.doctor.memory_estimate import estimate_memory, gib

OK, WARN, FAIL = "ok", "WARN", "FAIL"
LOCAL = "(local)"
VERSION_KEYS = ("python", "torch", "deepspeed", "triton", "transformers", "bertforge", "code")


@dataclass
class Row:
    """One line of the report."""

    check: str  # what was checked
    host: str  # node it concerns ("-" for the whole job)
    status: str  # ok | WARN | FAIL
    detail: str  # what was found
    fix: str = ""  # what to do (for WARN/FAIL)


def version_rows(probes: dict[str, dict]) -> list[Row]:
    """Every node against the first host (rank 0's node)."""
    ref_host = next(iter(probes))
    ref = probes[ref_host]
    rows = []
    for host, pr in probes.items():
        found = ", ".join(f"{k} {pr.get(k) or 'not installed'}" for k in VERSION_KEYS)
        missing = [k for k in VERSION_KEYS if pr.get(k) is None and k != "bertforge"]
        differ = [
            f"{k} {pr.get(k)} (vs {ref.get(k)} on {ref_host})"
            for k in VERSION_KEYS
            if pr.get(k) != ref.get(k)
        ]
        if missing or differ:
            rows.append(
                Row(
                    "versions",
                    host,
                    FAIL,
                    "; ".join(([f"missing: {', '.join(missing)}"] if missing else []) + differ),
                    "install the same versions on every node (pip install -e . from the same "
                    f"commit; pip freeze on {ref_host} as reference); 'code' is a hash of the "
                    "project sources",
                )
            )
        else:
            rows.append(Row("versions", host, OK, found))
    return rows


def same_release(installed: str | None, tested: str) -> bool:
    """Whether an installed version is the tested one; a local label (``2.13.0+cpu``,
    ``+cu128``: the same release built for another device) does not count, as in pip."""
    return installed is not None and installed.split("+", 1)[0] == tested.split("+", 1)[0]


def constraint_rows(probes: dict[str, dict]) -> list[Row]:
    """Every node's installed versions against constraints.txt (the tested ones): a WARN naming
    each that differs, never a FAIL (an untested version may work; it was not tested)."""
    rows = []
    for host, pr in probes.items():
        pins = pr.get("tested")
        if pins is None:
            rows.append(
                Row(
                    "tested versions",
                    host,
                    WARN,
                    f"no constraints.txt in {pr.get('cwd', 'the working directory')}",
                    "run the doctor from the repository root (or --workdir), where "
                    "constraints.txt lists the tested versions",
                )
            )
            continue
        differ = [
            f"{name} {p['installed'] or 'not installed'} (tested {p['tested']})"
            for name, p in pins.items()
            if not same_release(p["installed"], p["tested"])
        ]
        same = [
            f"{name} {p['installed']}"
            for name, p in pins.items()
            if same_release(p["installed"], p["tested"])
        ]
        if differ:
            rows.append(
                Row(
                    "tested versions",
                    host,
                    WARN,
                    "untested: " + ", ".join(differ) + "; as tested: " + (", ".join(same) or "-"),
                    "pip install -c constraints.txt -e . installs the tested versions "
                    "(make install does); other versions may work but were not tested",
                )
            )
        else:
            rows.append(Row("tested versions", host, OK, "as constraints.txt: " + ", ".join(same)))
    return rows


def device_rows(probes: dict[str, dict], hosts: dict[str, int], cfg: dict) -> list[Row]:
    """GPUs per node against slots; CPU nodes are fine for a config without fp16."""
    rows = []
    fp16 = bool(cfg.get("fp16", {}).get("enabled"))
    kinds = {bool(p["gpus"]) for p in probes.values() if not p.get("torch_error")}
    for host, pr in probes.items():
        slots = hosts[host]
        if pr.get("torch_error"):  # its GPUs are unknown: never report it as a CPU node
            rows.append(
                Row(
                    "devices",
                    host,
                    FAIL,
                    f"torch fails to load ({pr['torch_error']}), so its devices are unknown",
                    f"repair torch on {host} (run `python -c 'import torch'` there to see the "
                    "full error; reinstall the same torch as the other nodes)",
                )
            )
        elif pr["gpus"]:
            ok = pr["gpus"] >= slots
            rows.append(
                Row(
                    "devices",
                    host,
                    OK if ok else FAIL,
                    f"{pr['gpus']} x {pr['gpu_name']} ({gib(pr['gpu_bytes'])}), slots={slots}",
                    ""
                    if ok
                    else f"lower slots to {pr['gpus']} in the hostfile or use "
                    "--include to pick GPUs",
                )
            )
        elif fp16:
            rows.append(
                Row(
                    "devices",
                    host,
                    FAIL,
                    f"no GPU (CPU, {pr['cpus']} cores), slots={slots}"
                    ", but the DeepSpeed config enables fp16",
                    "use a CPU config (e.g. ds_configs/cpu.json) or run on GPU nodes",
                )
            )
        else:
            over = slots > (pr["cpus"] or 1)
            rows.append(
                Row(
                    "devices",
                    host,
                    WARN if over else OK,
                    f"CPU ({pr['cpus']} cores), slots={slots} ranks on gloo",
                    "fewer slots than cores; set OMP_NUM_THREADS so ranks x threads <= cores"
                    if over
                    else "",
                )
            )
    if len(kinds) > 1:
        rows.append(
            Row(
                "devices",
                "-",
                FAIL,
                "some nodes have GPUs and some do not",
                "use nodes of one kind in a job",
            )
        )
    return rows


def data_rows(probes: dict[str, dict], data: str, local_sha: str | None) -> list[Row]:
    """Same manifest on every node, every shard file present with its size."""
    rows = []
    ref = local_sha or next(
        (p["data"]["manifest_sha256"] for p in probes.values() if p["data"]["manifest_sha256"]),
        None,
    )
    for host, pr in probes.items():
        d = pr["data"]
        copy = (
            f"build it: bertforge prep build --input TEXT --output {data}"
            if host == LOCAL or ref is None
            else f"copy the folder from the launching node (rsync -a {data}/ {host}:{data}/) or "
            "use a shared filesystem"
        )
        if "://" in data:  # object storage: each node reads it with its own credentials
            copy = (
                "check this node's credentials (AWS_PROFILE or AWS_ACCESS_KEY_ID/..., "
                "GOOGLE_APPLICATION_CREDENTIALS), AWS_ENDPOINT_URL for an S3-compatible store, "
                "pip install 'bertforge[s3]', and that the folder was uploaded (manifest last)"
            )
        if d.get("remote_error"):
            rows.append(Row("data", host, FAIL, f"{data}: {d['remote_error']}", copy))
        elif d["manifest_sha256"] is None:
            what = "no manifest.json (incomplete build)" if d["exists"] else "folder missing"
            rows.append(Row("data", host, FAIL, f"{data}: {what}", copy))
        elif d.get("manifest_error") or d["missing"] or d["bad_size"]:
            bad = d["missing"][:3] + d["bad_size"][:3]
            rows.append(
                Row(
                    "data",
                    host,
                    FAIL,
                    f"{data}: {len(d['missing'])} shard files missing, "
                    f"{len(d['bad_size'])} of the wrong size (e.g. {', '.join(bad)})"
                    f"{d.get('manifest_error', '')}",
                    copy,
                )
            )
        elif ref and d["manifest_sha256"] != ref:
            rows.append(
                Row(
                    "data",
                    host,
                    FAIL,
                    f"{data}: manifest sha256 {d['manifest_sha256'][:12]} "
                    f"differs from the launching node's {ref[:12]} (another build)",
                    copy,
                )
            )
        else:
            rows.append(
                Row(
                    "data",
                    host,
                    OK,
                    f"{data}: manifest sha256 {d['manifest_sha256'][:12]}, all shard files present",
                )
            )
    return rows


def batch_plan(
    cfg: dict, world: int, flags: dict[str, int | None], origins: dict[str, str] | None = None
) -> Any:
    """The trainer's own batch resolution (raises pretrain.config.batching.BatchSizeError);
    ``origins``: where each flag's value came from (a recipe's accumulation is derived again)."""
    return resolve_batch(cfg, world, **flags, origins=origins)


def memory_and_disk_rows(
    probes: dict[str, dict],
    hosts: dict[str, int],
    cfg: dict,
    micro_batch: int,
    shape: Any,
    ckpt_keep: int,
) -> list[Row]:
    """Estimated memory per rank against device (or host) memory; free disk for checkpoints."""
    mem, disk = [], []
    world = sum(hosts.values())
    for host, pr in probes.items():
        est = estimate_memory(shape, cfg, world, micro_batch, on_gpu=bool(pr["gpus"]))
        if pr["gpus"]:
            budget, where, need = pr["gpu_bytes"], f"{gib(pr['gpu_bytes'])} per GPU", est.total
        else:  # ranks of a CPU node share its RAM
            budget = pr["ram_bytes"]
            where = f"{gib(budget)} RAM ({hosts[host]} ranks x {gib(est.total)})"
            need = est.total * hosts[host]
        status = FAIL if need > 0.95 * budget else WARN if need > 0.8 * budget else OK
        mem.append(
            Row(
                "memory",
                host,
                status,
                f"~{gib(need)} of {where}: {shape.name}, "
                f"micro batch {micro_batch} x {shape.seq_len} tokens "
                f"({est.describe()})",
                ""
                if status == OK
                else "lower --micro_batch_size (raise accumulation), a "
                "higher ZeRO stage, activation checkpointing, or a smaller --model",
            )
        )
        ckpt = est.checkpoint_bytes * hosts[host] // world + est.model_file_bytes
        free = pr["disk_free"]
        status = FAIL if free < ckpt else WARN if free < ckpt * (ckpt_keep + 1) else OK
        disk.append(
            Row(
                "disk",
                host,
                status,
                f"{gib(free)} free at the run folder; one checkpoint "
                f"writes ~{gib(ckpt)} there (keep_last={ckpt_keep})",
                "" if status == OK else "free space or point --output_dir elsewhere",
            )
        )
    return mem + disk


def shm_rows(stale: list[Any]) -> list[Row]:
    """Shared memory on this machine: DeepSpeed all-reduce segments (69 MB each) of dead jobs
    (``pretrain.distributed.shm_buffers.stale_buffers``); they hold RAM until removed."""
    if not stale:
        return [Row("shared memory", LOCAL, OK, "no stale DeepSpeed buffer in /dev/shm")]
    total = sum(b.size for b in stale)
    names = " ".join(str(b.path) for b in stale)
    shown = ", ".join(f"{b.path.name} ({b.size / 1e6:.0f} MB)" for b in stale[:3])
    more = f" and {len(stale) - 3} more" if len(stale) > 3 else ""
    return [
        Row(
            "shared memory",
            LOCAL,
            WARN,
            f"{len(stale)} DeepSpeed buffers of dead jobs hold {total / 1e6:.0f} MB of RAM in "
            f"/dev/shm: {shown}{more}",
            f"no live process maps them; remove them with: rm -f {names}",
        )
    ]
