"""The one base class of errors a user can fix (a bad flag, file, checkpoint or data folder).

Entry points catch :class:`UserError` once, print its message (which names the flag, file or
key and what to do) and exit with status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

#: The exit status of a run refused for bad input (argparse uses the same).
USER_ERROR_EXIT = 2


class UserError(Exception):
    """Bad input that the message tells the user how to fix."""
