"""`python -m kernels.bench` runs end to end at a tiny shape and writes its table, JSON and plot."""

from __future__ import annotations

import json

from conftest import run_cli


def test_bench_runs_and_reports(tmp_path):
    proc = run_cli("-m", "kernels.bench", "--batch", "4", "--seq", "32", "--hidden", "32",
                   "--vocab", "2001", "--repeat", "1", "--no-compile", "--out", str(tmp_path),
                   env={"TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "bench_kernels.json").read_text())
    assert (tmp_path / "bench_kernels.png").stat().st_size > 1000
    by_name = {r["name"]: r for r in report["results"]}
    for name in ("hf_all_positions", "gathered_torch_ce", "ours_torch"):
        assert by_name[name]["time_ms"] > 0 and by_name[name]["peak_mb"] > 0
    # The all-position baseline builds 4*32 x 2001 fp32 logits (1 MB); ours only the masked rows.
    assert by_name["hf_all_positions"]["peak_mb"] > by_name["ours_torch"]["peak_mb"]
    assert report["interpreter_check"].startswith("OK"), report["interpreter_check"]
    assert report["fp16_gradient_underflow"]["recompute_in_backward"]["zeroed_fraction"] == 0.0
    assert "hf_all_positions" in proc.stdout and "speedup" in proc.stdout
