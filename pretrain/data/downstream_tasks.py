"""Labelled downstream tasks read from files, checked line by line (what ``python -m
pretrain.evaluate`` scores; :func:`load_downstream_tasks`: the capped tasks of the background
evaluation during pretraining, checked by the trainer at launch).

A task is described by a :class:`TaskSpec` (from a tasks JSON file or command-line flags) and read
into a :class:`TaskData`: train, dev (for choosing the learning rate) and test examples plus the
label list. Contract:
- sequence classification: JSONL, CSV or TSV with named text (and optional text-pair) and label
  columns; token classification: CoNLL-style files (one token a line, whitespace-separated columns,
  a blank line between sentences; ``-DOCSTART-`` lines are skipped).
- Bad input raises :class:`TaskError` naming the file, the line and what to do: an empty line in a
  JSONL/CSV/TSV file, a missing column, an empty text, a CoNLL line with another number of columns
  than the file's first line, a test label unknown to the training data.
- Held-out split: the ``test`` file when given, else a deterministic one by a hash of each example's
  text (the same examples land in the same split whatever their order). The dev split, used only to
  pick the learning rate, is carved from train the same way.
"""

from __future__ import annotations

import csv
import hashlib
import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from bertforge.errors import UserError

TASK_TYPES = ("classification", "token_classification")
FORMATS = ("jsonl", "csv", "tsv", "conll")
BIO_PREFIXES = ("B-", "I-", "E-", "S-")


class TaskError(UserError, ValueError):
    """A task file or task description that cannot be used (the message says where and why)."""


@dataclass
class TaskSpec:
    """One task. Paths are relative to the tasks JSON file's folder."""

    name: str
    type: str  # "classification" | "token_classification"
    train: str  # file with the training examples (and the test ones when `test` is not given)
    test: str | None = None  # held-out file; None: a deterministic `test_fraction` of `train`
    format: str | None = None  # jsonl | csv | tsv | conll; None: from the file suffix
    text_column: str = "text"  # classification: column with the (first) text
    text_pair_column: str | None = None  # classification: second text for sentence pairs
    label_column: str = "label"  # classification: column with the label
    token_column: int = 0  # conll: column index of the token
    tag_column: int = -1  # conll: column index of the tag (default: the last)
    max_length: int | None = None  # tokens per example; None: the recipe's default
    test_fraction: float = 0.2  # share of `train` held out when `test` is not given
    dev_fraction: float = 0.1  # share of the training part used to pick the learning rate
    max_train_examples: int | None = None  # cap: a deterministic sample of N after the split
    max_test_examples: int | None = None
    recipe: dict[str, Any] = field(default_factory=dict)  # overrides of the recipe's fields

    def __post_init__(self) -> None:
        if self.type not in TASK_TYPES:
            raise TaskError(f"task {self.name!r}: type {self.type!r} is not one of {TASK_TYPES}")
        fmt = self.resolved_format()
        if self.type == "token_classification" and fmt != "conll":
            raise TaskError(
                f"task {self.name!r}: token classification reads CoNLL files, not {fmt}"
            )
        if self.type == "classification" and fmt == "conll":
            raise TaskError(f"task {self.name!r}: classification reads jsonl/csv/tsv, not conll")
        if not 0.0 < self.test_fraction < 1.0 or not 0.0 < self.dev_fraction < 1.0:
            raise TaskError(f"task {self.name!r}: test_fraction and dev_fraction must be in (0, 1)")

    def resolved_format(self) -> str:
        """The file format: `format` or the train file's suffix."""
        fmt = self.format or Path(self.train).suffix.lstrip(".").lower()
        fmt = {"json": "jsonl", "txt": "conll", "bio": "conll", "conll2003": "conll"}.get(fmt, fmt)
        if fmt not in FORMATS:
            raise TaskError(
                f"task {self.name!r}: cannot tell the format of {self.train} from its "
                f'suffix; set "format" to one of {FORMATS}'
            )
        return fmt


@dataclass
class ClassificationExample:
    text: str
    text_pair: str | None
    label: str
    where: str  # "file:line", for error messages


@dataclass
class TokenExample:
    tokens: list[str]
    tags: list[str]
    where: str


@dataclass
class TaskData:
    """A task read and split: label ids index `labels`."""

    spec: TaskSpec
    train: list[Any]
    dev: list[Any]
    test: list[Any]
    labels: list[str]
    scheme: str  # "single" | "pair" (classification), "bio" | "plain" (token classification)


