"""BERTFORGE_FAULTS: the plan's parsing and the planned signals (pretrain/stability/faults.py)."""

import subprocess
import sys

import pytest

from bertforge.pretrain.stability.faults import ENV_VAR, FaultPlan, parse_faults

# A child process that fires one planned signal fault and says so if it survives.
CHILD = (
    "import sys; from bertforge.pretrain.stability.faults import FaultPlan; "
    "FaultPlan(sys.argv[1]).signal_if_due('save', 4, 1); print('survived')"
)


def test_signal_faults_parse_with_phase_step_and_rank():
    plan = FaultPlan("kill_in_save@4@1, term_in_validation@6,term_in_startup@0")
    assert [(f.kind, f.step, f.rank) for f in plan.pending] == [
        ("kill_in_save", 4, 1),
        ("term_in_validation", 6, None),
        ("term_in_startup", 0, None),
    ]
    assert not plan.due("kill_in_save", 4, 0)  # rank 1 only
    assert plan.due("kill_in_save", 4, 1) and not plan.due("kill_in_save", 4, 1)  # once


def test_unknown_phase_is_refused_naming_the_entry():
    with pytest.raises(ValueError, match=rf"{ENV_VAR}: cannot read 'kill_in_backward@3'"):
        parse_faults("loss_nan@2,kill_in_backward@3")


def _child(spec: str, **popen) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CHILD, spec], capture_output=True, text=True, timeout=60, **popen
    )


def test_kill_fault_kills_only_its_rank_at_its_step():
    assert _child("kill_in_save@4@1").returncode == -9
    assert _child("kill_in_save@4@0").stdout.strip() == "survived"  # another rank's fault
    assert _child("kill_in_save@5@1").stdout.strip() == "survived"  # another step's


def test_term_fault_signals_the_jobs_own_group_and_refuses_a_shared_one():
    assert _child("term_in_save@4", start_new_session=True).returncode == -15
    # A group of its own but not a session (as under a shell without job control); a group of
    # its own keeps the test runner out of reach even if the check were wrong.
    shared = _child("term_in_save@4", process_group=0)
    assert shared.returncode == 1
    assert "start it in its own session (setsid)" in shared.stderr
