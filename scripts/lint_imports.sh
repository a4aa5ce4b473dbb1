#!/usr/bin/env bash
# import-linter's contracts (pyproject.toml) on an installed copy of the package: in a checkout the
# folders reach `bertforge` through bertforge/__init__.py's path, which import-linter does not follow.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
site="$(mktemp -d)"
trap 'rm -rf "$site"' EXIT
"$python" -m pip install -q --no-deps --no-build-isolation --no-compile --target "$site" "$repo" \
    2>&1 | grep -v "^WARNING: Running pip as the 'root' user" || true
cd "$site"
# lint-imports of this interpreter's environment
PYTHONPATH="$site" "$python" -c "import sys; from importlinter.cli import lint_imports_command; \
sys.argv = ['lint-imports', '--config', sys.argv[1]]; lint_imports_command()" "$repo/pyproject.toml"
