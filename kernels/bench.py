"""`python -m kernels.bench`: a thin entry to the benchmark in benchmarks/bench_kernels.py.

The benchmark ships with the repository, not with the installed `kernels` package: this entry finds
it next to the package (a source checkout or an editable install) and fails with a clear message
otherwise.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "bench_kernels.py"


def main(argv: list[str] | None = None) -> int:
    """Run benchmarks/bench_kernels.py with `argv`; its exit status."""
    if not SCRIPT.is_file():
        sys.exit(
            f"python -m kernels.bench runs {SCRIPT.relative_to(REPO)} from the repository, which "
            f"is not next to this installed kernels package ({Path(__file__).parent}); run it from "
            "a checkout of the repository: `cd bertforge && python -m kernels.bench ...` or "
            "`python benchmarks/bench_kernels.py ...`"
        )
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from benchmarks.bench_kernels import main as bench_main

    return bench_main(argv, prog="python -m kernels.bench")


if __name__ == "__main__":
    sys.exit(main())
