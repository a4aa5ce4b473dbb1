"""pretrain.doctor: hostfile rules (against DeepSpeed's own parser), the ZeRO memory arithmetic
(against the ZeRO paper), and the whole report against a good two-host set-up on loopback and
against each broken one: bad hostfile line, unreachable host, an older package on one node, data
missing on one node, batch sizes that do not fit the world size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.commands import REPO, run_cli
from helpers.sshd_harness import NORMAL_NODE2, LoopbackSSH, missing_requirements

from bertforge.pretrain.doctor import HostfileError, check_deepspeed_env, parse_hostfile
from bertforge.pretrain.doctor.memory_estimate import ModelShape, estimate_memory


def _ds_parse(text: str):
    from deepspeed.launcher.runner import _parse_hostfile

    return _parse_hostfile(text.splitlines(keepends=True))


def test_hostfile_example_parses_like_deepspeed():
    path = REPO / "hostfile.example"
    assert parse_hostfile(path) == dict(_ds_parse(path.read_text())) == {"node-1": 8, "node-2": 8}


@pytest.mark.parametrize(
    "text, message",
    [
        ("a slots=2\nb slot=2\n", r"hostfile:2: 'b slot=2' is not `HOSTNAME slots=N`"),
        (
            "a slots=2\n# c\nb slots=1\na slots=4\n",
            r"hostfile:4: host a is listed again \(first on line 1\)",
        ),
        ("# only comments\n\n", "no `HOSTNAME slots=N` line"),
    ],
)
def test_bad_hostfiles_name_the_line_and_deepspeed_agrees(tmp_path, text, message):
    path = tmp_path / "hostfile"
    path.write_text(text)
    with pytest.raises(HostfileError, match=message):
        parse_hostfile(path)
    with pytest.raises(ValueError):  # the launcher would refuse it too
        _ds_parse(text)


def test_deepspeed_env_blank_line_fails(tmp_path):
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.write_text("OMP_NUM_THREADS=1\nNCCL_DEBUG=INFO\n")
    bad.write_text("OMP_NUM_THREADS=1\n\nNCCL_DEBUG=INFO\n")
    rows = check_deepspeed_env([good, bad, tmp_path / "absent"])
    assert [r.status for r in rows] == ["ok", "FAIL"]
    assert "line 2" in rows[1].detail


def test_zero_stages_match_the_zero_paper():
    """ZeRO paper, Figure 1: 7.5B parameters, 64 GPUs, mixed-precision Adam: model states take
    120 GB (baseline), 31.4 GB (P_os), 16.6 GB (P_os+g) and 1.9 GB (P_os+g+p) per GPU."""
    shape = ModelShape("7.5B", 7_500_000_000, 4096, 1, 32, 1, 8, False)
    expected = {0: 120.0, 1: 31.4, 2: 16.6, 3: 1.9}
    for stage, gb in expected.items():
        cfg = {"fp16": {"enabled": True}, "zero_optimization": {"stage": stage}}
        est = estimate_memory(shape, cfg, world=64, micro_batch=1)
        states = (est.params + est.grads + est.optimizer) / 1e9
        assert states == pytest.approx(gb, abs=0.05), stage
    offload = {
        "fp16": {"enabled": True},
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
    }
    assert estimate_memory(shape, offload, world=64, micro_batch=1).optimizer == 0


def test_modernbert_estimate_knows_local_layers_and_geglu(tmp_path):
    """modernbert-base at 8192 tokens (22 layers, 8 global, GeGLU 1152, window 128): the local
    layers keep scores over the blocked path's 3 chunks of 64 keys, not 8192; on a GPU in half
    precision (unpadded varlen flash-attention) no layer keeps scores. Before, every layer was
    charged BERT's 5 a s^2 bytes and a 4h MLP: 87 GiB of activations for one sequence."""
    import dataclasses

    from bertforge.pretrain.doctor.memory_estimate import MLM_FRACTION, model_shape
    from bertforge.pretrain.model.registry import PRESETS

    s, h, a, i = 8192, 768, 12, 1152
    shape = model_shape("modernbert-base", tmp_path, s, False)  # no manifest: vocab 30522
    assert (shape.arch, shape.intermediate, shape.global_layers, shape.local_keys) == (
        "modernbert",
        i,
        8,
        192,
    )
    head = MLM_FRACTION * s * shape.vocab * 8
    dense = s * (16 * h + 8 * i)  # 16-bit bytes of one layer without its scores
    bf16 = {"bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}
    gpu = estimate_memory(shape, bf16, world=1, micro_batch=1, on_gpu=True)
    assert gpu.activations == int(22 * (dense + 4 * a * s) + head)
    fp32 = {"zero_optimization": {"stage": 2}}
    cpu = estimate_memory(shape, fp32, world=1, micro_batch=1, on_gpu=False)
    scores = 8 * 2 * a * s * s + 14 * 2 * a * s * 192
    assert cpu.activations == int(2 * (22 * dense + scores) + head)
    # Every layer global costs more; checkpointing keeps the largest (a global) layer once.
    all_global = dataclasses.replace(PRESETS["modernbert-base"], global_attn_every_n_layers=1)
    dense_shape = model_shape(all_global, tmp_path, s, False)
    assert dense_shape.global_layers == 22
    assert estimate_memory(dense_shape, fp32, 1, 1, on_gpu=False).activations > 2 * cpu.activations
    ckpt = dataclasses.replace(shape, checkpointing=True)
    got = estimate_memory(ckpt, fp32, 1, 1, on_gpu=False).activations
    assert got == int(2 * (22 * 2 * s * h + dense + 2 * a * s * s) + head)


def test_param_count_matches_transformers(english_shards):
    """Our model built on the meta device has exactly as many parameters as transformers'
    BertForMaskedLM of the same configuration (packed shards: no pooler, no NSP head; the tied
    decoder counted once)."""
    import torch
    from transformers import BertForMaskedLM

    from bertforge.pretrain.doctor.memory_estimate import model_shape
    from bertforge.pretrain.model.bert import bert_config
    from bertforge.pretrain.model.registry import PRESETS

    shape = model_shape("base", english_shards, None, False)
    manifest = json.loads((english_shards / "manifest.json").read_text())
    with torch.device("meta"):
        ref = BertForMaskedLM(bert_config(PRESETS["base"], manifest["tokenizer"]["vocab_size"]))
    assert shape.params == sum(p.numel() for p in ref.parameters())
    assert shape.seq_len == manifest["max_seq_len"] and shape.hidden == 768


def _doctor(*args: str, env: dict | None = None):
    proc = run_cli("-m", "pretrain.doctor", "--json", *args, check=False, env=env, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    rows = json.loads(proc.stdout)
    return proc.returncode, rows


def _status(rows, check, host=None):
    return [
        r["status"] for r in rows if r["check"] == check and (host is None or r["host"] == host)
    ]


@pytest.mark.slow  # runs the trainer, the doctor or DeepSpeed as processes
def test_cli_bad_hostfile_line_exits_nonzero(tmp_path, english_shards):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("127.0.0.1 slots=1\n127.0.0.2 slots=one\n")
    proc = run_cli(
        "-m",
        "pretrain.doctor",
        "--hostfile",
        str(hostfile),
        "--ds_config",
        str(REPO / "ds_configs" / "cpu.json"),
        "--data",
        str(english_shards),
        check=False,
    )
    assert proc.returncode == 1
    assert f"{hostfile}:2: '127.0.0.2 slots=one' is not `HOSTNAME slots=N`" in proc.stdout
    assert "What to fix:" in proc.stdout and "1 check(s) failed." in proc.stdout


# ---- two hosts on loopback over ssh ---------------------------------------------------------


@pytest.fixture(scope="module")
def ssh_hosts(tmp_path_factory):
    reason = missing_requirements()
    if reason:
        pytest.skip(f"two-host doctor tests: {reason}")
    harness = LoopbackSSH(tmp_path_factory.mktemp("sshd"))
    yield harness
    harness.close()


def _two_host_doctor(ssh_hosts, shards, tmp_path, hosts=("127.0.0.1", "127.0.0.2"), *extra):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{h} slots=1\n" for h in hosts))
    return _doctor(
        "--hostfile",
        str(hostfile),
        "--ds_config",
        str(REPO / "ds_configs/cpu.json"),
        "--data",
        str(shards),
        "--output_dir",
        str(tmp_path / "run"),
        "--ssh_args",
        ssh_hosts.ssh_args,
        "--ssh_timeout",
        "5",
        *extra,
    )


@pytest.mark.slow
def test_two_hosts_good_setup_passes(ssh_hosts, english_shards, tmp_path):
    ssh_hosts.set_node2(NORMAL_NODE2)
    rc, rows = _two_host_doctor(
        ssh_hosts, english_shards, tmp_path, ("127.0.0.1", "127.0.0.2"),
        *("--micro_batch_size", "8", "--grad_accum", "2"),
    )  # fmt: skip
    assert rc == 0, rows
    # /dev/shm of a shared machine may hold other programs' stale buffers, and a machine not
    # installed with constraints.txt has untested versions: those rows may warn.
    may_warn = ("shared memory", "tested versions")
    assert all(r["status"] == "ok" for r in rows if r["check"] not in may_warn), rows
    for check in ("ssh", "versions", "devices", "data", "memory", "disk"):
        assert _status(rows, check, "127.0.0.1") == ["ok"] and _status(
            rows, check, "127.0.0.2"
        ) == ["ok"]
    assert (
        "world size 2: global 32 = micro 8 x accumulation 2"
        in next(r for r in rows if r["check"] == "batch")["detail"]
    )


@pytest.mark.slow
def test_two_hosts_each_broken_one_is_reported(ssh_hosts, english_shards, tmp_path):
    """One run, four faults: node 2 has an older transformers and no data, a third host is
    unreachable, and three ranks cannot split a global batch of 32 at a micro batch of 8."""
    # Node 2 sees an older transformers first on its path (its user site-packages) ...
    site = (
        tmp_path
        / "userbase"
        / "lib"
        / f"python{sys.version_info[0]}.{sys.version_info[1]}"
        / "site-packages"
        / "transformers-4.30.0.dist-info"
    )
    site.mkdir(parents=True)
    (site / "METADATA").write_text("Metadata-Version: 2.1\nName: transformers\nVersion: 4.30.0\n")
    # ... and does not have the shard folder: in its own mount namespace the folder is an empty
    # directory (or, where namespaces are not allowed, its commands name a path that is absent).
    empty = tmp_path / "empty"
    empty.mkdir()
    head = f"#!/bin/sh\nexport PYTHONUSERBASE={tmp_path / 'userbase'}\n"
    if subprocess.run(["unshare", "-m", "true"], check=False).returncode == 0:
        ssh_hosts.set_node2(
            f"{head}exec unshare -m /bin/sh -c 'mount --bind {empty} {english_shards} && "
            'exec /bin/sh -c "$SSH_ORIGINAL_COMMAND"\'\n'
        )
    else:
        ssh_hosts.set_node2(
            f'{head}exec /bin/sh -c "$(printf %s "$SSH_ORIGINAL_COMMAND" | '
            f'sed "s#{english_shards}#{tmp_path / "absent"}#g")"\n'
        )
    try:
        # 127.0.0.3 is loopback too, but nothing listens there on the harness port.
        rc, rows = _two_host_doctor(
            ssh_hosts,
            english_shards,
            tmp_path,
            ("127.0.0.1", "127.0.0.2", "127.0.0.3"),
            *("--global_batch_size", "32", "--micro_batch_size", "8"),
        )
    finally:
        ssh_hosts.set_node2(NORMAL_NODE2)
    assert rc == 1
    by = {(r["check"], r["host"]): r for r in rows}
    for check in ("ssh", "versions", "data"):
        assert by[(check, "127.0.0.1")]["status"] == "ok"
    unreachable = [r for r in rows if r["host"] == "127.0.0.3"]
    assert [r["check"] for r in unreachable] == ["ssh"] and unreachable[0]["status"] == "FAIL"
    assert "ssh failed" in unreachable[0]["detail"] and "BatchMode" in unreachable[0]["fix"]

    versions = by[("versions", "127.0.0.2")]
    assert versions["status"] == "FAIL"
    assert (
        "transformers 4.30.0 (vs " in versions["detail"] and "on 127.0.0.1)" in versions["detail"]
    )
    assert "torch" not in versions["detail"].split(";")[0]  # only what differs is named

    data = by[("data", "127.0.0.2")]
    assert data["status"] == "FAIL"
    assert "no manifest.json" in data["detail"] or "folder missing" in data["detail"]
    assert f"rsync -a {english_shards}/ 127.0.0.2:" in data["fix"]
    assert Path(english_shards, "manifest.json").is_file()  # the real folder was never touched

    batch = by[("batch", "-")]
    assert batch["status"] == "FAIL" and "32 cannot be shared evenly by 3 ranks" in batch["detail"]
    assert "--global_batch_size to a multiple of 3" in batch["fix"]


def _probe(gpus: int, gpu_gib: float = 80.0, ram_gib: float = 64.0, free_gib: float = 500.0):
    return {
        "gpus": gpus,
        "gpu_bytes": int(gpu_gib * 2**30) if gpus else None,
        "gpu_name": "GPU" if gpus else None,
        "cpus": 16,
        "ram_bytes": int(ram_gib * 2**30),
        "disk_free": int(free_gib * 2**30),
    }


def test_device_and_memory_rules():
    """Slots against GPUs, fp16 on CPU nodes, and BERT-large on a small GPU."""
    from bertforge.pretrain.doctor.checks import device_rows, memory_and_disk_rows
    from bertforge.pretrain.doctor.memory_estimate import ModelShape

    fp16 = {"fp16": {"enabled": True}, "zero_optimization": {"stage": 2}}
    rows = device_rows({"a": _probe(8), "b": _probe(4)}, {"a": 8, "b": 8}, fp16)
    assert [r.status for r in rows] == ["ok", "FAIL"] and "lower slots to 4" in rows[1].fix
    rows = device_rows({"c": _probe(0)}, {"c": 2}, fp16)
    assert rows[0].status == "FAIL" and "fp16" in rows[0].detail
    rows = device_rows({"c": _probe(0)}, {"c": 2}, {"zero_optimization": {"stage": 2}})
    assert rows[0].status == "ok" and "CPU (16 cores)" in rows[0].detail
    rows = device_rows({"a": _probe(8), "c": _probe(0)}, {"a": 8, "c": 2}, {})
    assert rows[-1].status == "FAIL" and "some nodes have GPUs" in rows[-1].detail

    large = ModelShape("large", 335_000_000, 1024, 24, 16, 512, 30528, False)
    rows = memory_and_disk_rows(
        {"a": _probe(1, gpu_gib=16, free_gib=1)}, {"a": 1}, fp16, 32, large, 3
    )
    mem, disk = rows
    assert mem.status == "FAIL" and "of 16.0 GiB per GPU" in mem.detail
    assert "micro_batch_size" in mem.fix
    assert disk.status == "FAIL"  # 335M params: ~5.4 GB of optimizer state per checkpoint
    rows = memory_and_disk_rows({"a": _probe(1, gpu_gib=141)}, {"a": 1}, fp16, 32, large, 3)
    assert [r.status for r in rows] == ["ok", "ok"]


@pytest.mark.slow  # runs the trainer, the doctor or DeepSpeed as processes
def test_missing_project_folder_on_a_node_is_a_probe_failure(tmp_path, english_shards):
    """The launcher runs `cd DIR; PYTHON ...` on every node; without DIR nothing can start."""
    rc, rows = _doctor(
        "--ds_config",
        str(REPO / "ds_configs" / "cpu.json"),
        "--data",
        str(english_shards),
        "--workdir",
        str(tmp_path / "absent"),
    )
    assert rc == 1
    probe = next(r for r in rows if r["check"] == "probe")
    assert probe["status"] == "FAIL" and "No such file or directory" in probe["detail"]
    assert f"cd {tmp_path / 'absent'};" in probe["fix"]
    assert not any(r["check"] == "versions" for r in rows)


@pytest.mark.slow  # runs the trainer, the doctor or DeepSpeed as processes
def test_a_trainer_launch_line_pastes_into_the_doctor(english_shards, tmp_path):
    """The doctor's flags are the trainer's: every flag of a launch line is accepted with the
    trainer's meaning (--activation_checkpointing takes none|torch|deepspeed, as the trainer's),
    and the memory estimate follows it."""
    launch = [
        "--ds_config", str(REPO / "ds_configs" / "cpu.json"), "--data", str(english_shards),
        "--model", "base", "--output_dir", str(tmp_path / "run"), "--max_steps", "100",
        "--lr", "3e-4", "--warmup_steps", "10", "--save_interval", "50", "--eval_interval", "25",
        "--global_batch_size", "32", "--micro_batch_size", "16", "--mask_prob", "0.2",
        "--whole_word", "--precision", "fp32",
    ]  # fmt: skip

    def activations(mode: str) -> str:
        rc, rows = _doctor(*launch, "--activation_checkpointing", mode, "--slots", "2")
        assert rc in (0, 1)
        assert _status(rows, "batch") == ["ok"]
        return next(r["detail"] for r in rows if r["check"] == "memory")

    def gib(detail: str) -> float:
        return float(detail.split("activations ")[1].split(" GiB")[0])

    assert gib(activations("deepspeed")) < gib(activations("none"))
    bad = run_cli(
        "-m", "pretrain.doctor", *launch, "--activation_checkpointing", "yes", check=False
    )
    assert bad.returncode == 2 and "--activation_checkpointing" in bad.stderr


@pytest.mark.slow  # runs the trainer, the doctor or DeepSpeed as processes
def test_a_one_host_hostfile_of_this_machine_needs_no_ssh(tmp_path, english_shards):
    """`localhost slots=2` (issue 36, item 5): no sshd runs here, yet the doctor does not fail on
    ssh; it probes this machine and names the launcher's flags that skip the ssh check."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    rc, rows = _doctor(
        "--hostfile",
        str(hostfile),
        "--ds_config",
        str(REPO / "ds_configs" / "cpu.json"),
        "--data",
        str(english_shards),
    )
    ssh = [r for r in rows if r["check"] == "ssh"]
    assert [(r["host"], r["status"]) for r in ssh] == [("localhost", "WARN")]
    assert "--no_ssh_check --master_addr 127.0.0.1" in ssh[0]["fix"]
    assert _status(rows, "versions", "localhost") == ["ok"]
    assert _status(rows, "data", "localhost") == ["ok"]
    assert rc == 0, [r for r in rows if r["status"] == "FAIL"]
