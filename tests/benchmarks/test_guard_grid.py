"""benchmarks.training.guard_grid: the cells it runs (sizes x lrs x seeds per arch, then the
divergences), how it judges a run from its metrics.jsonl, and the summary lines docs/guard.md
quotes. The runs themselves are the trainer's (tests/pretrain/stability/test_guard.py)."""

from __future__ import annotations

import json

import pytest

from benchmarks.training import guard_grid
from bertforge.pretrain.config import command_line


def test_the_default_grid_is_both_archs_at_both_sizes_then_the_divergences():
    class Args:
        archs = ["bert", "modernbert"]
        lrs, seeds = [1e-3, 2e-3, 3e-3], [1, 2, 3]
        small_lrs, small_seeds = [3e-3], [1, 2, 3]
        nan_step, absurd_lr = 100, 1.0

    cells = guard_grid.grid(Args)
    healthy = [c for c in cells if c.kind == "healthy"]
    assert len(healthy) == 2 * 9 + 2 * 3
    assert {(c.arch, c.size) for c in healthy} == set(guard_grid.SIZES)
    assert sorted({c.seed for c in healthy}) == [1, 2, 3]
    diverging = [(c.arch, c.kind, c.lr, c.faults) for c in cells if c.kind != "healthy"]
    assert diverging == [
        ("bert", "nan", 2e-3, "loss_nan@100"),
        ("bert", "absurd_lr", 1.0, ""),
        ("modernbert", "nan", 2e-3, "loss_nan@100"),
        ("modernbert", "absurd_lr", 1.0, ""),
    ]
    names = [c.name for c in cells]
    assert len(set(names)) == len(names)  # one folder per run
    assert "bert_healthy_lr0.001_s1" in names  # tiny keeps the names of earlier grids
    assert "modernbert_small_healthy_lr0.003_s3" in names


@pytest.mark.parametrize("arch,size", sorted(guard_grid.SIZES))
def test_every_size_is_a_model_the_trainer_parses(arch, size, english_shards):
    from bertforge.pretrain.config.cli import parse_args

    flags = command_line.flags(
        {"data": english_shards, "arch": arch, **guard_grid.SIZES[(arch, size)]}, switches=False
    )
    model = parse_args(flags).model_cfg
    assert model.arch == arch
    assert (model.hidden_size, model.num_hidden_layers) == (
        (128, 2 if arch == "bert" else 3) if size == "tiny" else (512, 4)
    )


def _metrics(path, losses, guard=()):
    rows = [
        {"split": "train", "step": i + 1, "loss": x, "grad_norm": 1.0} for i, x in enumerate(losses)
    ]
    rows += [{"split": "guard", **g} for g in guard]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_falling_run_the_guard_ended_is_a_false_positive_a_skip_is_counted_apart(tmp_path):
    falling = [8.0 - 0.1 * i for i in range(30)]
    cell = guard_grid.Cell("bert", 3e-3, 1, "healthy")
    ended = guard_grid.judge(
        cell, 6, _metrics(tmp_path / "a.jsonl", falling, [
            {"step": 20, "event": "spikes_in_window", "action": "give_up", "rollbacks": 1}
        ]),
    )  # fmt: skip
    assert ended.loss_falls and ended.verdict == "FALSE POSITIVE"
    skipped = guard_grid.judge(
        cell, 0, _metrics(tmp_path / "b.jsonl", falling, [
            {"step": 12, "event": "loss_spike", "action": "skip"},
            {"step": 14, "event": "grad_norm_spike", "action": "ok"},
        ]),
    )  # fmt: skip
    assert skipped.verdict == "ok" and skipped.skips == 1
    assert skipped.events == {"loss_spike:skip": 1, "grad_norm_spike:ok": 1}
    nan = guard_grid.judge(
        guard_grid.Cell("bert", 2e-3, 1, "nan", "loss_nan@20"), 0,
        _metrics(tmp_path / "c.jsonl", falling, [
            {"step": 20, "event": "loss_nonfinite", "action": "rollback", "rollbacks": 1}
        ]),
    )  # fmt: skip
    assert nan.verdict == "caught"
    missed = guard_grid.judge(
        guard_grid.Cell("bert", 1.0, 1, "absurd_lr"), 0, _metrics(tmp_path / "d.jsonl", falling)
    )
    assert missed.verdict == "MISSED"
    text = guard_grid.table([ended, skipped, nan, missed])
    assert "healthy runs ended or rolled back by the guard: 1 of 2" in text
    assert "in healthy runs: 1, in 1 runs" in text
    assert "divergences caught: 1 of 2" in text
    assert "| bert | tiny | healthy | 0.003 | 1 | 6 |" in text
