"""`python -m data_prep.domain_text`, the README recipe's domain corpus: every docstring one
document that `data_prep` reads back as written, none repeated, none too short."""

from __future__ import annotations

import inspect
from pathlib import Path

from helpers.commands import run_cli

SCRIPT = ("-m", "data_prep.domain_text")


def _documents(path: Path) -> list[str]:
    from bertforge.data_prep.inputs import DropCounter, InputConfig, expand_inputs, iter_documents

    return list(iter_documents(expand_inputs([str(path)]), InputConfig(), DropCounter()))


def test_docstrings_become_documents_data_prep_reads(tmp_path):
    out = tmp_path / "domain.txt"
    proc = run_cli(
        *SCRIPT, "--packages", "email", "http", "--output", str(out), "--min_chars", "60"
    )
    docs = _documents(out)
    assert f"{len(docs)} docstrings of email, http" in proc.stdout
    assert len(docs) == len(set(docs)) > 100 and min(map(len, docs)) >= 60
    # Independent reference: the docstring Python itself reports, blank lines dropped.
    import email.message
    import http.cookiejar

    for obj in (email.message.Message.get_payload, http.cookiejar.CookieJar):
        expected = "\n".join(line for line in inspect.getdoc(obj).splitlines() if line.strip())
        assert expected in docs


def test_unknown_package_is_a_clear_error(tmp_path):
    proc = run_cli(
        *SCRIPT, "--packages", "no_such_pkg_xyz", "--output", str(tmp_path / "d.txt"), check=False
    )
    assert proc.returncode != 0
    assert "--packages no_such_pkg_xyz: not a pure-Python module or package" in proc.stderr
    assert not (tmp_path / "d.txt").exists()
