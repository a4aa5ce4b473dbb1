"""--preemption_signals and the stop-signal handler (bertforge/preemption.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from bertforge import preemption
from bertforge.preemption import PreemptionHandler, parse_signals
from bertforge.pretrain.config.cli import parse_args
from bertforge.pretrain.config.train_config import CheckpointConfig


def test_preemption_signals_flag_parses_names_and_refuses_others(tmp_path, capsys):
    assert CheckpointConfig().preemption_signals == "TERM,INT"
    assert parse_signals("TERM,INT") == (signal.SIGTERM, signal.SIGINT)
    # Case, a SIG prefix, spaces and repeats do not matter.
    assert parse_signals(" term, SIGUSR1,INT,usr1 ") == (
        signal.SIGTERM,
        signal.SIGUSR1,
        signal.SIGINT,
    )
    with pytest.raises(ValueError, match=r"--preemption_signals 'TERM,KILL': unknown signal KILL"):
        parse_signals("TERM,KILL")
    with pytest.raises(ValueError, match=r"--preemption_signals ' , ': no signal given"):
        parse_signals(" , ")
    # On the command line: refused at parse time (exit 2), the message naming the flag.
    with pytest.raises(SystemExit) as stopped:
        parse_args(["--data", str(tmp_path), "--preemption_signals", "TERM,USR9"])
    err = capsys.readouterr().err
    assert stopped.value.code == 2
    assert "error: --preemption_signals 'TERM,USR9': unknown signal USR9" in err
    assert "TERM, INT, USR1" in err  # what it takes


def test_the_chosen_signals_set_the_flag_and_a_second_ctrl_c_raises():
    handler = PreemptionHandler("USR1,INT")
    try:
        assert handler.signal is None and handler.name == ""
        os.kill(os.getpid(), signal.SIGUSR1)  # SLURM's warning before the time limit
        assert handler.signal == signal.SIGUSR1 and handler.name == "SIGUSR1"
        with pytest.raises(KeyboardInterrupt):  # a Ctrl-C after the first signal: stop now
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # the handler runs between bytecodes
                pass
    finally:
        handler.restore()
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL


def test_workers_ignore_the_signals_the_job_stops_on():
    assert preemption.installed() is None and preemption.job_signals() == (
        signal.SIGTERM,
        signal.SIGINT,
    )
    # A worker (here a child process running the loader's worker_init_fn with the signals its
    # rank chose) survives them all; without USR1 in the list, USR1 kills it.
    child = (
        "import os, signal, sys; from bertforge import preemption; "
        "from bertforge.pretrain.data.loader import ignore_job_signals; "
        "preemption.install(sys.argv[1]); ignore_job_signals(0, preemption.job_signals()); "
        "[os.kill(os.getpid(), s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)]; "
        "print('survived')"
    )
    run = lambda spec: subprocess.run(  # noqa: E731
        [sys.executable, "-c", child, spec], capture_output=True, text=True, timeout=60
    )
    assert run("TERM,INT,USR1").stdout.strip() == "survived"
    assert run("TERM,INT").returncode == -signal.SIGUSR1
