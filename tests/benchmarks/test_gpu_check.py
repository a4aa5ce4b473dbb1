"""`python -m benchmarks.gpu_check`: the dry run (every part, on the CPU, tiny sizes) and its time
boxes.

The dry run executes the same code as the GPU check, so the script cannot rot between GPU loans.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch
from helpers.commands import REPO, run_cli

from benchmarks.gpu_check import __main__ as gpu_check


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check")
    proc = run_cli(
        "-m", "benchmarks.gpu_check", "--dry-run", "--out", str(out), check=False, timeout=600
    )
    return out, proc


def test_dry_run_runs_every_part(dry_run):
    out, proc = dry_run
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["dry_run"] is True
    assert list(report["parts"]) == list(gpu_check.PARTS)
    for name, part in report["parts"].items():
        assert part["status"] == "ok", (name, part["error"])
        assert part["rows"], name
    parts = report["parts"]
    assert parts["kernel_tests"]["rows"][0]["passed"] >= 3
    ours = [r for r in parts["kernel_sweep"]["rows"] if r["variant"].startswith("ours")]
    assert ours and all(r["status"] == "ok" and r["ms"] > 0 for r in ours)
    (train,) = parts["train"]["rows"]
    assert train["tokens/s"] > 0 and train["seq/s"] > 0 and train["TFLOP/s"] > 0
    assert train["steps"] == gpu_check.DRY_PLAN.measured_steps
    # the ModernBERT lines: --arch modernbert at both of the plan's lengths, MFU from its FLOPs
    mb = parts["modernbert"]["rows"]
    assert [(r["model"], r["seq"]) for r in mb] == [
        (m, s) for m, s, _ in gpu_check.DRY_PLAN.modernbert
    ]
    for row in mb:
        assert row["status"] == "ok" and row["tokens/s"] > 0 and row["TFLOP/s"] > 0
        assert row["steps"] == gpu_check.DRY_PLAN.measured_steps
        assert row["attention"] == "document"
        assert row["attention path"].startswith("padded; global layers SDPA")  # the CPU path
        assert row["peak mem GiB"] > 0
    # the compile part compiles nothing in the dry run (test_compile_rows_sit_beside_eager)
    assert parts["compile"]["rows"][0]["status"].startswith("not run")
    seqs = {r["seq"] for r in parts["data"]["rows"]}
    assert {s for _, s, _ in gpu_check.DRY_PLAN.modernbert} <= seqs
    hf = parts["hf_baseline"]
    assert hf["rows"][-1]["attention"] == "sdpa" and hf["rows"][-1]["tokens/s"] > 0
    assert hf["details"]["ours_over_hf_tokens_per_s"] > 0
    resume = parts["resume"]["details"]
    assert resume["log_says_resumed"] and resume["first_step_bit_identical"]
    targets = {t["target"]: t for t in report["targets"]}
    assert targets["save + resume: later losses equal the uninterrupted run's"]["met"] is True
    # the phase plan: a ramp on the short shards, the decay on the long ones, the doctor's view
    phases = parts["phases"]
    assert [r["phase"] for r in phases["rows"]] == ["seq64", "seq128"]
    assert phases["rows"][0]["global batch"] == "4 -> 8" and phases["rows"][1]["tokens/s"] > 0
    assert "longest sequences 128 tokens in phase 'seq128'" in phases["details"]["doctor"]
    assert phases["details"]["estimate GiB"] > 0
    # GLUE: fine-tuning throughput at batch 32, 128 tokens; the train part's run scored by the
    # --downstream_eval glue: job beside its tokens and GPU-hours
    (glue,) = parts["glue"]["rows"]
    assert (glue["batch"], glue["max_length"], glue["steps"]) == (32, 128, 3)
    assert (
        glue["train examples/s"] > 0 and glue["train examples"] == gpu_check.DRY_PLAN.glue_examples
    )
    scored = parts["glue"]["details"]
    assert scored["run"] == f"tiny-64-bf16@{train['steps'] + gpu_check.DRY_PLAN.warmup_steps}"
    assert (
        "RTE accuracy" in scored["run scores x 100"]
        and "STS-B pearson" in scored["run scores x 100"]
    )
    assert scored["run tokens"] > 0 and scored["run GPU-hours"] > 0
    assert scored["run GLUE score"].startswith("none: the synthetic folder holds 2")
    assert (out / "glue" / "run_scores" / "glue_vs_tokens.png").is_file()
    # the budget part: the standard recipe and recipes/budget.yaml, each ended by one budget
    budget = parts["budget"]
    assert [r["arm"] for r in budget["rows"]] == ["standard", "budget"]
    for row in budget["rows"]:
        assert row["budget s"] == gpu_check.DRY_PLAN.budget_arm_s
        assert row["steps"] >= 1 and row["tokens"] > 0 and row["held-out loss @15%"] > 0
        assert row["tokens/s (steps)"] >= row["tokens/s (budget)"] > 0
    assert budget["rows"][1]["last global batch"] <= 4 * gpu_check.DRY_PLAN.micro_batch[64]
    assert "budget - standard held-out loss" in budget["details"]
    assert "budget recipe: lower held-out loss" in " ".join(targets)
    md = (out / "gpu_check.md").read_text()
    for name in gpu_check.PARTS:
        assert f"## {name}: ok" in md
    assert "| target | value | met |" in md


def test_compile_rows_sit_beside_eager():
    """The report sets each --compile row beside the eager row of the same name."""
    from benchmarks.gpu_check.common import PartResult
    from benchmarks.gpu_check.report import compile_targets

    def part(name, rows):
        res = PartResult(name)
        res.rows = rows
        return res

    ok = {"status": "ok"}
    results = {
        "train": part("train", [{"run": "base-128-bf16", "tokens/s": 100, **ok}]),
        "modernbert": part("modernbert", [{"run": "mb-1024-bf16", "tokens/s": 50, **ok}]),
        "compile": part(
            "compile",
            [
                {"run": "base-128-bf16", "tokens/s": 130, **ok},
                {"run": "mb-1024-bf16", "status": "timed out after 100 s"},
            ],
        ),
    }
    rows = {t["target"]: t for t in compile_targets(results)}
    base = rows["--compile faster than eager, base-128-bf16 (tokens/s ratio)"]
    assert (base["value"], base["met"]) == (1.3, True)
    mb = rows["--compile faster than eager, mb-1024-bf16 (tokens/s ratio)"]
    assert (mb["value"], mb["met"]) == (None, None)


def test_a_failed_part_leaves_the_others(tmp_path):
    """resume before train has nothing to resume: it fails with a reason, data still runs, and
    the command exits 1."""
    proc = run_cli(
        "-m",
        "benchmarks.gpu_check",
        "--dry-run",
        "--parts",
        "resume,data",
        "--out",
        str(tmp_path),
        check=False,
        timeout=120,
    )
    assert proc.returncode == 1
    text = (tmp_path / "gpu_check.json").read_text()
    assert str(tmp_path) not in text and str(REPO) not in text  # paths relative or $OUT/...
    report = json.loads(text)
    assert report["parts"]["resume"]["status"] == "failed"
    assert "needs the train part's run" in report["parts"]["resume"]["error"]
    assert report["parts"]["data"]["status"] == "ok"


def test_time_box_kills_the_whole_process_group(tmp_path):
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    log = tmp_path / "box.log"
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        gpu_check.run_logged([sys.executable, "-c", code], log, timeout=3)
    assert time.monotonic() - t0 < 20
    grandchild = int(log.read_text().split()[-1])
    time.sleep(0.5)
    assert not running(grandchild)  # killed with its parent, not left running


def running(pid: int) -> bool:
    """Alive and not a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a CPU machine")
