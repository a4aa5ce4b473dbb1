"""Command lines the README and the docs/ pages show, as argv lists (the doc tests run them)."""

from __future__ import annotations

import re
import shlex

from helpers.commands import REPO

DOCS = ("README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md")))


def documented_commands(entries: tuple[str, ...]) -> list[tuple[str, dict, list[str]]]:
    """(doc, env, argv after `python`) of every benchmark command line in the docs: the lines of
    shell blocks and the inline code spans that start with `python` (after VAR=value words)."""
    found = []
    for doc in DOCS:
        text = (REPO / doc).read_text(encoding="utf-8")
        fence = r"```(\w*)\n(.*?)```"
        candidates = [
            line.split("  #")[0]
            for lang, block in re.findall(fence, text, flags=re.DOTALL)
            if lang in ("", "bash", "sh")
            for line in block.splitlines()
        ]
        candidates += re.findall(r"`([^`\n]+)`", re.sub(fence, "", text, flags=re.DOTALL))
        for cmd in candidates:
            if not any(entry in cmd for entry in entries):
                continue
            words = shlex.split(cmd, comments=True)
            env = {}
            while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
                key, _, value = words.pop(0).partition("=")
                env[key] = value
            if (
                len(words) > 1
                and words[0] in ("python", "python3")
                and (words[1] in entries or (words[1] == "-m" and words[2] in entries))
            ):
                found.append((doc, env, words[1:]))
    unique = {
        (tuple(sorted(env.items())), tuple(argv)): (doc, env, argv) for doc, env, argv in found
    }
    return list(unique.values())
