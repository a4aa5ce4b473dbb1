"""benchmarks.evaluation.glue_throughput: a tiny run of both sides on the real all-MiniLM-L6-v2
and the SST-2 and STS-B slices (one repeat, two steps a side) prints the table and writes the
runs, so the command cannot rot; its summary arithmetic on recorded runs (no model)."""

from __future__ import annotations

import json

import pytest

from benchmarks.evaluation.glue_throughput import main, summarize, table

PEARSON = {"pearson", "spearmanr"}
HEADER = "| side | runs | train examples/s median [min, max] | vs Trainer | padded tokens/s"


@pytest.mark.parametrize(("task", "metrics"), [("SST-2", {"accuracy"}), ("STS-B", PEARSON)])
def test_tiny_run_of_both_sides(tmp_path, capsys, task, metrics):
    """The command in this process (``main``, what ``python -m
    benchmarks.evaluation.glue_throughput`` runs), on a classification task and the regression."""
    out = tmp_path / "throughput.json"
    argv = ["--task", task, "--repeats", "1", "--max_train_examples", "16", "--batch_size", "8"]
    argv += ["--max_dev_examples", "8", "--max_length", "32", "--warmup", "1", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert HEADER in printed
    rows = [ln.split("|")[1].strip() for ln in printed.splitlines() if ln.startswith("| ")]
    assert rows[1:] == ["ours", "trainer"]
    record = json.loads(out.read_text())
    assert [r["side"] for r in record["runs"]] == ["ours", "trainer"]  # repeat 0: ours first
    for r in record["runs"]:
        assert (r["steps"], r["train_examples"]) == (2, 16)
        assert r["train_seconds"] > 0 and r["train_cpu_seconds"] > 0
        assert set(r["scores"]["dev"]) == metrics
        assert 16 * 2 < r["train_tokens"] <= 16 * 32  # padded, at most max_length a row
    assert record["summary"]["ratio"] > 0


def _run(side: str, repeat: int, per_s: float) -> dict:
    extra = {"hf_train_samples_per_second": per_s} if side == "trainer" else {}
    scores = {"dev": {"accuracy": 0.5 + repeat / 10}}
    run = {"side": side, "repeat": repeat, "train_examples_per_second": per_s, "scores": scores}
    run |= {"train_tokens": 100 * per_s, "train_seconds": 1.0, "train_examples": 2 * per_s}
    run["train_cpu_seconds"] = 1.0 if side == "ours" else 2.0
    return run | extra


def test_summary_medians_and_per_repeat_ratios():
    runs = [_run("ours", 0, 10.0), _run("trainer", 0, 20.0)]
    runs += [_run("trainer", 1, 10.0), _run("ours", 1, 12.0)]
    runs += [_run("ours", 2, 30.0), _run("trainer", 2, 15.0)]
    s = summarize(runs)
    assert (s["ours"]["median"], s["trainer"]["median"]) == (12.0, 15.0)
    assert s["ratio"] == pytest.approx(0.8)
    assert s["paired_ratio"] == {"median": 1.2, "min": 0.5, "max": 2.0}
    assert s["paired_cpu_ratio"] == {"median": 2.0, "min": 2.0, "max": 2.0}
    rows = table(s, runs).splitlines()[2:]
    assert rows == [
        "| ours | 3 | 12.00 [10.00, 30.00] | 0.80x | 1200 [1000, 3000] | 24.00 [20.00, 60.00] "
        "| accuracy 0.600 |",
        "| trainer | 3 | 15.00 [10.00, 20.00] | 1.00x | 1500 [1000, 2000] | 15.00 [10.00, 20.00] "
        "| accuracy 0.600 |",
    ]
