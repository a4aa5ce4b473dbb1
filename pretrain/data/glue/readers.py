"""Read a benchmark folder as the data arrives: the classic files or Hugging Face's copies.

Per task, the first of these that the folder holds:
- the classic layout: GLUE as ``download_glue_data.py`` writes it (``DIR/CoLA/train.tsv``,
  ``dev.tsv``; MNLI's ``dev_matched.tsv`` / ``dev_mismatched.tsv``), read with quoting off (a
  sentence may hold a lone ``"``) and a UTF-8 byte-order mark dropped; CLUE as its benchmark ships
  it (``DIR/afqmc/train.json``, ``dev.json``: one JSON object per line);
- Hugging Face's copy saved by ``datasets`` (``DatasetDict.save_to_disk(DIR/cola)``);
- Hugging Face's parquet files (``DIR/cola/train-00000-of-00001.parquet``, or
  ``DIR/cola/train/*.parquet``), as the hub stores them per config and split.
Nothing is downloaded. Bad input raises :class:`GlueDataError` naming the file (and line), the task
and what to do: a missing split, a column that is not there, a label outside the task's set.
"""

from __future__ import annotations

import csv
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from bertforge.errors import UserError
from bertforge.pretrain.data.glue.tasks import BENCHMARKS, REGRESSION, BenchmarkTask, find_task

TSV, JSONL, SAVED, PARQUET = "tsv", "jsonl", "save_to_disk", "parquet"


class GlueDataError(UserError, ValueError):
    """A benchmark folder or file that cannot be used (the message says where and what to do)."""


@dataclass
class Examples:
    """One split: the texts (a second one for pairs), label ids (floats for regression), and
    where each came from (``file:line``) for messages."""

    texts: list[tuple[str, str | None]]
    labels: list[int] | list[float]
    where: list[str]

    def __len__(self) -> int:
        return len(self.labels)

    def head(self, n: int | None) -> Examples:
        """The first ``n`` examples (all when ``n`` is None): the test slices' caps."""
        return self if n is None else Examples(self.texts[:n], self.labels[:n], self.where[:n])


@dataclass
class BenchmarkData:
    """A task read from a folder: its train split and each reported split."""

    task: BenchmarkTask
    train: Examples
    evals: dict[str, Examples]  # reported split name ("dev", "MNLI-m") -> examples
    layout: str  # TSV | JSONL | SAVED | PARQUET
    path: Path


def _label(task: BenchmarkTask, raw, where: str, fix: str) -> int | float | None:
    """A label id (or float score); None for rows the task's loaders skip (OCNLI's ``-``)."""
    if task.kind == REGRESSION:
        try:
            return float(raw)
        except (TypeError, ValueError):
            raise GlueDataError(
                f"{where}: task {task.name}: score {raw!r} is not a number; {fix}"
            ) from None
    raw = str(raw).strip()
    if raw in task.skip_labels:
        return None
    name = task.label_name(raw)
    if name is None:
        allowed = sorted(set(task.file_labels) | set(task.labels))
        raise GlueDataError(
            f"{where}: task {task.name}: label {raw!r} is not one of {allowed}; {fix}"
        )
    return task.labels.index(name)


def _text(value, where: str, task: BenchmarkTask, column) -> str:
    if isinstance(value, list):  # CSL's keywords
        value = " ".join(map(str, value))
    if value is None or not str(value).strip():
        raise GlueDataError(f"{where}: task {task.name}: column {column!r} is empty")
    return str(value)


def _append(out: Examples, task: BenchmarkTask, texts: list, raw_label, where: str, fix: str):
    label = _label(task, raw_label, where, fix)
    if label is None:
        return
    first = _text(texts[0], where, task, task.file_columns.texts[0])
    second = _text(texts[1], where, task, task.file_columns.texts[1]) if len(texts) > 1 else None
    out.texts.append((first, second))
    out.labels.append(label)
    out.where.append(where)


