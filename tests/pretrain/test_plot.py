"""python -m pretrain.plot draws the loss against wall-clock time as well as against steps."""

from __future__ import annotations

import json

from bertforge.pretrain.plot import _time_series, main


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_loss_is_drawn_against_elapsed_seconds(tmp_path):
    train = [
        {"step": s, "loss": 10.0 - s, "lr": 1e-3, "tokens_per_s": 100.0, "elapsed_s": 30.0 + 5 * s}
        for s in range(1, 7)
    ]
    val = [
        {"step": 3, "split": "validation", "val_loss": 7.5, "val_accuracy": 0.1, "elapsed_s": 46.0},
        # an older run's record without elapsed_s: drawn at the time of the step it follows
        {"step": 6, "split": "validation", "val_loss": 5.5, "val_accuracy": 0.2},
    ]
    metrics = tmp_path / "metrics.jsonl"
    _write(metrics, train[:3] + val[:1] + train[3:] + val[1:])
    elapsed = {r["step"]: r["elapsed_s"] for r in train}
    assert _time_series(val, "val_loss", elapsed) == ([46.0, 60.0], [7.5, 5.5])
    assert _time_series(train, "loss", elapsed)[0] == [35.0, 40.0, 45.0, 50.0, 55.0, 60.0]
    assert main([str(metrics), "--out", str(tmp_path / "plots")]) == 0
    assert (tmp_path / "plots" / "loss_vs_time.png").stat().st_size > 5000
    assert (tmp_path / "plots" / "loss.png").is_file()  # the step panels are still drawn


def test_records_without_any_time_skip_the_time_plot(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    _write(metrics, [{"step": 1, "loss": 3.0, "lr": 1e-3}])
    assert main([str(metrics), "--out", str(tmp_path / "plots")]) == 0
    assert not (tmp_path / "plots" / "loss_vs_time.png").exists()


def test_phases_are_shaded_and_named_in_the_step_panels(tmp_path):
    from bertforge.pretrain.plot import phase_spans

    names = ["warmup"] * 3 + ["stable"] * 4 + ["decay"] * 3
    train = [
        {"step": s, "loss": 9.0 - 0.5 * s, "lr": 1e-3, "phase": name, "elapsed_s": 2.0 * s}
        for s, name in enumerate(names, start=1)
    ]
    assert phase_spans(train) == [("warmup", 1, 3), ("stable", 4, 7), ("decay", 8, 10)]
    assert phase_spans([{"step": 1, "loss": 3.0}]) == []  # a run without phases: no bands
    metrics = tmp_path / "metrics.jsonl"
    _write(metrics, train)
    plain = tmp_path / "plain.jsonl"
    _write(plain, [{k: v for k, v in r.items() if k != "phase"} for r in train])
    assert main([str(metrics), "--out", str(tmp_path / "phased")]) == 0
    assert main([str(plain), "--out", str(tmp_path / "plain")]) == 0
    # The bands and their names are drawn: the shaded PNG differs from the plain one.
    phased = (tmp_path / "phased" / "loss.png").read_bytes()
    assert phased != (tmp_path / "plain" / "loss.png").read_bytes()
    import matplotlib.pyplot as plt

    from bertforge.pretrain.plot import shade_phases

    fig, ax = plt.subplots()
    shade_phases(ax, phase_spans(train))
    bands = [patch.get_x() for patch in ax.patches]
    assert bands == [0.5, 3.5, 7.5]  # each phase from half a step before its first step
    assert [t.get_text() for t in ax.texts] == ["warmup", "stable", "decay"]
    plt.close(fig)
