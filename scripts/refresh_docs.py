"""Refresh every sample output pasted in README.md and docs/*.md from the command that makes it.

A pasted output is a fenced block right after a marker naming its command::

    <!-- output: bertforge inspect runs/docs/zh_shards -->
    ```
    ...what the command printed...
    ```

Words between ``output`` and the colon qualify the block:

- ``varies``: the numbers change from machine to machine (times, free memory, host names, a
  trained model's predictions); the text around it must not rest on them.
- ``slow``: takes minutes or needs ``make demo`` first (``--fast`` leaves it out).
- ``filter=NAME``: keep only the lines :data:`FILTERS` ``[NAME]`` keeps (a long run's excerpt).
- ``unchecked``: deterministic, but left out of the check of
  tests/docs/test_readme_and_sample_outputs.py (its command's output is being reworked; drop the
  word once it has settled).

The other blocks are deterministic and cheap: tests/docs/test_readme_and_sample_outputs.py checks
them against what the command prints now. Every command runs with bash from the working directory
(the repository root by default), ``PYTHONPATH`` set to the repository, stdout captured (a command
that wants its stderr says ``2>&1``). The inputs they read (``runs/docs/...``) are built first by
:data:`PREPARE`.

    python scripts/refresh_docs.py            # rerun every block, rewrite the pages (make docs)
    python scripts/refresh_docs.py --check    # report the blocks that differ, exit 1 if any
    python scripts/refresh_docs.py --fast     # leave out the slow blocks
    python scripts/refresh_docs.py --list     # the blocks and their commands, nothing run
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MARKER = re.compile(
    r"^<!-- output(?P<flags>(?: [\w=]+)*): (?P<cmd>.+?) -->\n```(?P<lang>\w*)\n(?P<body>.*?)^```$",
    flags=re.MULTILINE | re.DOTALL,
)

# Inputs the commands read, built fresh (a few seconds) before the first command that names them.
# The Chinese sample ships with the tests; its build is deterministic (same vocabulary, shards).
PREPARE: dict[str, list[str]] = {
    "runs/docs/zh_shards": [
        "bertforge prep build --input {repo}/tests/data/zh_hongloumeng_sample.txt"
        " --one_doc_per_line --output runs/docs/zh_shards --vocab_size 2000 --max_seq_len 64"
        " --validation_fraction 0.1 --workers 1 --progress off",
    ],
    "runs/docs/zh_key": [
        "bertforge prep build --input {repo}/tests/data/zh_hongloumeng_sample.txt"
        " --one_doc_per_line --output runs/docs/zh_key --vocab_size 2000 --max_seq_len 64"
        " --validation_fraction 0.1 --key_sentences 0.5 --workers 1 --progress off",
    ],
}


def _continued(lines: list[str]) -> list[str]:
    """The continued-pretraining recipe's excerpt: what each step reports, not its progress."""
    keep = re.compile(
        r"^(\d+ docstrings|added \d+ tokens|    \d+ '|tokens per character|train: |validation: "
        r"|\[pretrain[^\]]*\] (initialised|vocabulary)|validation step|exported |runs/"
        r"|  \S.*\[MASK\]|      -> )"
    )
    out, token_rows = [], 0
    for line in lines:
        if not keep.match(line):
            continue
        if line.startswith("    ") and line.lstrip()[:1].isdigit():
            token_rows += 1
            if token_rows > 5:
                if token_rows == 6:
                    out.append("    ...")
                continue
        out.append(line)
    return out


def _from_error(lines: list[str]) -> list[str]:
    """From the first ERROR line on (the launcher's own warnings before it left out)."""
    for i, line in enumerate(lines):
        if "ERROR" in line:
            return lines[i:]
    return lines


def _short_config(lines: list[str]) -> list[str]:
    """The dry run's one-line JSON of the resolved configuration, elided (it is long)."""
    return [re.sub(r"^(config\s+)\{.*\}$", r"\1{...}", line) for line in lines]


FILTERS: dict[str, Callable[[list[str]], list[str]]] = {
    "continued": _continued,
    "from_error": _from_error,
    "short_config": _short_config,
}


