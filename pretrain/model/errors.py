"""The model package's user errors (exit status 2), apart so every arch folder can raise them."""

from __future__ import annotations

from bertforge.errors import UserError
from bertforge.pretrain.run_folder.run_checkpoints import CheckpointError


class ArchError(UserError, ValueError):
    """A flag or input the chosen --arch does not support; the message names the flag."""


class InitError(CheckpointError):
    """An --init_from source that cannot initialise this run; the message says what to do."""


class ObjectiveError(UserError, ValueError):
    """An objective the run cannot train (``--objective`` against the shards' format, or an
    objective the arch does not implement); exit status 2."""
