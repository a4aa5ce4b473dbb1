"""The chaos test, CI form: a 2-rank ZeRO-2 run (tiny model, dropout on) killed five times at
seeded random moments (inside steps, inside a save, inside a validation pass, during start-up,
during the first build of DeepSpeed's ops; SIGKILL to one rank or SIGTERM to the whole job),
restarted each time with ``--resume auto``, ends bit-identical to an uninterrupted run: every
logged loss (redone steps included), the final weights, and nothing left behind (shared memory,
the run lock, a torch build lock, a partial checkpoint folder).

The harness is ``benchmarks/training/chaos.py``; its long form (``--kills 30``) and its figures
are in docs/reliability.md, "Chaos". Seed 0 draws save/kill, op_build/kill, step/kill,
startup/term and validation/term: a SIGKILL mid-save (a checkpoint that must never be taken by a
resume), a SIGKILL of the rank building an op (torch's lock left behind, which the next launch
must remove instead of waiting forever) and a SIGKILL mid-steps (steps redone, which must draw
the same dropout and masks again).
"""

from __future__ import annotations

import json

import pytest

from benchmarks.training import chaos, chaos_summary

KILLS, STEPS, SEED = 5, 30, 0


def test_the_plan_covers_every_moment_and_both_signals():
    kinds = chaos.kinds_for(SEED, KILLS)
    assert {m for m, _ in kinds} == set(chaos.MOMENTS)
    assert {("save", "kill"), ("step", "kill"), ("op_build", "kill")} <= set(kinds)
    assert chaos.kinds_for(SEED, KILLS) == kinds  # a function of the seed alone
    ten = chaos.kinds_for(3, 10)
    assert sorted(ten) == sorted((m, s) for m in chaos.MOMENTS for s in chaos.SIGNALS)


@pytest.mark.slow
def test_five_kills_end_bit_identical_to_the_uninterrupted_run(english_shards, tmp_path):
    settings = chaos.Settings(steps=STEPS, kills=KILLS, seed=SEED, save_interval=5, eval_interval=7)
    summary = chaos.chaos(settings, english_shards, tmp_path)
    text = chaos.report(summary)
    assert summary["passed"], text
    assert summary["kills_survived"] == KILLS, text
    assert {k.split("/")[0] for k in summary["survived_by_kind"]} == set(chaos.MOMENTS), text
    assert summary["steps_redone"] > 0, text  # the SIGKILL mid-steps made the run redo steps
    # The op_build SIGKILL left torch's lock (unless the other rank removed it before the
    # launcher stopped it); either way the relaunch built the op instead of waiting forever.
    built = [k for k in summary["kills"] if k["moment"] == "op_build"]
    assert len(built) == 1 and (built[0]["left_build_lock"] <= built[0]["next_cleared_build_lock"])
    assert (tmp_path / "chaos_summary.json").is_file()
    assert str(tmp_path) not in (tmp_path / "chaos_summary.json").read_text()  # relative paths


def test_records_count_only_once_the_launch_has_rewritten_the_metrics(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(f'{{"step": {i}, "loss": {i}.0}}\n' for i in range(1, 9)))
    watch = chaos.MetricsWatch(path, resume_step=5)
    assert watch.poll() == {} and watch.records() == []  # steps 6-8: the killed launch's
    tmp = tmp_path / "new"
    tmp.write_text("".join(f'{{"step": {i}, "loss": {i}.5}}\n' for i in range(1, 7)))
    tmp.replace(path)  # the trainer's atomic rewrite, then its own step 6
    assert list(watch.poll()) == [6]
    assert watch.records() == [{"split": "train", "step": 6, "loss": 6.5}]


def test_a_launch_whose_port_was_taken_is_started_again(tmp_path, monkeypatch):
    """Another job taking the rendezvous port between free_port and the rendezvous (a race of
    concurrent jobs) costs a retry on a new port, not a failed chaos run; the kill the caller
    holds is the retry's."""
    attempts = []

    def fake_launch(index, s, args, logs, run, kill, extensions=None):
        attempts.append(kill)
        taken = len(attempts) == 1
        (logs / "launch_00.log").write_text(chaos.PORT_TAKEN + " 1234" if taken else "ok")
        kill["fired"] = not taken
        return chaos.Launch(
            index, 0, None, 0 if taken else 5, 1 if taken else 0, 1234, "launch_00.log", kill=kill
        )

    monkeypatch.setattr(chaos, "run_launch", fake_launch)
    kill = {"moment": "step"}
    launch = chaos.launch_on_a_free_port(0, None, [], tmp_path, tmp_path, kill)
    assert len(attempts) == 2 and launch.exit_code == 0 and launch.reached == 5
    assert kill == {"moment": "step", "fired": True} and launch.kill is kill
    assert (tmp_path / "launch_00.port_taken_1.log").is_file()


def _launch(index, expected, resumed_at, reached, code, kill=None, records=(), **times):
    return chaos.Launch(
        index, expected, resumed_at, reached, code, 7000 + index, f"launch_{index:02d}.log",
        cmd=f"cmd {index}", kill=kill, records=list(records), **times,
    )  # fmt: skip


def _train(step, loss):
    return {"split": "train", "step": step, "loss": loss}


