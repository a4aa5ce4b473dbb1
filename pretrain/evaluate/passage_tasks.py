"""A task whose labels are true by construction: which text does a passage come from?

    bertforge passage-tasks --text novel=hongloumeng.txt --text news=news.txt \\
        --out DIR [--chars 100] [--passages 300]

Each text (UTF-8, whitespace collapsed to single spaces) is cut into consecutive passages of
``--chars`` characters; ``--passages`` of them, evenly spaced over the text, are kept per text (all
of them when the text has fewer, with a warning). Writes DIR/passages.jsonl (``text``, ``label``:
the text's name, shuffled with a fixed seed) and DIR/tasks.json describing the classification task
``passage_source`` for ``bertforge evaluate --tasks``. Passages never overlap, so no test
passage shares text with a training one. Everything is deterministic.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from bertforge.cli import command_parser
from bertforge.errors import USER_ERROR_EXIT, UserError
from bertforge.files import write_bytes_atomic, write_json_atomic
from bertforge.logs import get_logger
from bertforge.pretrain.data.downstream_tasks import TaskError

log = get_logger(__name__)
TASK_NAME = "passage_source"


def passages(path: str | Path, chars: int, count: int) -> list[str]:
    """``count`` evenly spaced ``chars``-character passages of the text in ``path``."""
    path = Path(path)
    try:
        text = " ".join(path.read_text(encoding="utf-8").split())
    except UnicodeDecodeError as e:
        raise TaskError(f"{path}: not UTF-8 ({e.reason}); convert the file to UTF-8") from None
    except OSError as e:
        raise TaskError(f"{path}: cannot read it: {e.strerror}") from None
    windows = [text[i : i + chars] for i in range(0, len(text) - chars + 1, chars)]
    if len(windows) < 2:
        raise TaskError(
            f"{path}: {len(text)} characters give fewer than 2 passages of {chars}; "
            "give a longer text or a smaller --chars"
        )
    if len(windows) < count:
        log.warning(f"{path}: {len(windows)} passages of {chars} characters, not {count}")
        return windows
    step = len(windows) / count
    return [windows[int(i * step)] for i in range(count)]


def write_task(texts: dict[str, str], out: str | Path, chars: int = 100, count: int = 300) -> Path:
    """Write DIR/passages.jsonl and DIR/tasks.json from {label: path}; returns tasks.json."""
    if len(texts) < 2:
        raise TaskError(f"--text: {len(texts)} text(s) given; a passage task needs at least two")
    if chars < 1 or count < 1:
        raise TaskError("--chars and --passages must be at least 1")
    rows = [
        {"text": p, "label": label}
        for label, path in texts.items()
        for p in passages(path, chars, count)
    ]
    random.Random(0).shuffle(rows)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    body = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    write_bytes_atomic(out / "passages.jsonl", body.encode("utf-8"))
    task = {"name": TASK_NAME, "type": "classification", "train": "passages.jsonl"}
    write_json_atomic(out / "tasks.json", {"tasks": [task]})
    return out / "tasks.json"


def named_texts(values: list[str]) -> dict[str, str]:
    """``NAME=FILE`` values of --text as {name: file}; a malformed or repeated name is an error."""
    texts: dict[str, str] = {}
    for value in values:
        label, sep, path = value.partition("=")
        if not sep or not label or not path:
            raise TaskError(f"--text {value!r}: expected NAME=FILE, e.g. --text news=news.txt")
        if label in texts:
            raise TaskError(f"--text: the name {label!r} is given twice; names label the classes")
        texts[label] = path
    return texts


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = command_parser("bertforge passage-tasks", __doc__)
    p.add_argument("--text", action="append", required=True, help="NAME=FILE (two or more)")
    p.add_argument("--out", required=True, help="folder for passages.jsonl and tasks.json")
    p.add_argument("--chars", type=int, default=100, help="characters per passage")
    p.add_argument("--passages", type=int, default=300, help="passages per text at most")
    args = p.parse_args(argv)
    try:
        print(write_task(named_texts(args.text), args.out, args.chars, args.passages))
    except UserError as e:
        log.error(str(e))
        return USER_ERROR_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