def read_tsv(path: Path, task: BenchmarkTask) -> Examples:
    """A classic GLUE TSV (quoting off, byte-order mark dropped)."""
    cols = task.file_columns
    fix = f"is {path} the {task.name} file that download_glue_data.py writes?"
    csv.field_size_limit(sys.maxsize)
    out = Examples([], [], [])
    with open(path, encoding="utf-8-sig", newline="") as f:
        rows = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        index: dict[str | int, int] = {}
        if cols.header:
            header = next(rows, None) or []
            for c in (*cols.texts, cols.label):
                if c not in header:
                    raise GlueDataError(
                        f"{path}:1: task {task.name}: no column {c!r} in the header {header}; {fix}"
                    )
            index = {c: header.index(c) for c in (*cols.texts, cols.label)}
            width = len(header)
        else:
            index = {c: c for c in (*cols.texts, cols.label)}
            width = max(index.values()) + 1
        # MNLI's gold label is the last column; rows of one file all have the header's width
        for line_no, row in enumerate(rows, start=2 if cols.header else 1):
            where = f"{path}:{line_no}"
            if not row:
                continue
            if len(row) < width:
                raise GlueDataError(
                    f"{where}: task {task.name}: {len(row)} tab-separated fields, expected "
                    f"{width}; the line is cut or holds a stray tab"
                )
            texts = [row[index[c]] for c in cols.texts]
            _append(out, task, texts, row[index[cols.label]], where, fix)
    return out


def read_jsonl(path: Path, task: BenchmarkTask) -> Examples:
    """A CLUE split: one JSON object per line."""
    cols = task.file_columns
    fix = f"is {path} the {task.name} file the CLUE benchmark ships?"
    out = Examples([], [], [])
    with open(path, encoding="utf-8-sig") as f:
        for line_no, line in enumerate(f, start=1):
            where = f"{path}:{line_no}"
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise GlueDataError(f"{where}: task {task.name}: not JSON ({e})") from None
            missing = [c for c in (*cols.texts, cols.label) if c not in obj]
            if missing:
                raise GlueDataError(
                    f"{where}: task {task.name}: no field {missing} (fields: {sorted(obj)}); {fix}"
                )
            _append(out, task, [obj[c] for c in cols.texts], obj[cols.label], where, fix)
    return out


def _from_dataset(ds, task: BenchmarkTask, where: str) -> Examples:
    """A Hugging Face ``Dataset`` split; class ids mapped through its ClassLabel names."""
    cols = task.hf_columns
    missing = [c for c in (*cols.texts, cols.label) if c not in ds.column_names]
    if missing:
        raise GlueDataError(
            f"{where}: task {task.name}: no column {missing} (columns: {ds.column_names}); is "
            f"this Hugging Face's {task.hf_config!r} config?"
        )
    names = getattr(ds.features[cols.label], "names", None)
    out = Examples([], [], [])
    columns = [ds[c] for c in (*cols.texts, cols.label)]
    for i, values in enumerate(zip(*columns)):
        *texts, raw = values
        if raw == -1:  # an unlabelled row (test splits)
            continue
        if names is not None and task.kind != REGRESSION:
            raw = names[raw]
        elif task.kind != REGRESSION:
            raw = task.labels[raw] if 0 <= raw < len(task.labels) else str(raw)
        _append(out, task, texts, raw, f"{where} row {i}", "check the copy's label column")
    return out


def _parquet_files(folder: Path, split: str) -> list[Path]:
    return sorted(folder.glob(f"{split}-*.parquet")) or sorted((folder / split).glob("*.parquet"))


def detect_layout(root: Path, task: BenchmarkTask) -> tuple[str, Path] | None:
    """How ``root`` holds ``task`` (layout, folder), or None when it does not hold it."""
    classic = root / task.folder
    suffix = ".tsv" if task.name in BENCHMARKS["glue"] else ".json"
    if (classic / f"train{suffix}").is_file():
        return (TSV if suffix == ".tsv" else JSONL), classic
    hf = root / task.hf_config
    if (hf / "dataset_dict.json").is_file():
        return SAVED, hf
    if _parquet_files(hf, "train"):
        return PARQUET, hf
    return None


