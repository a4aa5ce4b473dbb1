"""The kernel benchmark (`python -m benchmarks.kernels.speed`).

Every command line that README.md and the docs/ pages show runs, at a tiny shape, exactly as
written plus shape flags; the report never hides a failure; the kernel library stays a leaf (it
imports nothing from the rest of the project, the benchmark included).
"""

from __future__ import annotations

import ast
import json
import math

import pytest
import torch
from helpers.commands import REPO, run_cli
from helpers.docs_commands import documented_commands

from benchmarks.kernels import speed as bench_kernels

ENTRIES = ("benchmarks.kernels.speed",)
# Appended to every documented command: later flags win in argparse, so the command stays as
# written and only gets small. --no-compile: torch.compile takes minutes on the CI's 2 cores.
TINY = [
    "--batch",
    "2",
    "--seq",
    "16",
    "--hidden",
    "16",
    "--vocab",
    "301",
    "--repeat",
    "1",
    "--no-compile",
    "--sweep_rows",
    "5",
    "--sweep_vocabs",
    "64,72/70",
    "--sweep_dtypes",
    "bfloat16",
]


COMMANDS = documented_commands(ENTRIES)


def test_docs_show_the_benchmark_commands():
    argvs = [" ".join(argv) for _, _, argv in COMMANDS]
    assert any("--sweep" in a for a in argvs) and any("--sweep" not in a for a in argvs)
    assert all(a.startswith("-m benchmarks.kernels.speed") for a in argvs)


@pytest.mark.parametrize("doc,env,argv", COMMANDS, ids=[" ".join(c[2]) for c in COMMANDS])
def test_documented_command_runs(doc, env, argv, tmp_path):
    if env.get("TRITON_INTERPRET", "0") != "0" and torch.cuda.is_available():
        pytest.skip("a CPU command line (the interpreter); on a GPU node the others cover it")
    proc = run_cli(*argv, *TINY, "--out", str(tmp_path), env=env, timeout=300, check=False)
    assert proc.returncode == 0, (
        f"{doc}: {' '.join(argv)}\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"
    )
    if "--help" in argv:
        assert "--sweep, --no-sweep" in proc.stdout and "--compile, --no-compile" in proc.stdout
        return
    report = json.loads((tmp_path / "bench_kernels.json").read_text())
    assert report["results"] and report["failed_ours"] == []
    for r in report["results"]:
        assert r["status"] in ("ok", "skipped"), r
        if r["status"] == "ok":
            assert math.isfinite(r["time_ms"]) and r["time_ms"] > 0 and r["peak_mb"] >= 0, r
        else:
            assert r["time_ms"] is None and r["note"], r
    if "--sweep" in argv:
        ours = [r for r in report["results"] if r["name"].startswith("loss_only") and r["ours"]]
        assert ours and all(r["status"] == "ok" for r in ours)  # the interpreter runs it on CPU
        assert all(r["extra"]["GBps_min_bytes"] >= 0 for r in ours)
    if "--no-head" not in argv:
        assert (tmp_path / "bench_kernels.png").stat().st_size > 1000


def test_head_report_in_process(tmp_path):
    """The head part's numbers: masked rows only use less memory than all-position logits; the
    interpreter pass (CPU) or the kernel (GPU) agrees with the torch path; fp16 underflow data."""
    code = bench_kernels.main(
        [
            "--batch",
            "4",
            "--seq",
            "32",
            "--hidden",
            "32",
            "--vocab",
            "2001",
            "--repeat",
            "1",
            "--no-compile",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    report = json.loads((tmp_path / "bench_kernels.json").read_text())
    assert report["config"]["out"] == "$OUT"  # no path of this machine (test_bench_paths.py)
    by_name = {r["name"]: r for r in report["results"]}
    for name in ("hf_all_positions", "gathered_torch_ce", "ours_torch"):
        assert by_name[name]["time_ms"] > 0 and by_name[name]["peak_mb"] > 0
    # The all-position baseline builds 4*32 x 2001 fp32 logits (1 MB); ours only the masked rows.
    assert by_name["hf_all_positions"]["peak_mb"] > by_name["ours_torch"]["peak_mb"]
    if torch.cuda.is_available():
        assert by_name["ours_triton"]["status"] == "ok"
    else:
        assert report["interpreter_check"].startswith("OK"), report["interpreter_check"]
    assert report["fp16_gradient_underflow"]["recompute_in_backward"]["zeroed_fraction"] == 0.0


def test_a_failing_variant_of_ours_fails_the_command(tmp_path, monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(bench_kernels.api, "masked_lm_loss", broken)
    code = bench_kernels.main(
        [
            "--batch",
            "2",
            "--seq",
            "16",
            "--hidden",
            "16",
            "--vocab",
            "301",
            "--repeat",
            "1",
            "--no-compile",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 1
    report = json.loads((tmp_path / "bench_kernels.json").read_text())
    row = next(r for r in report["results"] if r["name"] == "ours_torch")
    assert row["status"] == "failed" and "kernel exploded" in row["note"] and row["time_ms"] is None
    assert "ours_torch" in report["failed_ours"]
    assert "FAILED: ours_torch" in capsys.readouterr().err


def test_bad_sweep_arguments_are_explained(tmp_path):
    with pytest.raises(SystemExit, match="--sweep_vocabs"):
        bench_kernels.main(
            ["--sweep", "--no-head", "--sweep_vocabs", "big", "--out", str(tmp_path)]
        )
    with pytest.raises(SystemExit, match="nothing to measure"):
        bench_kernels.main(["--no-head"])


def test_the_kernel_library_imports_nothing_from_the_project():
    """kernels/ is a leaf: its modules import torch and triton, never the benchmarks, the trainer,
    the data pipeline or the shared foundation."""
    project = {"benchmarks", "bertforge", "data_prep", "pretrain", "tests"}
    found = []
    for path in sorted((REPO / "kernels").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            found += [f"{path.name}: {n}" for n in names if n.split(".")[0] in project]
    assert found == []
