"""experiments.budget (issue 52): the arms are the standard BERT recipe, each lever of
recipes/budget.yaml alone and the whole recipe; the arms alternate within a seed round; the time
to the standard's final loss is read from the held-out curve; the quick form (CI) trains both
arms of the long stage for two seeds, scores them with the GLUE harness and writes a portable
summary."""

from __future__ import annotations

import argparse
import json

import pytest
import yaml

from experiments.budget import (
    BUDGET,
    LEVER_ARMS,
    LEVERS,
    RECIPE,
    STANDARD,
    STANDARD_FLAGS,
    arm_flags,
    arm_order,
    main,
    time_to,
)


def test_each_lever_is_the_recipes_value_added_alone_to_the_standard():
    a = argparse.Namespace(global_batch_size=64)
    recipe = yaml.safe_load(RECIPE.read_text())
    assert arm_flags(STANDARD, a) == STANDARD_FLAGS
    assert arm_flags("+lr", a)["lr"] == recipe["optim"]["lr"]
    assert arm_flags("+mask", a)["mask_prob"] == recipe["masking"]["mask_prob"]
    nodrop = arm_flags("+no_dropout", a)
    assert nodrop["hidden_dropout_prob"] == recipe["model"]["hidden_dropout_prob"] == 0.0
    wsd = arm_flags("+wsd", a)
    assert wsd["schedule"] == recipe["optim"]["schedule"] == "wsd" and "decay" not in wsd
    assert wsd["decay_fraction"] == recipe["optim"]["decay_fraction"]
    assert wsd["warmup_ratio"] == recipe["optim"]["warmup_ratio"]
    assert arm_flags("+ramp", a)["batch_ramp_start"] == 16
    for arm in LEVERS:  # every other flag is the standard's
        changed = {k for k, v in arm_flags(arm, a).items() if STANDARD_FLAGS.get(k) != v}
        assert changed <= set(LEVERS[arm]) | {"decay"}, arm
    assert arm_flags(BUDGET, a)["recipe"] == RECIPE
    assert recipe["optim"]["schedule_clock"] == "time"


def test_arms_alternate_within_each_seed_round():
    rounds = [arm_order(LEVER_ARMS, i) for i in range(len(LEVER_ARMS))]
    assert all(sorted(r) == sorted(LEVER_ARMS) for r in rounds)
    assert [r[0] for r in rounds] == list(LEVER_ARMS)  # each arm opens one round


def test_time_to_target_interpolates_between_validations():
    curve = [[10.0, 8.0], [20.0, 6.0], [30.0, 5.0]]
    assert time_to(curve, 7.0) == pytest.approx(15.0)
    assert time_to(curve, 8.5) == 10.0 and time_to(curve, 5.0) == 30.0
    assert time_to(curve, 4.0) is None


@pytest.mark.slow
def test_quick_trains_both_arms_scores_glue_and_writes_portable_json(tmp_path, capsys):
    out = tmp_path / "budget"
    results = tmp_path / "budget.json"
    assert main(["--out", str(out), "--quick", "--results", str(results)]) == 0
    table = capsys.readouterr().out
    rows = [line for line in table.splitlines() if line.startswith("| ")][1:]  # after the header
    assert [r.split(" | ")[0][2:] for r in rows] == [STANDARD, BUDGET]
    summary = json.loads(results.read_text(encoding="utf-8"))
    text = results.read_text(encoding="utf-8")
    assert str(tmp_path) not in text and "/work/" not in text
    long = summary["stages"]["long"]
    assert long["seeds"] == [1, 2]
    std, bud = long["arms"][STANDARD], long["arms"][BUDGET]
    # the standard reaches its own final loss at its final validation, a moment after its last
    # step (the fraction's denominator)
    assert std["time_fraction"] and all(0 < f <= 1.05 for f in std["time_fraction"])
    assert len(bud["time_fraction"]) == 2 and bud["tokens"]["median"] > 0
    assert set(bud["loss_vs_standard"]) >= {"mean", "low", "high"}
    for task in ("SST-2", "STS-B"):
        assert len(bud[task]["values"]) == 2 and task + "_vs_standard" in bud
    # a second call finds every run and the GLUE scores done and only writes the tables
    assert main(["--out", str(out), "--quick"]) == 0