def where_looked(root: Path, task: BenchmarkTask) -> str:
    """The end of a message for a ``task`` that :func:`detect_layout` did not find in ``root``:
    where it looked and what to do."""
    return (
        f"(looked for {root / task.folder}/train.* and Hugging Face's {root / task.hf_config}/); "
        f"give the folder that holds it or leave {task.name} out"
    )


def _read_split(layout: str, folder: Path, task: BenchmarkTask, stem: str, hf_split: str, saved):
    if layout in (TSV, JSONL):
        path = folder / f"{stem}.{'tsv' if layout == TSV else 'json'}"
        if not path.is_file():
            raise GlueDataError(
                f"{path}: task {task.name}: missing; the classic layout has "
                f"{stem}{path.suffix} beside train{path.suffix}"
            )
        return (read_tsv if layout == TSV else read_jsonl)(path, task)
    if layout == SAVED:
        if hf_split not in saved:
            raise GlueDataError(
                f"{folder}: task {task.name}: no split {hf_split!r} (splits: {list(saved)})"
            )
        return _from_dataset(saved[hf_split], task, f"{folder}/{hf_split}")
    files = _parquet_files(folder, hf_split)
    if not files:
        raise GlueDataError(
            f"{folder}: task {task.name}: no {hf_split}-*.parquet file; Hugging Face's copy has "
            "one per split"
        )
    # Lazy: datasets takes seconds to import; only Hugging Face copies need it.
    import datasets

    ds = datasets.Dataset.from_parquet([str(f) for f in files])
    return _from_dataset(ds, task, str(files[0]))


def read_task(root: Path, task: BenchmarkTask, layout_folder: tuple[str, Path]) -> BenchmarkData:
    """Every split the task needs from the folder ``detect_layout`` found."""
    layout, folder = layout_folder
    saved = None
    if layout == SAVED:
        # Lazy: datasets takes seconds to import; only Hugging Face copies need it.
        import datasets

        saved = datasets.load_from_disk(str(folder))
    train = _read_split(layout, folder, task, "train", "train", saved)
    evals = {
        name: _read_split(layout, folder, task, stem, hf_split, saved)
        for name, (stem, hf_split) in task.evals.items()
    }
    for name, part in [("train", train), *evals.items()]:
        if not len(part):
            raise GlueDataError(f"{folder}: task {task.name}: the {name} split holds no example")
    return BenchmarkData(task, train, evals, layout, folder)


def load_benchmark(
    benchmark: str, root: str | Path, only: list[str] | None = None
) -> list[BenchmarkData]:
    """The tasks of ``root`` (all it holds, or ``only`` these, each of which must be there)."""
    root = Path(root)
    if not root.is_dir():
        raise GlueDataError(f"--{benchmark} {root}: no such folder")
    tasks = BENCHMARKS[benchmark]
    if only:
        chosen = []
        for name in only:
            task = find_task(benchmark, name)
            if task is None:
                raise GlueDataError(
                    f"--only {name}: not a {benchmark.upper()} task; the tasks: {list(tasks)}"
                )
            if detect_layout(root, task) is None:
                raise GlueDataError(
                    f"{root}: task {task.name} is not there {where_looked(root, task)} of --only"
                )
            chosen.append(task)
    else:
        chosen = [t for t in tasks.values() if detect_layout(root, t) is not None]
        if not chosen:
            raise GlueDataError(
                f"--{benchmark} {root}: holds no {benchmark.upper()} task (looked for "
                f"{', '.join(t.folder for t in tasks.values())} in the classic layout and "
                f"{', '.join(t.hf_config for t in tasks.values())} as Hugging Face saves them)"
            )
    return [read_task(root, t, detect_layout(root, t)) for t in chosen]
