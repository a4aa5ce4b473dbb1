"""The sliding-window benchmark (`python -m benchmarks.training.local_attention`): the command
docs/benchmarks.md shows runs in its --quick form and writes the table it documents."""

from __future__ import annotations

import json

from helpers.docs_commands import documented_commands

from benchmarks.training import local_attention

ENTRY = "benchmarks.training.local_attention"
LAYER_ARMS = ["blocked", "dense band", "full"]
MODEL_ARMS = ["all global", "1-in-3 global"]


def test_the_documented_command_runs_quick_and_writes_the_table(tmp_path, capsys):
    commands = documented_commands((ENTRY,))
    assert commands, f"docs show no `python -m {ENTRY}` command"
    _, _, argv = commands[0]
    out = tmp_path / "local_attention.json"
    assert local_attention.main(argv[2:] + ["--quick", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["command"] == f"python -m {ENTRY} --quick" and res["repeat"] == 2
    assert list(res["layer"]) == ["256", "512"]
    for rows in res["layer"].values():
        assert list(rows) == LAYER_ARMS and rows["blocked"]["x_base"] == 1.0
        for r in rows.values():
            assert 0 < r["min_s"] <= r["median_s"] <= r["max_s"] and r["peak_tensor_mib"] > 0
    model = res["model_step"]
    assert model["seq_len"] == 512 and list(model["arms"]) == MODEL_ARMS
    assert model["arms"]["1-in-3 global"]["x_base"] == 1.0
    # The printed table: a header, a rule and one row per (length, arm); then the model's.
    printed = capsys.readouterr().out
    assert printed.count("| 256 |") == 3 and printed.count("| 512 |") == 3
    assert "| 1-in-3 global |" in printed and res["table"] in printed