@dataclass
class Block:
    """One pasted output: where it is, how it is made, what the page holds now."""

    doc: Path
    line: int
    cmd: str
    flags: frozenset[str]
    body: str
    span: tuple[int, int]  # of the body in the page's text

    @property
    def varies(self) -> bool:
        return "varies" in self.flags

    @property
    def slow(self) -> bool:
        return "slow" in self.flags

    @property
    def filter(self) -> str | None:
        names = [f.split("=", 1)[1] for f in self.flags if f.startswith("filter=")]
        return names[0] if names else None

    def where(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.line}"


def pages(repo: Path = REPO) -> list[Path]:
    """README.md and every page in docs/."""
    return [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]


def blocks(doc: Path) -> list[Block]:
    """The marked output blocks of one page, in order."""
    text = doc.read_text(encoding="utf-8")
    found = []
    for m in MARKER.finditer(text):
        flags = frozenset(m.group("flags").split())
        known = ("varies", "slow", "unchecked")
        unknown = {f for f in flags if f not in known and not f.startswith("filter=")}
        if unknown:
            raise ValueError(f"{doc}: unknown output flag(s) {sorted(unknown)} in {m.group(0)!r}")
        line = text.count("\n", 0, m.start()) + 1
        found.append(Block(doc, line, m.group("cmd"), flags, m.group("body"), m.span("body")))
    return found


def prepare(cmd: str, cwd: Path, done: set[str]) -> None:
    """Build (once per call of the script) every prepared input that ``cmd`` names."""
    for path, steps in PREPARE.items():
        if path in cmd and path not in done:
            shutil.rmtree(cwd / path, ignore_errors=True)
            for step in steps:
                _shell(step.format(repo=REPO), cwd, check=True)
            done.add(path)


def _bin() -> Path:
    """A folder whose `bertforge` is `python -m bertforge` (the `python` of PATH): the pages'
    `bertforge ...` commands run this checkout's code, also before `make install` made the
    console script."""
    folder = Path(tempfile.gettempdir()) / f"refresh_docs_bin_{os.getuid()}"
    folder.mkdir(exist_ok=True)
    wrapper, text = folder / "bertforge", '#!/bin/sh\nexec python -m bertforge "$@"\n'
    if not wrapper.is_file() or wrapper.read_text() != text:  # replaced whole, never rewritten
        tmp = folder / f".bertforge.{os.getpid()}"
        tmp.write_text(text)
        tmp.chmod(0o755)
        os.replace(tmp, wrapper)
    return folder


def _shell(cmd: str, cwd: Path, check: bool = False) -> subprocess.CompletedProcess:
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path)
    env["PATH"] = os.pathsep.join([env.get("PATH", ""), str(_bin())])  # an installed one first
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"`{cmd}` failed with status {r.returncode}:\n{r.stdout}{r.stderr}")
    return r


def run(block: Block, cwd: Path = REPO, done: set[str] | None = None) -> str:
    """What the block's command prints now, as the page should hold it (a non-zero exit status is
    fine: some samples show a failing check)."""
    prepare(block.cmd, cwd, set() if done is None else done)
    out = _shell(block.cmd, cwd).stdout
    lines = [line.rstrip() for line in out.splitlines()]
    if block.filter:
        lines = FILTERS[block.filter](lines)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--check", action="store_true", help="report differing blocks, change nothing")
    p.add_argument("--fast", action="store_true", help="leave out the blocks marked slow")
    p.add_argument("--list", action="store_true", help="list the blocks and their commands")
    p.add_argument("docs", nargs="*", type=Path, help="pages to refresh (default: all)")
    args = p.parse_args(argv)
    docs = [d.resolve() for d in args.docs] or pages()
    done: set[str] = set()
    differ = 0
    for doc in docs:
        text = doc.read_text(encoding="utf-8")
        fresh: list[tuple[Block, str]] = []
        for b in blocks(doc):
            tag = " ".join(sorted(b.flags)) or "stable"
            if args.list or (args.fast and b.slow):
                print(f"{b.where():28} {tag:24} {'' if args.list else '(left out) '}{b.cmd}")
                continue
            new = run(b, done=done)
            differ += new != b.body
            state = "same" if new == b.body else "DIFFERS"
            print(f"{b.where():28} {tag:24} {state:8} {b.cmd}", flush=True)
            fresh.append((b, new))
        for b, new in reversed(fresh):  # from the end, so the earlier spans stay valid
            text = text[: b.span[0]] + new + text[b.span[1] :]
        if fresh and not args.check:
            doc.write_text(text, encoding="utf-8")
    if args.check and differ:
        print(f"{differ} block(s) differ from what their commands print now: run `make docs`.")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
