"""The pages' commands say `python` and `bertforge`: the doc tests run them under the interpreter
that runs the tests (issue 36, item 6). `make test PYTHON=venv/bin/python` with the venv not
activated used to run them under whatever `python` PATH held (`No module named 'tokenizers'`).
`bertforge` is `python -m bertforge`: the console script as this checkout's code runs it, also
where the install predates the script or belongs to another checkout."""

from __future__ import annotations

import os
import shlex
import sys

import pytest


@pytest.fixture(autouse=True, scope="module")
def python_is_this_interpreter(tmp_path_factory):
    """First on PATH, for this folder's tests: `python` and `python3` that exec sys.executable
    (a wrapper, not a link: a link outside a venv's bin/ would lose the venv), and `bertforge`."""
    folder = tmp_path_factory.mktemp("python-bin")
    python = shlex.quote(sys.executable)
    for name, run in (("python", ""), ("python3", ""), ("bertforge", " -m bertforge")):
        wrapper = folder / name
        wrapper.write_text(f'#!/bin/sh\nexec {python}{run} "$@"\n')
        wrapper.chmod(0o755)
    patch = pytest.MonkeyPatch()
    patch.setenv("PATH", f"{folder}{os.pathsep}{os.environ.get('PATH', '')}")
    yield folder
    patch.undo()
