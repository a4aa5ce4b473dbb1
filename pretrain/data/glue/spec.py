"""``--downstream_eval glue:DIR[:TASKS]`` (or ``clue:``): a benchmark folder and which of its tasks
a run scores while it trains.

``glue:DIR`` is every GLUE task the folder holds; ``glue:DIR:RTE,STS-B`` these ones (a task by
its name, its folder or its Hugging Face config, any case: :func:`tasks.find_task`). The folder
is read as ``bertforge evaluate --glue DIR`` reads it (:func:`readers.load_benchmark`):
the trainer reads and checks every split at launch (:func:`load_spec`), each background job reads
it again. A folder whose name holds a ``:`` needs its task list: the text after the last ``:`` is
the list.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bertforge.pretrain.data.glue.readers import (
    BenchmarkData,
    GlueDataError,
    detect_layout,
    load_benchmark,
    where_looked,
)
from bertforge.pretrain.data.glue.tasks import BENCHMARKS, BenchmarkTask, find_task

FLAG = "--downstream_eval"


@dataclass(frozen=True)
class BenchmarkSpec:
    """A parsed ``BENCH:DIR[:TASKS]``: the benchmark, its folder and the tasks named (() = all
    the folder holds)."""

    benchmark: str  # "glue" | "clue"
    root: Path
    names: tuple[str, ...]
    text: str  # as given, for messages


def is_benchmark_spec(value: str) -> bool:
    """True for ``glue:...`` and ``clue:...``; anything else is a tasks JSON file."""
    prefix, colon, _ = value.partition(":")
    return bool(colon) and prefix in BENCHMARKS


def parse_spec(value: str, flag: str = FLAG) -> BenchmarkSpec:
    """``BENCH:DIR[:T1,T2]`` -> :class:`BenchmarkSpec` (the syntax only; nothing is read)."""
    bench, _, rest = value.partition(":")
    usage = f"give {bench or 'glue'}:DIR or {bench or 'glue'}:DIR:TASK,TASK"
    if bench not in BENCHMARKS or not rest:
        raise GlueDataError(f"{flag} {value}: {usage} (benchmarks: {', '.join(BENCHMARKS)})")
    root, names = rest, ()
    if ":" in rest:
        root, _, tail = rest.rpartition(":")
        names = tuple(n.strip() for n in tail.split(","))
        if not root or not all(names):
            raise GlueDataError(f"{flag} {value}: an empty folder or task name; {usage}")
    return BenchmarkSpec(bench, Path(root), names, value)


def resolve_spec(value: str, flag: str = FLAG) -> tuple[BenchmarkSpec, list[BenchmarkTask]]:
    """The spec and its tasks, checked without reading them: the folder is there, each task
    named is one of the benchmark's (once) and the folder holds it (cheap: no file is read)."""
    spec = parse_spec(value, flag)
    bench, root = spec.benchmark, spec.root
    if not root.is_dir():
        raise GlueDataError(
            f"{flag} {value}: {root} is not a folder; give the {bench.upper()} folder "
            "(download_glue_data.py's layout, CLUE's jsonl, or Hugging Face's copies per task)"
        )
    if not spec.names:
        found = [t for t in BENCHMARKS[bench].values() if detect_layout(root, t) is not None]
        if not found:
            raise GlueDataError(
                f"{flag} {value}: {root} holds no {bench.upper()} task (looked for "
                f"{', '.join(t.folder for t in BENCHMARKS[bench].values())}/train.* and Hugging "
                "Face's copies)"
            )
        return spec, found
    tasks: list[BenchmarkTask] = []
    for name in spec.names:
        task = find_task(bench, name)
        if task is None:
            raise GlueDataError(
                f"{flag} {value}: {name} is not a {bench.upper()} task; the tasks: "
                f"{', '.join(BENCHMARKS[bench])}"
            )
        if task in tasks:
            raise GlueDataError(f"{flag} {value}: {task.name} is named twice")
        if detect_layout(root, task) is None:
            raise GlueDataError(
                f"{flag} {value}: {root} does not hold {task.name} {where_looked(root, task)}"
            )
        tasks.append(task)
    return spec, tasks


def load_spec(value: str, flag: str = FLAG) -> tuple[BenchmarkSpec, list[BenchmarkData]]:
    """The spec and every split of its tasks, read and checked (a bad file raises
    :class:`GlueDataError` naming ``flag``, the file and the line)."""
    spec, tasks = resolve_spec(value, flag)
    try:
        datas = load_benchmark(spec.benchmark, spec.root, [t.name for t in tasks])
    except GlueDataError as e:
        raise GlueDataError(f"{flag} {value}: {e}") from None
    return spec, datas
