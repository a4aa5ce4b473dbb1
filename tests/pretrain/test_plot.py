"""python -m pretrain.plot draws the loss against wall-clock time as well as against steps; every
panel names its axes with their units, the loss scale is drawn for fp16 loss scaling only, a
resume is marked, and an RTD run gets its discriminator against the prior (issue 55)."""

from __future__ import annotations

import json

import pytest

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


# --- issue 55: axis labels and units, the loss scale for fp16 only, resumes, the discriminator


def _step_record(step: int, **over) -> dict:
    return {"step": step, "loss": 9.0 - 0.3 * step, "mlm_loss": 9.0 - 0.3 * step,
            "mlm_accuracy": 0.01 * step, "lr": 1e-3, "loss_scale": 1.0, "grad_norm": 1.5,
            "tokens": 4096.0, "masked": 600.0, "samples": 32, **over}  # fmt: skip


def _figures(path):
    from bertforge.pretrain.plot import figures, load

    return figures(load(path))


def _axes_with_data(figs: dict) -> list:
    return [ax for fig in figs.values() for ax in fig.axes if ax.lines]


def _close(figs: dict) -> None:
    import matplotlib.pyplot as plt

    for fig in figs.values():
        plt.close(fig)


def test_every_panel_names_its_axes_with_units(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    _write(metrics, [{**_step_record(s), "tokens_per_s": 900.0} for s in range(1, 5)])
    figs = _figures(metrics)
    axes = _axes_with_data(figs)
    assert len(axes) == 2 * 5  # five panels, each in its own figure and in the overview
    assert all(ax.get_xlabel() == "optimizer step" and ax.get_ylabel() for ax in axes)
    labels = {ax.get_title(): ax.get_ylabel() for ax in axes}
    assert labels["loss"] == "loss (nats per masked token)"
    assert labels["throughput"] == "tokens per second (all ranks)"
    assert labels["gradient norm"] == "L2 norm of the gradients, before clipping"
    _close(figs)


def test_the_loss_scale_panel_is_drawn_for_fp16_loss_scaling_only(tmp_path):
    fp32, fp16 = tmp_path / "fp32.jsonl", tmp_path / "fp16.jsonl"
    _write(fp32, [_step_record(s) for s in range(1, 5)])  # fp32 and bf16 record a scale of 1
    _write(fp16, [_step_record(s, loss_scale=2.0 ** (17 - s)) for s in range(1, 5)])
    figs = _figures(fp32)
    assert "loss_scale" not in figs
    assert not any("loss scale" in ax.get_title() for ax in figs["overview"].axes)
    _close(figs)
    assert main([str(fp32), "--out", str(tmp_path / "p32")]) == 0
    assert not (tmp_path / "p32" / "loss_scale.png").exists()
    figs = _figures(fp16)
    assert figs["loss_scale"].axes[0].get_yscale() == "log"
    assert figs["loss_scale"].axes[0].get_ylabel() == "loss scale (log)"
    _close(figs)
    assert main([str(fp16), "--out", str(tmp_path / "p16")]) == 0
    assert (tmp_path / "p16" / "loss_scale.png").is_file()


def _resume_marks(ax) -> list[float]:
    return [line.get_xdata()[0] for line in ax.lines if line.get_label() == "_resumed"]


def test_a_resumed_run_marks_the_step_it_resumed_after(tmp_path):
    """The trainer's writer records a resume (``"split": "resume"``); every step panel marks
    it half a step after the checkpoint's step, and loss_vs_time.png at its training time."""
    from bertforge.pretrain.components.metrics import MetricsWriter

    def writer(start: int) -> MetricsWriter:
        return MetricsWriter(tmp_path, rank=0, max_steps=6, start_step=start, log_interval=1,
                             flops_per_token=None, peak_tflops=None, world_size=1,
                             progress=False)  # fmt: skip

    first = writer(0)
    for s in range(1, 5):  # the first launch got to step 4; its checkpoint is step 3's
        first.step({**_step_record(s), "elapsed_s": 10.0 * s}, 1.0, 32 * s)
    first.close()
    second = writer(3)  # drops step 4's record, as a resume from step 3 does
    second.resumed(3, str(tmp_path / "checkpoints" / "step_00000003"), 30.0)
    for s in range(4, 7):
        second.step({**_step_record(s), "elapsed_s": 10.0 * s + 15.0}, 1.0, 32 * s)
    second.close()
    figs = _figures(tmp_path / "metrics.jsonl")
    axes = _axes_with_data(figs)
    assert axes and all(_resume_marks(ax) == [3.5] for ax in axes)
    assert all("resumed after 3" in [t.get_text().strip() for t in ax.texts] for ax in axes)
    _close(figs)
    plain = tmp_path / "plain.jsonl"
    _write(plain, [_step_record(s) for s in range(1, 7)])
    figs = _figures(plain)
    assert not any(_resume_marks(ax) for ax in _axes_with_data(figs))
    _close(figs)


def test_an_rtd_run_plots_the_generator_and_the_discriminator_against_its_prior(tmp_path):
    def rtd(s: int) -> dict:
        disc = {"rtd_loss": 0.41, "rtd_accuracy": 0.859, "rtd_precision": 0.0,
                "rtd_recall": 0.002, "rtd_replaced_share": 0.141}  # fmt: skip
        return _step_record(s, loss=9.0 + 50 * 0.41, **disc)

    metrics = tmp_path / "metrics.jsonl"
    _write(metrics, [rtd(s) for s in range(1, 5)])  # before rtd_prior_loss was recorded
    figs = _figures(metrics)
    loss = figs["loss"].axes[0]
    assert loss.get_title() == "generator MLM loss"
    assert max(loss.lines[0].get_ydata()) < 9  # mlm_loss, not loss = MLM + 50 x RTD
    disc = [ax for ax in figs["overview"].axes if ax.get_title().startswith("discriminator")]
    assert len(disc) == 2 and len(figs["rtd"].axes) == 2
    prior = [ln for ln in disc[0].lines if ln.get_label().startswith("prior")]
    assert prior and prior[0].get_linestyle() == "--"
    assert prior[0].get_ydata()[0] == pytest.approx(0.406, abs=1e-3)  # H(0.141)
    scores = {ln.get_label(): ln.get_ydata()[0] for ln in disc[1].lines}
    assert scores["prior accuracy (1 - replaced share)"] == pytest.approx(0.859)
    assert scores["recall"] == 0.002
    _close(figs)