def load_task_file(path: str | Path) -> list[TaskSpec]:
    """Read a tasks JSON file: ``{"tasks": [{...TaskSpec fields...}, ...]}`` (or a bare list)."""
    path = Path(path)
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise TaskError(f"{path}: cannot read the tasks file: {e}") from e
    items = obj.get("tasks") if isinstance(obj, dict) else obj
    if not isinstance(items, list) or not items:
        raise TaskError(f'{path}: expected {{"tasks": [ ... ]}} with at least one task')
    known = {f.name for f in fields(TaskSpec)}
    specs = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise TaskError(f"{path}: tasks[{i}] is not an object")
        unknown = sorted(set(item) - known)
        if unknown:
            raise TaskError(
                f"{path}: tasks[{i}] has unknown key(s) {unknown}; known: {sorted(known)}"
            )
        missing = [k for k in ("name", "type", "train") if k not in item]
        if missing:
            raise TaskError(f"{path}: tasks[{i}] lacks {missing}")
        item = dict(item)
        for key in ("train", "test"):
            if item.get(key):
                item[key] = str((path.parent / item[key]).resolve())
        specs.append(TaskSpec(**item))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise TaskError(f"{path}: task names must be unique, got {names}")
    return specs


def _hash_fraction(key: str) -> float:
    """A stable number in [0, 1) from the example's text."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") / 2**64


def _key(ex: Any) -> str:
    if isinstance(ex, TokenExample):
        return " ".join(ex.tokens)
    return ex.text + "\x00" + (ex.text_pair or "")


def _split(examples: list[Any], fraction: float, salt: str) -> tuple[list[Any], list[Any]]:
    keep, held = [], []
    for ex in examples:
        (held if _hash_fraction(salt + _key(ex)) < fraction else keep).append(ex)
    return keep, held


def _cap(examples: list[Any], n: int) -> list[Any]:
    """A deterministic sample of ``n`` examples (smallest hashes), in file order: a file sorted by
    label still gives every label its share."""
    if len(examples) <= n:
        return examples
    keep = set(
        sorted(range(len(examples)), key=lambda i: _hash_fraction("cap:" + _key(examples[i])))[:n]
    )
    return [ex for i, ex in enumerate(examples) if i in keep]


def _read_jsonl(path: Path, spec: TaskSpec) -> list[dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8-sig") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                raise TaskError(f"{path}:{n}: empty line; remove it (one JSON object a line)")
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise TaskError(f"{path}:{n}: not valid JSON ({e.msg})") from e
            if not isinstance(obj, dict):
                raise TaskError(f"{path}:{n}: expected a JSON object, got {type(obj).__name__}")
            rows.append((n, obj))
    return rows


def _read_delimited(path: Path, delimiter: str) -> list[tuple[int, dict[str, Any]]]:
    rows = []
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f, delimiter=delimiter)
        header = next(reader, None)
        if not header:
            raise TaskError(f"{path}:1: no header line (the first line names the columns)")
        line = reader.line_num
        for values in reader:
            start, line = line + 1, reader.line_num
            if not values or all(not v.strip() for v in values):
                raise TaskError(f"{path}:{start}: empty line; remove it")
            if len(values) != len(header):
                raise TaskError(
                    f"{path}:{start}: {len(values)} fields, the header has "
                    f"{len(header)} ({header}); quote fields holding the delimiter"
                )
            rows.append((start, dict(zip(header, values))))
    return rows


def _column(path: Path, n: int, row: dict[str, Any], column: str) -> str:
    if column not in row:
        raise TaskError(
            f"{path}:{n}: no column {column!r}; columns present: {sorted(row)}. "
            "Fix the file or the task's *_column setting"
        )
    value = row[column]
    if value is None or isinstance(value, (dict, list)):
        raise TaskError(f"{path}:{n}: column {column!r} holds {value!r}, expected text")
    value = str(value)
    if not value.strip():
        raise TaskError(f"{path}:{n}: column {column!r} is empty")
    return value


def read_classification(path: str | Path, spec: TaskSpec) -> list[ClassificationExample]:
    """Examples of a JSONL/CSV/TSV file with the spec's columns."""
    path = Path(path)
    fmt = spec.format or spec.resolved_format()
    if fmt == "jsonl":
        rows = _read_jsonl(path, spec)
    else:
        rows = _read_delimited(path, "," if fmt == "csv" else "\t")
    out = []
    for n, row in rows:
        pair = _column(path, n, row, spec.text_pair_column) if spec.text_pair_column else None
        out.append(
            ClassificationExample(
                _column(path, n, row, spec.text_column),
                pair,
                _column(path, n, row, spec.label_column).strip(),
                f"{path}:{n}",
            )
        )
    if not out:
        raise TaskError(f"{path}: no examples")
    return out


