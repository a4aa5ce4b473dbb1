"""What a step and a validation pass record, and what rank 0's console says of them (issue 55:
an RTD run's console showed ``loss 38.32``, MLM + 50 x the discriminator, and the generator's
validation loss; the discriminator, stuck at its prior, was visible in metrics.jsonl only)."""

from __future__ import annotations

import json
import math

import pytest

from bertforge.pretrain.components.console import progress_fields, validation_line
from bertforge.pretrain.components.metrics import MetricsWriter, read_metrics
from bertforge.pretrain.components.step_records import STEP_SUMS, loss_record, validation_record
from bertforge.pretrain.objectives.rtd import prior_loss


def _rtd_sums() -> dict[str, float]:
    """One step of 1,000 real tokens, 141 replaced, of which the discriminator found 2 (and
    called 3 replaced): the prior's regime docs/benchmarks.md measured."""
    sums = dict.fromkeys(STEP_SUMS, 0.0)
    sums.update(mlm_loss=7.2, mlm_correct=10.0, rtd_loss=0.40, rtd_correct=858.0)
    sums.update(rtd_tokens=1000.0, rtd_replaced=141.0, rtd_true_positive=2.0, rtd_predicted=3.0)
    return sums


def test_the_prior_loss_is_the_entropy_of_the_replaced_share():
    # docs/benchmarks.md: a replaced share of 14.1% has H = 0.406 nats, 13.7% 0.400
    assert prior_loss(0.141) == pytest.approx(0.406, abs=1e-3)
    assert prior_loss(0.137) == pytest.approx(0.400, abs=1e-3)
    assert prior_loss(0.5) == pytest.approx(math.log(2))
    assert prior_loss(0.0) == 0.0 and prior_loss(1.0) == 0.0


def test_an_rtd_step_records_both_networks_and_the_prior():
    rec = loss_record(_rtd_sums(), n_masked=150.0, world=1, rtd_weight=50.0)
    assert rec["loss"] == pytest.approx(7.2 + 50 * 0.40)
    assert rec["mlm_loss"] == 7.2 and rec["rtd_loss"] == 0.40
    assert rec["rtd_prior_loss"] == pytest.approx(prior_loss(0.141))
    assert rec["rtd_accuracy"] == pytest.approx(0.858)
    assert rec["rtd_precision"] == pytest.approx(2 / 3)
    assert rec["rtd_recall"] == pytest.approx(2 / 141)
    assert rec["rtd_replaced_share"] == pytest.approx(0.141)


def test_an_rtd_validation_record_has_the_discriminators_precision_and_recall():
    # generator: loss sum, correct, masked; discriminator: loss sum and the RTD_COUNTS
    rec = validation_record(4, 700.0, 10.0, 100.0, 400.0, 858.0, 1000.0, 141.0, 2.0, 3.0)
    assert rec["val_loss"] == 7.0 and rec["val_accuracy"] == 0.1
    assert rec["val_rtd_loss"] == pytest.approx(0.40)
    assert rec["val_rtd_prior_loss"] == pytest.approx(prior_loss(0.141))
    assert rec["val_rtd_accuracy"] == pytest.approx(0.858)
    assert rec["val_rtd_precision"] == pytest.approx(2 / 3)
    assert rec["val_rtd_recall"] == pytest.approx(2 / 141)
    assert rec["val_rtd_replaced_share"] == pytest.approx(0.141)
    assert "val_rtd_loss" not in validation_record(4, 700.0, 10.0, 100.0)  # MLM


def _step(rec: dict) -> dict:
    return {**rec, "step": 1, "lr": 1e-3, "tokens": 1000.0, "masked": 150.0, "samples": 8,
            "loss_scale": 1.0}  # fmt: skip


def test_the_console_shows_an_rtd_runs_networks_apart():
    rtd = _step(loss_record(_rtd_sums(), 150.0, 1, rtd_weight=50.0))
    rtd["tokens_per_s"] = 900.4
    fields = progress_fields(rtd)
    assert "loss" not in fields  # 27.2: MLM + 50 x the discriminator, neither network's
    assert fields["gen_mlm_loss"] == 7.2 and fields["disc_loss"] == 0.40
    assert fields["prior_loss"] == pytest.approx(prior_loss(0.141))
    assert fields["disc_rec"] == pytest.approx(2 / 141) and fields["tok_s"] == 900
    mlm = _step(loss_record(dict.fromkeys(STEP_SUMS, 0.0) | {"mlm_loss": 7.2}, 150.0, 1))
    mlm["tokens_per_s"] = 900.0
    assert list(progress_fields(mlm)) == ["loss", "lr", "tok_s"]  # no loss scale but in fp16
    assert list(progress_fields(mlm, loss_scaling=True)) == ["loss", "lr", "tok_s", "scale"]
    val = validation_record(4, 700.0, 10.0, 100.0, 400.0, 858.0, 1000.0, 141.0, 2.0, 3.0)
    assert validation_line(val) == (
        "validation step 4: generator MLM loss 7.0000 accuracy 0.1000 perplexity 1096.63; "
        "discriminator loss 0.4000 (prior 0.4068) accuracy 0.8580 precision 0.6667 "
        "recall 0.0142"
    )
    plain = validation_record(4, 700.0, 10.0, 100.0)
    assert validation_line(plain) == (
        "validation step 4: loss 7.0000 accuracy 0.1000 perplexity 1096.63"
    )


def test_the_writer_prints_those_lines_and_marks_a_resume(tmp_path, capsys):
    writer = MetricsWriter(
        tmp_path, rank=0, max_steps=4, start_step=2, log_interval=1, flops_per_token=None,
        peak_tflops=None, world_size=2, progress="lines",
    )  # fmt: skip
    writer.resumed(2, str(tmp_path / "checkpoints" / "step_00000002"), 61.5)
    rec = _step(loss_record(_rtd_sums(), 150.0, 1, rtd_weight=50.0))
    writer.step({**rec, "step": 3}, 1.0, 24)
    writer.eval(validation_record(3, 700.0, 10.0, 100.0, 400.0, 858.0, 1000.0, 141.0, 2, 3), 24)
    writer.close()
    out = capsys.readouterr()
    assert "train 3/4 step | gen_mlm_loss 7.2 disc_loss 0.4 prior_loss 0.4068 " in out.err
    assert "disc_acc 0.858 disc_prec 0.6667 disc_rec 0.01418 lr 0.001 tok_s 1000" in out.err
    assert "validation step 3: generator MLM loss 7.0000" in out.out
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines[0] == {
        "step": 2, "split": "resume", "checkpoint": str(tmp_path / "checkpoints" / "step_00000002"),
        "elapsed_s": 61.5, "world_size": 2,
    }  # fmt: skip
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [3]  # train only
