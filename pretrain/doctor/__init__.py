"""Pre-launch checks for a multi-node job: ``bertforge doctor`` (see :mod:`.cli`).

Modules: :mod:`.cli` (flags, hostfile, running the probe on every node, the report table),
:mod:`.probe` (what one node reports; sent over ssh as source, so it imports nothing of ours),
:mod:`.checks` (probe answers -> report rows), :mod:`.memory_estimate` (ZeRO memory per rank).
"""

from bertforge.pretrain.doctor.cli import (
    HostfileError,
    check_deepspeed_env,
    main,
    parse_hostfile,
    run_checks,
)

__all__ = ["HostfileError", "check_deepspeed_env", "main", "parse_hostfile", "run_checks"]