def _summarize(tmp_path, monkeypatch, s, launches, pending, final_steps, weights, left):
    """summarize() on fabricated launches: the reference logged loss ``step`` at each step."""
    (tmp_path / "chaos").mkdir()
    (tmp_path / "chaos" / "metrics.jsonl").write_text(
        "".join(json.dumps(_train(i, float(i))) + "\n" for i in final_steps)
    )
    monkeypatch.setattr(chaos_summary, "same_weights", lambda run, ref, steps: weights)
    monkeypatch.setattr(chaos_summary, "leftovers", lambda run, ports: left if ports else [])
    ref_launch = _launch(0, 0, None, s.steps, 0)
    ref = {"launch": ref_launch, "losses": {("train", i): float(i) for i in range(1, s.steps + 1)}}
    summary = chaos_summary.summarize(s, tmp_path, ref, 10.0, 0.5, launches, 20.0, pending)
    assert json.loads((tmp_path / "chaos_summary.json").read_text()) == summary
    return summary


def test_the_summary_of_a_run_that_survived_costs_each_kill(tmp_path, monkeypatch):
    kill = {"moment": "step", "signal": "kill", "rank": 1, "fired": True, "faults": None}
    launches = [
        _launch(0, 0, 0, 1, -9, kill, [_train(1, 1.0)], startup_s=2.0, exit_s=0.5),
        _launch(1, 0, 0, 2, 0, None, [_train(1, 1.0), _train(2, 2.0)], startup_s=1.5),
    ]
    s = chaos.Settings(steps=2, kills=1)
    summary = _summarize(tmp_path, monkeypatch, s, launches, [], [1, 2], [], [])
    assert summary["passed"] and summary["problems"] == []
    assert summary["kills"] == [
        {
            "moment": "step",
            "signal": "kill",
            "rank": 1,
            "fired": True,
            "planned_fault": None,
            "launch": 0,
            "reached_step": 1,
            "exit_code": -9,
            "resumed_at": 0,
            "next_cleared_build_lock": False,
            "steps_redone": 1,
            "exit_s": 0.5,
            "relaunch_s": 2.0,  # its exit + the next launch's start-up
            "lost_s": 2.5,  # + one redone step of 0.5 s
        }
    ]
    assert summary["kills_survived"] == 1 and summary["survived_by_kind"] == {"step/kill": 1}
    assert (summary["steps_redone"], summary["lost_s_per_kill_mean"]) == (1, 2.5)
    assert (summary["command"], summary["resume_command"]) == ("cmd 0", "cmd 1")
    assert summary["logs"] == ["chaos_logs/launch_00.log", "chaos_logs/launch_01.log"]
    assert summary["launch_details"][1] == {
        "index": 1, "resume_expected": 0, "resumed_at": 0, "reached": 2,
        "exit_code": 0, "startup_s": 1.5, "exit_s": None,
    }  # fmt: skip
    assert (summary["reference_wall_s"], summary["chaos_wall_s"]) == (10.0, 20.0)
    assert summary["settings"]["steps"] == 2 and summary["mismatched_losses"] == []


def test_the_summary_names_every_problem_in_order(tmp_path, monkeypatch):
    ended = "the launch ended by itself (exit 1)"
    launches = [
        _launch(
            0, 0, 0, 3, -9, {"moment": "step", "signal": "kill", "rank": 1, "fired": True},
            [_train(1, 1.0), _train(3, 3.5)], startup_s=2.0, exit_s=0.5,
        ),
        _launch(
            1, 2, 1, 3, 1,
            {"moment": "save", "signal": "term", "rank": 0, "faults": "term_in_save@3@0",
             "fired": False, "ended_first": ended},
            [_train(3, 3.0)], startup_s=1.5, exit_s=0.25,
        ),
        _launch(2, 3, 3, 3, None, {"hung": "the launch ran past --launch_timeout_s"}, exit_s=3.0),
    ]  # fmt: skip
    s = chaos.Settings(steps=4, kills=3)
    pending = [("startup", "term")]
    summary = _summarize(
        tmp_path, monkeypatch, s, launches, pending, [1, 2, 3], ["w"], ["/dev/shm/deepspeed_1"]
    )
    assert not summary["passed"]
    assert summary["problems"] == [
        "1 logged losses differ from the reference",
        "the final history's steps are not 1..4 once each",
        "final weights differ: ['w']",
        "left behind: /dev/shm/deepspeed_1",
        "launch 1 resumed at 1, the newest verified checkpoint was 2",
        f"kill 2 (save): {ended}",
        "launch 2: the launch ran past --launch_timeout_s",
        "the last launch exited None",
        "1 of 3 kills survived",
    ]
    assert summary["mismatched_losses"] == [{"launch": 0, **_train(3, 3.5), "reference": 3.0}]
    assert [k["launch"] for k in summary["kills"]] == [0, 1]
    assert summary["kills"][1]["planned_fault"] == "term_in_save@3@0"
    assert "faults" not in summary["kills"][1]
    assert [k["steps_redone"] for k in summary["kills"]] == [1, 0]
    assert [k["resumed_at"] for k in summary["kills"]] == [2, 3]
    assert [k["lost_s"] for k in summary["kills"]] == [2.5, 0.25]  # no start-up after a hang
    assert summary["survived_by_kind"] == {"step/kill": 1} and summary["launches"] == 3
