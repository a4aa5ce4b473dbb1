"""The chaos test, CI form: a 2-rank ZeRO-2 run (tiny model, dropout on) killed five times at
seeded random moments (inside steps, inside a save, inside a validation pass, during start-up;
SIGKILL to one rank or SIGTERM to the whole job), restarted each time with ``--resume auto``,
ends bit-identical to an uninterrupted run: every logged loss (redone steps included), the final
weights, and nothing left behind (shared memory, the run lock, a partial checkpoint folder).

The harness is ``benchmarks/training/chaos.py``; its long form (``--kills 30``) and its figures
are in docs/reliability.md, "Chaos". Seed 0 draws validation/kill, step/kill, startup/term,
save/term and save/kill: a SIGKILL mid-save (a checkpoint that must never be taken by a resume)
and a SIGKILL mid-steps (steps redone, which must draw the same dropout and masks again).
"""

from __future__ import annotations

import pytest

from benchmarks.training import chaos

KILLS, STEPS, SEED = 5, 30, 0


def test_the_plan_covers_every_moment_and_both_signals():
    kinds = chaos.kinds_for(SEED, KILLS)
    assert {m for m, _ in kinds} == set(chaos.MOMENTS)
    assert ("save", "kill") in kinds and ("step", "kill") in kinds
    assert chaos.kinds_for(SEED, KILLS) == kinds  # a function of the seed alone
    eight = chaos.kinds_for(3, 8)
    assert sorted(eight) == sorted((m, s) for m in chaos.MOMENTS for s in chaos.SIGNALS)


@pytest.mark.slow
def test_five_kills_end_bit_identical_to_the_uninterrupted_run(english_shards, tmp_path):
    settings = chaos.Settings(steps=STEPS, kills=KILLS, seed=SEED, save_interval=5, eval_interval=7)
    summary = chaos.chaos(settings, english_shards, tmp_path)
    text = chaos.report(summary)
    assert summary["passed"], text
    assert summary["kills_survived"] == KILLS, text
    assert {k.split("/")[0] for k in summary["survived_by_kind"]} == set(chaos.MOMENTS), text
    assert summary["steps_redone"] > 0, text  # the SIGKILL mid-steps made the run redo steps
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

    def fake_launch(index, s, args, logs, run, kill):
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
