"""The commands keep other libraries' routine chatter off their output, not their warnings
(issue 55: every command printed DeepSpeed's "Setting accelerator to CPU" and transformers'
loading bars)."""

from __future__ import annotations

import logging

import torch
from helpers.commands import run_cli

from bertforge.logs import (
    DEEPSPEED_CPU_NOTE,
    DEEPSPEED_LOGGER,
    quiet_libraries,
    quiet_transformers,
    transformers_errors_only,
)

NOTE = (
    "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it."
)


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_deepspeeds_cpu_note_is_dropped_and_its_warnings_kept():
    assert NOTE.startswith(DEEPSPEED_CPU_NOTE)
    logger = logging.getLogger(DEEPSPEED_LOGGER)
    collect = _Collect()
    logger.addHandler(collect)
    try:
        quiet_libraries()
        quiet_libraries()  # a second command in the same process adds no second filter
        assert len(logger.filters) == len({type(f) for f in logger.filters})
        logger.warning(NOTE)
        logger.warning("a real warning: the loss scale is at its minimum")
    finally:
        logger.removeHandler(collect)
    assert collect.messages == ["a real warning: the loss scale is at its minimum"]


def test_torchs_deprecation_of_deepspeeds_gather_is_dropped_and_other_warnings_kept():
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_libraries()
        warnings.warn(
            "`torch.distributed.all_gather_into_tensor` is deprecated. Please use "
            "`torch.distributed.all_gather_single` instead.",
            FutureWarning,
            stacklevel=1,
        )
        warnings.warn("`torch.distributed.scatter` is deprecated.", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["`torch.distributed.scatter` is deprecated."]


def test_the_dry_run_no_longer_prints_deepspeeds_cpu_note(english_shards):
    if not torch.cuda.is_available():  # where DeepSpeed says it: at its import, here
        bare = run_cli("-c", "import deepspeed")
        assert "Setting accelerator to CPU" in bare.stdout + bare.stderr
    proc = run_cli("pretrain/main.py", "--data", str(english_shards), "--dry-run")
    assert "== dry run: nothing is trained ==" in proc.stdout  # it ran, DeepSpeed imported
    assert "Setting accelerator" not in proc.stdout + proc.stderr


def test_transformers_bars_are_off_and_its_warnings_on():
    from transformers.utils import logging as hf_logging

    was, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.set_verbosity_warning()  # a fresh process's level, whatever ran before here
    try:
        quiet_transformers()
        assert not hf_logging.is_progress_bar_enabled()
        assert hf_logging.get_verbosity() == logging.WARNING
    finally:
        hf_logging.set_verbosity(level)
        if was:
            hf_logging.enable_progress_bar()


def test_a_quieted_load_gives_transformers_warnings_back_even_when_it_fails():
    # CI failed once on a load that set ERROR for good: every later warning was hidden
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_warning()
    try:
        with transformers_errors_only():
            assert hf_logging.get_verbosity() == logging.ERROR
        assert hf_logging.get_verbosity() == logging.WARNING
        try:
            with transformers_errors_only():
                raise OSError("no such model folder")
        except OSError:
            pass
        assert hf_logging.get_verbosity() == logging.WARNING
    finally:
        hf_logging.set_verbosity(level)


def test_deepspeeds_op_line_is_dropped_and_every_other_printed_line_kept(capsys):
    from bertforge.logs import DEEPSPEED_OP_LOADED, without_printed

    with without_printed(DEEPSPEED_OP_LOADED):
        print("DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully")
        print("a line DeepSpeed prints that a user needs")
    assert capsys.readouterr().out == "a line DeepSpeed prints that a user needs\n"
    try:
        with without_printed(DEEPSPEED_OP_LOADED):
            print("said before a failure")
            raise RuntimeError("the op did not load")
    except RuntimeError:
        pass
    assert capsys.readouterr().out == "said before a failure\n"
