"""Every cross-reference resolves: the links of README.md and docs/*.md, and the pages (and
sections) that every command's --help points to, name files and anchors that exist (GitHub's
anchor rules: lowercase, spaces to '-', punctuation dropped, a repeated heading gets -1, -2)."""

from __future__ import annotations

import contextlib
import importlib
import io
import re
from functools import cache
from pathlib import Path

import pytest
from helpers.commands import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~)")

# module, the argv whose --help is read (subcommands: each one's own)
COMMANDS = [
    *(
        ("bertforge.data_prep.__main__", [c])
        for c in ("build", "prepare", "merge", "inspect", "verify", "check-overlap")
    ),
    ("bertforge.data_prep.__main__", ["extend-tokenizer"]),
    ("bertforge.data_prep.domain_text", []),
    ("bertforge.pretrain.main", []),
    ("bertforge.pretrain.doctor.cli", []),
    ("bertforge.pretrain.evaluate.__main__", []),
    ("bertforge.pretrain.evaluate.downstream", []),
    ("bertforge.pretrain.evaluate.passage_tasks", []),
    ("benchmarks.tasks.pydoc_tasks", []),
    ("benchmarks.tasks.snownlp_tasks", []),
    ("benchmarks.tasks.stdlib_tasks", []),
    ("benchmarks.tasks.long_doc_tasks", []),
    ("bertforge.pretrain.export.hf_export", []),
    ("bertforge.pretrain.plot", []),
    ("bertforge.pretrain.demo", []),
    ("bertforge.pretrain.attention", []),
    ("bertforge.pretrain.config.phase_plan", []),
    ("benchmarks.gpu_check.__main__", []),
]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: markup and punctuation dropped, lowercase, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    """The anchors of a markdown page's headings (outside code blocks)."""
    found: list[str] = []
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.+)", line)):
            base = slug(m.group(1))
            n = sum(1 for a in found if a == base or re.fullmatch(re.escape(base) + r"-\d+", a))
            found.append(base if n == 0 else f"{base}-{n}")
    return frozenset(found)


def broken(target: str, source: Path) -> str | None:
    """Why the link ``target`` written in ``source`` does not resolve, or None."""
    path, _, anchor = target.partition("#")
    page = (source.parent / path).resolve() if path else source
    if not page.exists():
        return f"{path} does not exist"
    if anchor and page.suffix == ".md" and anchor not in anchors(page):
        where = page.relative_to(REPO) if page.is_relative_to(REPO) else page
        return f"{where} has no heading with the anchor #{anchor}"
    return None


def _markdown_links(page: Path) -> list[str]:
    links, fenced = [], False
    for line in page.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            links += [t for t in _LINK.findall(line) if not re.match(r"[a-z]+:", t)]
    return links


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_of_the_pages_resolves(page):
    bad = [f"{t}: {why}" for t in _markdown_links(page) if (why := broken(t, page))]
    assert not bad, f"{page.relative_to(REPO)}: broken links:\n" + "\n".join(bad)


def help_text(module: str, argv: list[str]) -> str:
    """What ``python -m MODULE ARGV --help`` prints (in this process: the imports are shared)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        importlib.import_module(module).main([*argv, "--help"])
    assert done.value.code in (0, None)
    return out.getvalue()


def help_references(text: str) -> list[str]:
    """The pages and sections a help text points to, as link targets (``README: Section`` and
    ``docs/x.md section N`` too, so that a reference in words is checked as well)."""
    text = " ".join(text.split())  # argparse wraps lines, even inside a path
    refs = [
        f"{page}#{anchor}" if anchor else page
        for page, anchor in re.findall(r"((?:docs/[\w-]+|README)\.md)(?:#([\w-]+))?", text)
    ]
    refs += [f"README.md#{slug(s)}" for s in re.findall(r"README: ([A-Z][\w -]*\w)", text)]
    for page, number in re.findall(r"(docs/[\w-]+\.md) section (\d+)", text):
        numbered = [a for a in anchors(REPO / page) if a.startswith(f"{number}-")]
        refs.append(f"{page}#{numbered[0] if numbered else f'{number}-(no such section)'}")
    return refs


@pytest.mark.parametrize(("module", "argv"), COMMANDS, ids=lambda x: str(x))
def test_every_reference_in_a_help_text_resolves(module, argv):
    text = help_text(module, argv)
    assert "usage:" in text
    bad = [f"{r}: {why}" for r in help_references(text) if (why := broken(r, REPO / "x"))]
    assert not bad, f"{module} {' '.join(argv)} --help: broken references:\n" + "\n".join(bad)


def test_the_checks_catch_what_they_are_for(tmp_path):
    """The slug rule and the resolver against hand-written cases (GitHub's own anchors)."""
    assert slug("4. Commands") == "4-commands"
    assert slug("BERT or ModernBERT?") == "bert-or-modernbert"
    assert slug("Tests and lint") == "tests-and-lint"
    assert slug("`data_prep/`: text -> shards") == "data_prep-text---shards"
    page = tmp_path / "p.md"
    page.write_text("# A b\n## A b\n```\n# not a heading\n```\n")
    assert anchors(page) == {"a-b", "a-b-1"}
    assert broken("#a-b-1", page) is None and "no heading" in broken("#not-a-heading", page)
    assert "does not exist" in broken("missing.md", page)
    assert help_references("see README: Downstream evaluation") == [
        "README.md#downstream-evaluation"
    ]
