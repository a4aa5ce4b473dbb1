"""``python -m bertforge SUBCOMMAND ...``: the ``bertforge`` command without its console script."""

from bertforge.commands import script

if __name__ == "__main__":  # not when a build's worker processes import this as __mp_main__
    script()
