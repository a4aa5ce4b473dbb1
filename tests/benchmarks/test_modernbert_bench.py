"""benchmarks.training.modernbert: the --quick form runs both sides on the same shards and
prints the throughput table (its shape, not its numbers); the summary and the tables from
recorded runs (no launch). benchmarks.training.step_profile_modernbert, on the same prepared
folder: both sides timed, the shared ModernBERT pieces inside both forwards."""

from __future__ import annotations

import json

import pytest

from benchmarks.common import CPU_DS_CONFIG, REPO, precision_flags
from benchmarks.training import step_profile_modernbert
from benchmarks.training.modernbert import main, parse_args, print_tables, throughput_summary

HEADER = "| seq | arm | attention | runs | tokens/s median [min, max] | vs HF "


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """One prepared folder (held-out split, shards, the seeded initial weights) for both
    harnesses: each keeps a finished build and weights it finds there."""
    return tmp_path_factory.mktemp("modernbert_bench")


@pytest.mark.slow  # runs the trainer, the doctor or DeepSpeed as processes
def test_quick_runs_both_sides_and_prints_the_table(workdir, capsys):
    """The command in this process (``main``, what ``python -m benchmarks.training.modernbert``
    runs: its interpreter's start-up is not what is tested); each side's 2 ranks are launched."""
    tmp_path = workdir
    assert main(["--quick", "--workdir", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert HEADER in printed
    rows = [ln for ln in printed.splitlines() if ln.startswith("| 64 |")]
    assert [ln.split("|")[2].strip() for ln in rows] == ["hf", "ours-document"]
    result = json.loads((tmp_path / "modernbert.json").read_text())
    assert [r["attention"] for r in result["throughput"]] == ["full (packed, sdpa)", "document"]
    for row in result["throughput"]:
        assert row["tokens_per_s"]["median"] > 0 and row["peak_rss_mib"]["median"] > 0
        assert row["ranks_seen"] == [2]  # each rank found, loader workers not counted
    assert str(tmp_path) not in (tmp_path / "modernbert.json").read_text()  # portable paths


@pytest.mark.slow  # runs the trainer, the doctor or DeepSpeed as processes
def test_step_profile_times_the_shared_modernbert_pieces_on_both_sides(workdir, capsys):
    out = workdir / "profile.json"
    argv = ["--quick", "--workdir", str(workdir), "--steps", "2", "--warmup", "1", "--repeats", "1"]
    assert step_profile_modernbert.main([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "hf: rank 0, ms per optimizer step" in printed and "ours: rank 0" in printed
    runs = {r["side"]: r for r in json.loads(out.read_text())["runs"]}
    assert set(runs) == {"hf", "ours"} and all(set(r["ranks"]) == {"0", "1"} for r in runs.values())
    attention = {"hf": "sdpa", "ours": "bertforge_document"}
    for side, run in runs.items():
        sections = run["ranks"]["0"]
        for name, calls in (
            ("   encoder (ModernBertModel)", 1),
            ("   prediction head", 1),
            (f"    attention ({attention[side]}, all layers)", 3),  # modernbert-tiny: 3 layers
        ):
            assert sections[name]["calls_per_step"] == calls, (side, name, sections.get(name))
            assert sections[name]["ms_per_step"] > 0
        assert sections["iteration (step start to step start)"]["ms_per_step"] > 0
    assert "   ZeRO-2 gradient reduce" in runs["ours"]["ranks"]["0"]
    assert "  backward (DDP all-reduce inside)" in runs["hf"]["ranks"]["0"]


def _run(arm, seq, tps, rss_mib, attention="document", repeat=0):
    return {
        "arm": arm,
        "seq": seq,
        "repeat": repeat,
        "attention": attention,
        "tokens_per_s": tps,
        "peak_rss_bytes": [rss_mib * 2**19, rss_mib * 2**19],
    }


def test_summary_is_median_min_max_and_ratio_to_hf(capsys):
    runs = [_run("hf", 512, t, 1000, "full", i) for i, t in enumerate((90.0, 100.0, 130.0))]
    runs += [
        _run("ours-document", 512, t, 800, repeat=i) for i, t in enumerate((120.0, 110.0, 260.0))
    ]
    rows = throughput_summary(runs)
    assert rows[0]["tokens_per_s"] == {"median": 100.0, "min": 90.0, "max": 130.0}
    assert rows[1]["tokens_per_s_vs_hf"] == pytest.approx(1.2)
    assert rows[1]["paired_vs_hf"] == pytest.approx({"median": 4 / 3, "min": 1.1, "max": 2.0})
    assert rows[1]["peak_rss_mib"]["median"] == pytest.approx(800.0)
    assert rows[1]["peak_rss_vs_hf"] == pytest.approx(0.8)
    learning = {
        "rows": [
            {
                "arm": arm,
                "parameters": 10,
                "load_before": 1.0,
                "loss_at_half": 7.0,
                "loss_at_end": 6.5,
                "time_at_end": 180.0,
                "steps_at_end": 5,
            }
            for arm in ("hf", "ours-modernbert", "ours-bert")
        ]
    }
    print_tables({"throughput": rows, "learning": learning})
    out = capsys.readouterr().out
    assert (
        "| 512 | ours-document | document | 3 | 120 [110, 260] | 1.20x | 1.33 [1.10, 2.00] |" in out
    )
    assert "| ours-bert | 10 | 1.0 | 7.000 | 6.500 (180 s, 5) |" in out


def test_a_json_with_its_own_precision_sets_both_sides_and_is_given_once():
    """--ds_config zero2_bf16.json (bf16 enabled in the JSON): both sides run bf16 and our
    trainer gets no --precision (the pair would be refused: one home per setting); a JSON that
    enables another precision than --precision is refused naming both."""
    bf16 = REPO / "ds_configs" / "zero2_bf16.json"
    args = parse_args(["--ds_config", str(bf16)])
    assert args.precision == "bf16"
    assert precision_flags(bf16, "bf16") == {"ds_config": bf16}
    assert precision_flags(CPU_DS_CONFIG, "fp32") == {
        "ds_config": CPU_DS_CONFIG,
        "precision": "fp32",
    }
    with pytest.raises(SystemExit):
        parse_args(["--ds_config", str(bf16), "--precision", "fp32"])
    with pytest.raises(ValueError, match="enables bf16, the benchmark asks for fp32"):
        precision_flags(bf16, "fp32")


@pytest.mark.parametrize("arm", ["hf", "ours-modernbert", "ours-bert"])
def test_part_two_builds_every_arms_launch_from_per_hours_commands(arm, tmp_path, monkeypatch):
    """Part 2 reuses per_hour's command builders with a namespace of its own: every field they
    read must be in it (part 2 broke twice when per_hour gained one). Nothing is launched."""
    from benchmarks.training import modernbert

    launched = []

    def launch(cmd, _ns, log, *_args, **_kw):
        assert log.parent.is_dir(), f"{arm} launched first would have nowhere to log"
        launched.append(cmd)
        if arm == "hf":  # what HF's callback leaves behind
            (tmp_path / "learn" / "hf" / "snapshots.json").write_text("[]")

    monkeypatch.setattr(modernbert, "launch", launch)
    monkeypatch.setattr(modernbert, "ours_snapshots", lambda *a: [])
    monkeypatch.setattr(modernbert, "export_ours", lambda *a: None)
    args = parse_args(["--budget_s", "60", "--compile", "on", "--workdir", str(tmp_path)])
    data = {"shards": {args.learn_seq: tmp_path / "shards"}, "init": tmp_path / "init"}
    assert modernbert.train_for_budget(args, data, tmp_path, arm) == []
    (cmd,) = launched
    if arm != "hf":
        assert "--max_time_hours" in cmd and "--compile" in cmd, cmd
        assert ("--arch" in cmd) == (arm == "ours-modernbert"), cmd


@pytest.mark.parametrize("compiled", [False, True])
def test_step_profile_profiles_the_compiled_arms_when_asked(compiled, tmp_path, monkeypatch):
    """``--compile on`` / ``--hf_compile on`` reach each side's launch (nothing is launched)."""
    from benchmarks.learning import per_hour

    launched = {}
    monkeypatch.setattr(per_hour, "launch", lambda cmd, *a, **k: launched.setdefault("cmd", cmd))
    monkeypatch.setattr(step_profile_modernbert.sp, "rank_reports", lambda out: {})
    on = "on" if compiled else "off"
    mine, args = step_profile_modernbert.parse_args(["--compile", on, "--hf_compile", on])
    data = {"shards": {512: tmp_path / "shards"}, "init": tmp_path / "init"}
    step_profile_modernbert.run_side("ours", args, data, 512, mine, tmp_path, tmp_path / "ours")
    cmd = launched.pop("cmd")
    assert cmd[cmd.index("--compile") + 1] == str(compiled).lower(), cmd
    step_profile_modernbert.run_side("hf", args, data, 512, mine, tmp_path, tmp_path / "hf")
    assert ("--torch_compile" in launched["cmd"]) == compiled, launched["cmd"]
