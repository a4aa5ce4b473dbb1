"""``python -m bertforge SUBCOMMAND ...``: the ``bertforge`` command without its console script."""

from bertforge.commands import script

script()
