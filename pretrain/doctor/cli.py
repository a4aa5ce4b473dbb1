"""Pre-launch checks for a multi-node job, reported in one table.

    bertforge doctor --hostfile hostfile --ds_config ds_configs/zero2.json --data OUT \
        [--model base] [--output_dir RUN]

Checks: hostfile syntax and duplicates, `.deepspeed_env`, pdsh; per node over ssh (BatchMode,
with a timeout): reachability, versions of Python/torch/deepspeed/triton/transformers/this project,
devices against slots, the data folder and its manifest checksum, estimated memory per rank
against device memory, free disk for checkpoints; and the world size against the batch sizes.
Exit status 1 when any check fails, with what to fix under the table. Without --hostfile it checks
this machine alone (no ssh) with --slots ranks. Every flag of `pretrain/main.py` is accepted with
the same meaning, so the flags of a launch line paste into the doctor unchanged.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

from bertforge.data_prep.sources import parse_mixture
from bertforge.errors import USER_ERROR_EXIT, UserError
from bertforge.logs import get_logger, quiet_libraries
from bertforge.pretrain.config.batching import BatchPlan, BatchSizeError
from bertforge.pretrain.config.cli import config_from_args, trainer_parser
from bertforge.pretrain.config.ds_config import (
    ConfigError,
    activation_checkpointing_mode,
    batch_origins,
    load_user_config,
)
from bertforge.pretrain.config.one_home import TwoHomesError, check_one_home
from bertforge.pretrain.config.train_config import TrainConfig
from bertforge.pretrain.distributed import op_builds, shm_buffers
from bertforge.pretrain.doctor import probe as doctor_probe
from bertforge.pretrain.doctor.budget_rows import budget_rows
from bertforge.pretrain.doctor.checks import (
    FAIL,
    LOCAL,
    OK,
    WARN,
    Row,
    batch_plan,
    constraint_rows,
    data_rows,
    device_rows,
    memory_and_disk_rows,
    shm_rows,
    version_rows,
)
from bertforge.pretrain.doctor.memory_estimate import model_shape
from bertforge.pretrain.doctor.op_rows import build_ops, op_build_rows, run_config
from bertforge.pretrain.doctor.phase_rows import plan_view

log = get_logger(__name__)

# Variables the DeepSpeed launcher forwards to remote ranks (runner.py EXPORT_ENVS + NCCL).
EXPORT_PREFIXES = ("PYTHON", "MLFLOW", "MV2", "UCX", "NCCL")
_HOST_LINE = re.compile(r"^(\S+)\s+slots=(\d+)(\s.*)?$")  # DeepSpeed's pattern, anchored


class HostfileError(UserError, ValueError):
    """A hostfile DeepSpeed would reject; the message names the line."""


def parse_hostfile(path: Path) -> dict[str, int]:
    """Hosts and slots in file order, with DeepSpeed's rules; all errors at once, by line."""
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise HostfileError(f"{path}: cannot read ({e.strerror})") from None
    hosts: dict[str, int] = {}
    first_line: dict[str, int] = {}
    errors = []
    for n, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _HOST_LINE.match(line)
        if not m:
            errors.append(f"{path}:{n}: {line!r} is not `HOSTNAME slots=N`")
        elif m.group(1) in hosts:
            errors.append(
                f"{path}:{n}: host {m.group(1)} is listed again (first on line "
                f"{first_line[m.group(1)]}); DeepSpeed refuses duplicates: merge the slots"
            )
        elif int(m.group(2)) == 0:
            errors.append(f"{path}:{n}: {m.group(1)} has slots=0")
        else:
            hosts[m.group(1)] = int(m.group(2))
            first_line[m.group(1)] = n
    if not errors and not hosts:
        errors.append(f"{path}: no `HOSTNAME slots=N` line")
    if errors:
        raise HostfileError("\n".join(errors))
    return hosts