def test_without_a_gpu_the_full_check_says_to_use_dry_run(tmp_path, capsys):
    with pytest.raises(SystemExit):
        gpu_check.main(["--out", str(tmp_path)])
    assert "--dry-run" in capsys.readouterr().err


def test_the_budget_part_runs_only_when_asked_on_a_gpu():
    """Its two 10-minute runs do not fit the check's 9 minutes: `make gpu-check` leaves it out,
    --parts data,budget runs it; the dry run runs every part."""
    assert "budget" in gpu_check.PARTS and "budget" not in gpu_check.GPU_DEFAULT_PARTS
    assert gpu_check.GPU_PLAN.budget_arm_s == 600.0
    box, _ = gpu_check.GPU_PLAN.boxes["budget"]
    assert box >= 2 * gpu_check.GPU_PLAN.budget_arm_s


def test_unknown_part_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        gpu_check.main(["--dry-run", "--parts", "train,warp", "--out", str(tmp_path)])
    assert "unknown warp" in capsys.readouterr().err


def documented_gpu_check_commands() -> list[list[str]]:
    """argv of every gpu_check command line in README.md and the docs/ pages, and the one
    `make gpu-check` runs."""
    from helpers.docs_commands import documented_commands

    argvs = [argv[2:] for _, _, argv in documented_commands(("benchmarks.gpu_check",))]
    # Under `make test` the parent make's variables would add "Entering directory" lines.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    dry = subprocess.run(
        ["make", "--no-print-directory", "-n", "gpu-check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout
    line = next(x for x in dry.splitlines() if "-m benchmarks.gpu_check" in x).split()
    return argvs + [line[line.index("benchmarks.gpu_check") + 1 :]]


def test_documented_commands_parse():
    argvs = documented_gpu_check_commands()
    assert len(argvs) >= 3 and any("--dry-run" in a for a in argvs)
    for argv in argvs:
        args = gpu_check.build_parser().parse_args(argv)
        assert set((args.parts or ",".join(gpu_check.PARTS)).split(",")) <= set(gpu_check.PARTS), (
            argv
        )


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_the_gpu_runs_give_each_setting_in_one_place(precision, english_shards, tmp_path):
    """The GPU plan trains with the shipped GPU configs, which enable their precision: the
    command gives --precision only where the JSON does not (the dry run's cpu.json), so the
    trainer's one-home check passes on a GPU as it does here."""
    from benchmarks.gpu_check.common import DRY_PLAN, GPU_PLAN, engine_flags
    from bertforge.pretrain.config import command_line
    from bertforge.pretrain.config.cli import parse_args
    from bertforge.pretrain.config.ds_config import load_user_config
    from bertforge.pretrain.config.one_home import check_one_home

    for plan in (GPU_PLAN, DRY_PLAN):
        flags = engine_flags(plan, precision)
        argv = command_line.trainer(**flags, data=english_shards, lr="1e-4")[2:]
        cfg = parse_args(argv)
        check_one_home(load_user_config(flags["ds_config"]), cfg, str(flags["ds_config"]))
        enabled = json.loads(flags["ds_config"].read_text()).get(precision, {}).get("enabled")
        assert ("precision" in flags) != bool(enabled)
