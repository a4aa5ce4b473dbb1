"""benchmarks.training.collectives: both gradient exchanges run on real gloo ranks and are
reported per dtype, the all-reduce first (the ratio's base)."""

from __future__ import annotations

import json

from benchmarks.training import collectives
from bertforge.pretrain.distributed.startup import free_port


def test_both_exchanges_are_timed_per_dtype(tmp_path, capfd):
    out = tmp_path / "collectives.json"
    args = ["--elements", "4096", "--repeats", "2", "--dtype", "bf16", "fp32"]
    assert collectives.main([*args, "--port", str(free_port()), "--out", str(out)]) == 0
    rows = [line for line in capfd.readouterr().out.splitlines() if line.startswith("| bf")]
    assert len(rows) == 2 and rows[0].endswith("| 1.00x |"), rows
    results = json.loads(out.read_text())["results"]
    assert [(r["dtype"], len(r["ms"])) for r in results] == [("bf16", 2)] * 2 + [("fp32", 2)] * 2