def check_deepspeed_env(paths: list[Path]) -> list[Row]:
    """`.deepspeed_env` lines must be KEY=VALUE: DeepSpeed's launcher crashes on a blank line."""
    rows = []
    for p in paths:
        if not p.is_file():
            continue
        bad = [str(i) for i, line in enumerate(p.read_text().splitlines(), 1) if "=" not in line]
        rows.append(
            Row(
                ".deepspeed_env",
                LOCAL,
                FAIL if bad else OK,
                f"{p}: not KEY=VALUE on line {', '.join(bad)}"
                if bad
                else f"{p}: exported to every node",
                "remove blank lines and comments: one KEY=VALUE per line" if bad else "",
            )
        )
    return rows


def env_files(cwd: Path) -> list[Path]:
    """The `.deepspeed_env` files the launcher reads (home, then cwd; DS_ENV_FILE renames them)."""
    name = os.environ.get("DS_ENV_FILE", ".deepspeed_env")
    return list(dict.fromkeys(Path(d) / name for d in (os.path.expanduser("~"), cwd)))


def remote_exports(env: dict[str, str], cwd: Path) -> dict[str, str]:
    """What the DeepSpeed launcher exports on remote nodes (so the probe sees the same setup)."""
    out = {k: v for k, v in env.items() if k.startswith(EXPORT_PREFIXES)}
    out["PYTHONPATH"] = str(cwd) + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for f in env_files(cwd):
        if f.is_file():
            for line in f.read_text().splitlines():
                if "=" in line:
                    key, value = line.split("=", 1)
                    out[key] = value
    return out


def probe_command(python: str, workdir: Path, exports: dict[str, str], args: dict) -> str:
    """The shell command that runs the probe on a node, as pdsh would start a rank there."""
    code = Path(doctor_probe.__file__).read_text()
    exp = "".join(f"export {k}={shlex.quote(v)}; " for k, v in exports.items())
    return (
        f"cd {shlex.quote(str(workdir))} || exit 97; {exp}{shlex.quote(python)} -c "
        f"{shlex.quote(code)} {shlex.quote(json.dumps(args))}"
    )