def read_conll(path: str | Path, spec: TaskSpec) -> list[TokenExample]:
    """Sentences of a CoNLL-style file: every non-blank line has the first line's column count."""
    path = Path(path)
    out: list[TokenExample] = []
    tokens: list[str] = []
    tags: list[str] = []
    width, start = None, 0
    with open(path, encoding="utf-8-sig") as f:
        for n, line in enumerate(f, 1):
            cols = line.split()
            if not cols or cols[0] == "-DOCSTART-":
                if tokens:
                    out.append(TokenExample(tokens, tags, f"{path}:{start}"))
                tokens, tags = [], []
                continue
            if width is None:
                width = len(cols)
                for idx in (spec.token_column, spec.tag_column):
                    if not -width <= idx < width:
                        raise TaskError(
                            f"{path}:{n}: column {idx} does not exist in a line of "
                            f"{width} columns; set token_column/tag_column"
                        )
                if width < 2:
                    raise TaskError(f"{path}:{n}: one column; expected a token and a tag")
            elif len(cols) != width:
                raise TaskError(
                    f"{path}:{n}: {len(cols)} columns where the file's first line has "
                    f"{width}; every token line needs the same columns"
                )
            if not tokens:
                start = n
            tokens.append(cols[spec.token_column])
            tags.append(cols[spec.tag_column])
    if tokens:
        out.append(TokenExample(tokens, tags, f"{path}:{start}"))
    if not out:
        raise TaskError(f"{path}: no sentences")
    return out


def _label_of(ex: Any) -> list[str]:
    return ex.tags if isinstance(ex, TokenExample) else [ex.label]


def _move_unseen(train: list[Any], held: list[Any]) -> tuple[list[Any], list[Any]]:
    """Move held-out examples with a label absent from ``train`` into ``train``."""
    seen = {lab for ex in train for lab in _label_of(ex)}
    rare = [ex for ex in held if not set(_label_of(ex)) <= seen]
    return train + rare, [ex for ex in held if set(_label_of(ex)) <= seen]


def _check_known(test: list[Any], labels: set[str], train_path: str) -> None:
    for ex in test:
        for lab in _label_of(ex):
            if lab not in labels:
                raise TaskError(
                    f"{ex.where}: label {lab!r} does not occur in the training data "
                    f"({train_path}, after any --max_train_examples cap; known: "
                    f"{sorted(labels)[:20]}); add training examples with it or drop this "
                    "test example"
                )


def _scheme(spec: TaskSpec, labels: list[str]) -> str:
    if spec.type == "classification":
        return "pair" if spec.text_pair_column else "single"
    bio = all(lab == "O" or lab.startswith(BIO_PREFIXES) for lab in labels)
    return "bio" if bio and any(lab != "O" for lab in labels) else "plain"


def _not_utf8(path: str | Path) -> TaskError:
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                return TaskError(
                    f"{path}:{n}: not UTF-8 ({e.reason} at byte {e.start} of the "
                    "line); convert the file to UTF-8"
                )
    return TaskError(f"{path}: not UTF-8; convert the file to UTF-8")


def _read(spec: TaskSpec, path: str) -> list[Any]:
    read = read_conll if spec.type == "token_classification" else read_classification
    try:
        return read(path, spec)
    except UnicodeDecodeError:
        raise _not_utf8(path) from None
    except OSError as e:
        raise TaskError(f"task {spec.name!r}: cannot read {path}: {e.strerror}") from e


def load_task(spec: TaskSpec) -> TaskData:
    """Read, split, cap and check the task's examples (see the module doc)."""
    train = _read(spec, spec.train)
    test = _read(spec, spec.test) if spec.test else None
    if test is None:
        train, test = _split(train, spec.test_fraction, "test:")
    train, dev = _split(train, spec.dev_fraction, "dev:")
    if spec.max_train_examples is not None:
        train = _cap(train, spec.max_train_examples)
        dev = _cap(dev, max(1, spec.max_train_examples // 4))
    if spec.max_test_examples is not None:
        test = _cap(test, spec.max_test_examples)
    # a made split must not fail on a rare label that landed only in dev or test: such examples
    # go to train (a given test file with a label unknown to train is an error, below)
    train, dev = _move_unseen(train, dev)
    if not spec.test:
        train, test = _move_unseen(train, test)
    for part, name in ((train, "train"), (dev, "dev"), (test, "test")):
        if not part:
            raise TaskError(
                f"task {spec.name!r}: the {name} split is empty ({spec.train}); "
                "give more examples or a separate test file"
            )
    labels = sorted({lab for ex in train for lab in _label_of(ex)})
    if len(labels) < 2:
        raise TaskError(
            f"task {spec.name!r}: the training data of {spec.train} has only the "
            f"label(s) {labels}; a task needs at least two"
        )
    _check_known(test, set(labels), spec.train)
    return TaskData(spec, train, dev, test, labels, _scheme(spec, labels))


def load_downstream_tasks(path: str | Path, max_examples: int | None = 2000) -> list[TaskData]:
    """Read and check a tasks file once; each task capped at ``max_examples`` train and test."""
    specs = load_task_file(path)
    for spec in specs:
        if max_examples is not None:
            spec.max_train_examples = min(spec.max_train_examples or max_examples, max_examples)
            spec.max_test_examples = min(spec.max_test_examples or max_examples, max_examples)
    return [load_task(spec) for spec in specs]