def run_probe(
    host: str | None, command: str, ssh_args: list[str], timeout_s: float
) -> tuple[dict | None, str]:
    """(probe result, error). host None runs the command here without ssh."""
    argv = (
        [
            "ssh",
            "-o",
            "BatchMode=yes",
            "-o",
            f"ConnectTimeout={int(timeout_s)}",
            *ssh_args,
            host,
            command,
        ]
        if host
        else ["bash", "-c", command]
    )
    try:
        p = subprocess.run(
            argv,
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout_s + 120,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return None, f"no answer within {timeout_s + 120:g} s"
    for line in p.stdout.splitlines():
        if line.startswith("DOCTOR_PROBE "):
            return json.loads(line[len("DOCTOR_PROBE ") :]), ""
    tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
    if host and p.returncode == 255:
        return None, f"ssh failed: {tail}"
    return None, f"probe failed (exit {p.returncode}): {tail}"


def format_table(rows: list[Row]) -> str:
    """Fixed-width table followed by the fixes of the failing rows."""
    w_check = max(len("CHECK"), *(len(r.check) for r in rows))
    w_host = max(len("HOST"), *(len(r.host) for r in rows))
    lines = [f"{'CHECK':<{w_check}}  {'HOST':<{w_host}}  STATUS  DETAIL"]
    for r in rows:
        lines.append(f"{r.check:<{w_check}}  {r.host:<{w_host}}  {r.status:<6}  {r.detail}")
    fixes = [r for r in rows if r.status != OK and r.fix]
    if fixes:
        lines.append("\nWhat to fix:")
        lines += [f"  [{r.status}] {r.check} on {r.host}: {r.fix}" for r in fixes]
    return "\n".join(lines)


def host_rows(opts: argparse.Namespace) -> tuple[dict[str, int] | None, list[Row]]:
    """(hosts and their slots, rows) from --hostfile, or this machine with --slots ranks.
    Hosts is None when the hostfile cannot be used (nothing else can be checked then)."""
    if not opts.hostfile:
        return {LOCAL: opts.slots}, []
    try:
        hosts = parse_hostfile(Path(opts.hostfile))
    except HostfileError as e:
        return None, [
            Row("hostfile", "-", FAIL, str(e), "fix the lines named (see hostfile.example)")
        ]
    rows = [
        Row(
            "hostfile", "-", OK, f"{opts.hostfile}: {len(hosts)} hosts, {sum(hosts.values())} slots"
        )
    ]
    if len(hosts) > 1 and not shutil.which("pdsh"):
        rows.append(
            Row(
                "pdsh",
                LOCAL,
                FAIL,
                "pdsh not found on the launching node",
                "apt-get install pdsh (or use deepspeed --launcher openmpi/slurm)",
            )
        )
    return hosts, rows


def is_this_machine(host: str) -> bool:
    """True when ``host`` names this machine (localhost, a loopback address, its host name or
    one of its own addresses)."""
    names = {"localhost", socket.gethostname(), socket.getfqdn()}
    if host in names or host.startswith("127.") or host == "::1":
        return True
    try:
        address = socket.gethostbyname(host)
    except OSError:
        return False
    if address.startswith("127."):
        return True
    try:
        return address in socket.gethostbyname_ex(socket.gethostname())[2]
    except OSError:
        return False


def one_host_row(host: str, hostfile: str) -> Row:
    """The ssh row of a hostfile naming only this machine: no ssh needed, with the flags."""
    return Row(
        "ssh",
        host,
        WARN,
        f"{hostfile} names only this machine: the ranks start here, no ssh needed, but DeepSpeed's "
        f"launcher first runs `ssh {host} hostname` unless told not to",
        f"launch with `deepspeed --hostfile {hostfile} --no_ssh_check --master_addr 127.0.0.1 "
        "...` (or drop --hostfile and use --num_gpus N)",
    )


def probe_rows(
    cfg: TrainConfig,
    opts: argparse.Namespace,
    hosts: dict[str, int],
    cwd: Path,
    extra_folders: list[str] = (),
) -> tuple[dict[str, dict], list[Row]]:
    """Run the probe on every host at once; (answers by host, ssh/probe rows). The probe looks
    at --data's folders and ``extra_folders`` (a phase plan's)."""
    exports = remote_exports(dict(os.environ), cwd)
    folders = [str(s.path) for s in parse_mixture(cfg.run.data_sources)]
    folders += [f for f in extra_folders if f not in folders]
    command = probe_command(
        opts.python, cwd, exports, {"data": folders, "output_dir": cfg.run.output_dir}
    )
    ssh_args = shlex.split(opts.ssh_args)
    # One host, this machine: DeepSpeed's launcher starts its ranks here without ssh when told
    # --no_ssh_check (else it first runs `ssh HOST hostname`), so the probe runs here too.
    here = len(hosts) == 1 and is_this_machine(next(iter(hosts)))

    def probe(host: str) -> tuple[dict | None, str]:
        local = host == LOCAL or here
        return run_probe(None if local else host, command, ssh_args, opts.ssh_timeout)

    # the probe imports torch and DeepSpeed: seconds in which nothing else would be printed
    where = "this machine" if here or list(hosts) == [LOCAL] else f"{len(hosts)} host(s)"
    if not cfg.run.json:  # --json: stdout is the JSON alone
        log.info(f"probing {where} (versions, devices, data, memory, disk) ...")
    with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        results = dict(zip(hosts, pool.map(probe, hosts)))
    probes, rows = {}, []
    for host, (pr, err) in results.items():
        if pr is None and err.startswith("ssh failed"):
            fix = (
                "make `ssh -o BatchMode=yes HOST` work from this node (keys in "
                "authorized_keys, known_hosts, PDSH_SSH_ARGS_APPEND for port/key)"
            )
            rows.append(Row("ssh", host, FAIL, err, fix))
        elif pr is None:  # reached, but the launcher's `cd DIR; PYTHON ...` would fail there too
            fix = (
                f"the launcher runs `cd {cwd}; {opts.python} ...` on every node: clone the "
                "project there and install the same Python (or pass --workdir/--python)"
            )
            rows.append(Row("probe", host, FAIL, err, fix))
        else:
            probes[host] = pr
            if here and host != LOCAL:
                rows.append(one_host_row(host, opts.hostfile))
            elif host != LOCAL:
                rows.append(Row("ssh", host, OK, f"reached {pr['hostname']} in {pr['cwd']}"))
    return probes, rows


def batch_rows(cfg: TrainConfig, ds: dict, world: int) -> tuple[BatchPlan | None, list[Row]]:
    """(batch plan or None, the batch row) for this world size, flags as the trainer reads them."""
    flags = {
        "global_batch": cfg.batch.global_batch_size,
        "micro_batch": cfg.batch.micro_batch_size,
        "grad_accum": cfg.batch.grad_accum,
    }
    try:
        check_one_home(ds, cfg, cfg.run.ds_config)  # the trainer refuses this first
    except TwoHomesError as e:
        return None, [Row("settings", "-", FAIL, str(e).split(":\n")[0], str(e).split(":\n")[1])]
    try:
        plan = batch_plan(ds, world, flags, batch_origins(cfg))
    except BatchSizeError as e:
        fix = f"{e.fix}, or change the slots" if e.fix else "change the slots"
        return None, [Row("batch", "-", FAIL, e.problem, fix)]
    detail = (
        f"world size {world}: global {plan.global_batch} = micro {plan.micro_batch} "
        f"x accumulation {plan.grad_accum} x {world} ranks"
    )
    if plan.note:  # a recipe's accumulation derived again for these ranks
        detail += f" ({plan.note.removeprefix('batch: ')})"
    return plan, [Row("batch", "-", OK, detail)]


def run_checks(cfg: TrainConfig, opts: argparse.Namespace) -> list[Row]:
    """All checks for the launch ``cfg`` (the trainer's flags) on the hosts of ``opts``; never
    raises for a finding (each becomes a row)."""
    cwd = Path(opts.workdir).absolute()
    sources = parse_mixture(cfg.run.data_sources)
    try:  # the trainer's reader: a syntax error is named by file:line:column
        ds = load_user_config(cfg.run.ds_config)
    except (OSError, ConfigError) as e:
        detail = str(e) if isinstance(e, ConfigError) else f"{cfg.run.ds_config}: {e}"
        return [Row("ds_config", "-", FAIL, detail, "pass a readable JSON file")]
    hosts, rows = host_rows(opts)
    if hosts is None:
        return rows
    rows += check_deepspeed_env(env_files(cwd))
    rows += shm_rows(shm_buffers.stale_buffers())
    rows += op_build_rows(run_config(ds, cfg.optim), cfg.run.ds_config)
    plan, batch_found = batch_rows(cfg, ds, sum(hosts.values()))
    phases = plan_view(cfg, plan, sources[0].path)  # --phases: its folders, longest sequences
    probes, found = probe_rows(cfg, opts, hosts, cwd, phases.folders)
    rows += found
    if probes:
        rows += version_rows(probes)
        rows += constraint_rows(probes)
        rows += device_rows(probes, hosts, ds)
        folders = [str(s.path) for s in sources]  # every source of a mixture, and of the phases
        for folder in folders + [f for f in phases.folders if f not in folders]:
            local_manifest = Path(folder) / "manifest.json"
            local_sha = doctor_probe._sha256(local_manifest) if local_manifest.is_file() else None
            views = {h: {**pr, "data": pr["data_sources"][folder]} for h, pr in probes.items()}
            rows += data_rows(views, folder, local_sha)
    rows += batch_found + phases.rows
    if probes:
        checkpointing = activation_checkpointing_mode(ds, cfg.memory.activation_checkpointing)
        sized_by = phases.longest_folder or sources[0].path
        shape = model_shape(
            cfg.model_cfg, sized_by, opts.seq_len, checkpointing != "none", cfg.objective_cfg
        )
        # Without a valid plan, estimate with the micro batch the user asked for.
        micro = (
            plan.micro_batch
            if plan
            else (cfg.batch.micro_batch_size or ds.get("train_micro_batch_size_per_gpu") or 1)
        )
        rows += memory_and_disk_rows(probes, hosts, ds, int(micro), shape, cfg.checkpoint.keep_last)
        rows += budget_rows(cfg, plan, shape, probes, hosts, ds)  # --max_time_hours: the plan
    return rows


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
    """The trainer's parser (every launch flag, so a launch line pastes in unchanged) plus the
    doctor's own flags; returns it with the trainer's (group, field) -> dest map."""
    p, names = trainer_parser(prog="bertforge doctor", description=__doc__)
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    g = p.add_argument_group("doctor")
    g.add_argument("--hostfile", help="DeepSpeed hostfile; without it, check this machine only")
    g.add_argument("--slots", type=int, default=1, help="ranks on this machine (no --hostfile)")
    g.add_argument(
        "--seq_len",
        type=int,
        default=None,
        help="sequence length for the memory estimate (by default the shards' max_seq_len; "
        "with --phases the longest of any phase's data)",
    )
    g.add_argument(
        "--ssh_args",
        default=os.environ.get("PDSH_SSH_ARGS_APPEND", ""),
        help="extra ssh options (default: $PDSH_SSH_ARGS_APPEND, as pdsh uses them)",
    )
    g.add_argument(
        "--build_ops",
        action="store_true",
        help="build DeepSpeed's JIT ops that --ds_config needs on this machine, then exit "
        "(no --data needed; make install runs it)",
    )
    g.add_argument("--ssh_timeout", type=float, default=10.0, help="ssh connect timeout, seconds")
    g.add_argument(
        "--python",
        default=sys.executable,
        help="interpreter on the nodes (the launcher uses this node's path)",
    )
    g.add_argument(
        "--workdir",
        default=".",
        help="project folder on the nodes (the launcher cd's to this node's cwd)",
    )
    return p, names


def build_ops_main(cfg: TrainConfig) -> int:
    """``--build_ops``: build the ops of ``--ds_config`` now; 0, or 2 with the reason."""
    try:
        ds = load_user_config(cfg.run.ds_config)
        built = build_ops(run_config(ds, cfg.optim))
    except (OSError, ConfigError) as e:
        log.error(str(e) if isinstance(e, ConfigError) else f"{cfg.run.ds_config}: {e}")
        return USER_ERROR_EXIT
    except UserError as e:  # a stale lock, a failed build: the message names the file
        log.error(str(e))
        return USER_ERROR_EXIT
    root = os.environ[op_builds.ENV_VAR]
    log.info("ops ready in %s: %s", root, ", ".join(built) or "none needed on this machine")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the checks, print the table; 0 when nothing failed, 1 otherwise."""
    quiet_libraries()
    parser, names = build_parser()
    opts = parser.parse_args(argv)
    cfg = config_from_args(opts, names, parser)
    op_builds.use_environment_folder()  # this environment's build folder, unless the user set one
    if opts.build_ops:
        return build_ops_main(cfg)
    if not cfg.run.data_sources:
        parser.error("--data is required: the shard folder the launch will train on")
    try:
        rows = run_checks(cfg, opts)
    except UserError as e:  # a --data mixture that cannot be used
        log.error(str(e))
        return USER_ERROR_EXIT
    failed = [r for r in rows if r.status == FAIL]
    if cfg.run.json:
        print(json.dumps([asdict(r) for r in rows], indent=1))
    else:
        print(format_table(rows))
        print(f"\n{len(failed)} check(s) failed." if failed else "\nAll checks passed.")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
