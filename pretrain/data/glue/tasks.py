"""The GLUE and CLUE tasks: where each one's files are, its columns, labels, head and metrics.

One :class:`BenchmarkTask` per task. Label lists follow Hugging Face's ``ClassLabel`` order (the
ids its parquet copy stores), so a model fine-tuned on the TSV copy and one on the parquet copy
have the same head. ``file_labels`` maps what the classic files write to those names (CoLA writes
``0``/``1``, MNLI writes the names themselves).

Metrics carry the names Hugging Face ``evaluate``'s ``glue`` metric returns. The benchmark score
is the one BERT's paper (Devlin et al., 2019, Table 1) averages: one number per task, WNLI left
out (its dev set is adversarial to the train set and BERT predicted the majority class): MNLI-m
accuracy, QQP F1, QNLI accuracy, SST-2 accuracy, CoLA Matthews correlation, STS-B Spearman, MRPC
F1, RTE accuracy. CLUE's score is the mean accuracy of its classification tasks, as the CLUE
leaderboard averages them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CLASSIFICATION, REGRESSION = "classification", "regression"


@dataclass(frozen=True)
class Columns:
    """Where one layout keeps a task's texts and label: TSV header names or, for a header-less
    file, column indices; jsonl and Hugging Face copies: field names."""

    texts: tuple[str | int, ...]
    label: str | int
    header: bool = True  # False: CoLA's TSVs have no header line


@dataclass(frozen=True)
class BenchmarkTask:
    """One task of a benchmark and how to read, fine-tune and score it."""

    name: str  # as papers write it: "CoLA", "STS-B"
    folder: str  # its folder in the classic layout (GLUE: download_glue_data.py's; CLUE: lower)
    hf_config: str  # Hugging Face's config name ("cola", "stsb"); the parquet/save_to_disk folder
    kind: str  # CLASSIFICATION | REGRESSION
    labels: tuple[str, ...]  # class names in Hugging Face's ClassLabel order; () for regression
    file_columns: Columns  # the classic files (TSV or CLUE's jsonl)
    hf_columns: Columns  # Hugging Face's copy
    # reported split -> (classic file stem, Hugging Face split); the first one picks the lr
    evals: dict[str, tuple[str, str]]
    metrics: tuple[str, ...]  # evaluate's names; the first is the one the lr is chosen by
    score_metric: str  # the one number of this task in the benchmark score
    in_score: bool = True  # False: WNLI (left out of BERT's average)
    file_labels: dict[str, str] = field(default_factory=dict)  # classic file's label -> name
    skip_labels: tuple[str, ...] = ()  # rows without a gold label the reference loaders drop

    def reported_name(self, split: str) -> str:
        """A reported split's column in tables: the task's name, or MNLI's "MNLI-m"/"MNLI-mm"."""
        return self.name if split == "dev" else split

    @property
    def num_outputs(self) -> int:
        """Width of the head: one output for regression, one per class otherwise."""
        return 1 if self.kind == REGRESSION else len(self.labels)

    def label_name(self, raw: str) -> str | None:
        """A classic file's label as a class name (None: not one of the task's labels)."""
        name = self.file_labels.get(raw, raw)
        return name if name in self.labels else None


def _binary(neg: str, pos: str) -> dict[str, str]:
    return {"0": neg, "1": pos}


_DEV = {"dev": ("dev", "validation")}
_ACC = ("accuracy",)
_F1_ACC = ("f1", "accuracy")
_PAIR = Columns(("sentence1", "sentence2"), "label")

GLUE_TASKS: dict[str, BenchmarkTask] = {
    t.name: t
    for t in (
        BenchmarkTask(
            "CoLA",
            "CoLA",
            "cola",
            CLASSIFICATION,
            ("unacceptable", "acceptable"),
            Columns((3,), 1, header=False),
            Columns(("sentence",), "label"),
            _DEV,
            ("matthews_correlation",),
            "matthews_correlation",
            file_labels=_binary("unacceptable", "acceptable"),
        ),
        BenchmarkTask(
            "SST-2",
            "SST-2",
            "sst2",
            CLASSIFICATION,
            ("negative", "positive"),
            Columns(("sentence",), "label"),
            Columns(("sentence",), "label"),
            _DEV,
            _ACC,
            "accuracy",
            file_labels=_binary("negative", "positive"),
        ),
        BenchmarkTask(
            "MRPC",
            "MRPC",
            "mrpc",
            CLASSIFICATION,
            ("not_equivalent", "equivalent"),
            Columns(("#1 String", "#2 String"), "Quality"),
            _PAIR,
            _DEV,
            _F1_ACC,
            "f1",
            file_labels=_binary("not_equivalent", "equivalent"),
        ),
        BenchmarkTask(
            "STS-B",
            "STS-B",
            "stsb",
            REGRESSION,
            (),
            Columns(("sentence1", "sentence2"), "score"),
            _PAIR,
            _DEV,
            ("pearson", "spearmanr"),
            "spearmanr",
        ),
        BenchmarkTask(
            "QQP",
            "QQP",
            "qqp",
            CLASSIFICATION,
            ("not_duplicate", "duplicate"),
            Columns(("question1", "question2"), "is_duplicate"),
            Columns(("question1", "question2"), "label"),
            _DEV,
            _F1_ACC,
            "f1",
            file_labels=_binary("not_duplicate", "duplicate"),
        ),
        BenchmarkTask(
            "MNLI",
            "MNLI",
            "mnli",
            CLASSIFICATION,
            ("entailment", "neutral", "contradiction"),
            Columns(("sentence1", "sentence2"), "gold_label"),
            Columns(("premise", "hypothesis"), "label"),
            {
                "MNLI-m": ("dev_matched", "validation_matched"),
                "MNLI-mm": ("dev_mismatched", "validation_mismatched"),
            },
            _ACC,
            "accuracy",
        ),
        BenchmarkTask(
            "QNLI",
            "QNLI",
            "qnli",
            CLASSIFICATION,
            ("entailment", "not_entailment"),
            Columns(("question", "sentence"), "label"),
            Columns(("question", "sentence"), "label"),
            _DEV,
            _ACC,
            "accuracy",
        ),
        BenchmarkTask(
            "RTE",
            "RTE",
            "rte",
            CLASSIFICATION,
            ("entailment", "not_entailment"),
            _PAIR,
            _PAIR,
            _DEV,
            _ACC,
            "accuracy",
        ),
        BenchmarkTask(
            "WNLI",
            "WNLI",
            "wnli",
            CLASSIFICATION,
            ("not_entailment", "entailment"),
            _PAIR,
            _PAIR,
            _DEV,
            _ACC,
            "accuracy",
            in_score=False,
            file_labels=_binary("not_entailment", "entailment"),
        ),
    )
}

_NLI = ("entailment", "neutral", "contradiction")
# TNEWS's 15 news categories (ids 105 and 111 are unused in CLUE's labels.json)
_TNEWS = tuple(str(i) for i in range(100, 117) if i not in (105, 111))


def _clue(name: str, labels: tuple[str, ...], columns: Columns, **kw) -> BenchmarkTask:
    """A CLUE classification task: its folder and Hugging Face config are its name in lower case,
    its jsonl files and Hugging Face's copy have the same fields, accuracy scores it."""
    low = name.lower()
    return BenchmarkTask(
        name, low, low, CLASSIFICATION, labels, columns, columns, _DEV, _ACC, "accuracy", **kw
    )


_SENTENCE = Columns(("sentence",), "label")

CLUE_TASKS: dict[str, BenchmarkTask] = {
    t.name: t
    for t in (
        _clue("AFQMC", ("0", "1"), _PAIR),
        _clue("TNEWS", _TNEWS, _SENTENCE),
        _clue("IFLYTEK", tuple(str(i) for i in range(119)), _SENTENCE),
        _clue("OCNLI", _NLI, _PAIR, skip_labels=("-",)),
        _clue("CMNLI", _NLI, _PAIR, skip_labels=("-",)),
        # keywords (joined by spaces), then the abstract
        _clue("CSL", ("0", "1"), Columns(("keyword", "abst"), "label")),
    )
}

BENCHMARKS = {"glue": GLUE_TASKS, "clue": CLUE_TASKS}


def find_task(benchmark: str, name: str) -> BenchmarkTask | None:
    """A task by its name, its folder or its Hugging Face config, any case (None: unknown)."""
    key = name.lower().replace("-", "").replace("_", "")
    for task in BENCHMARKS[benchmark].values():
        forms = (task.name, task.folder, task.hf_config)
        if key in {f.lower().replace("-", "").replace("_", "") for f in forms}:
            return task
    return None


def benchmark_score(benchmark: str, scores: dict[str, dict[str, float]]) -> float | None:
    """The benchmark's average (module doc) of ``{reported name: {metric: value}}`` (names as
    :meth:`BenchmarkTask.reported_name` gives them); None when a task it averages is missing."""
    parts = []
    for task in BENCHMARKS[benchmark].values():
        if not task.in_score:
            continue
        # MNLI: the matched split, as BERT's average takes it
        first = task.reported_name(next(iter(task.evals)))
        if first not in scores:
            return None
        parts.append(scores[first][task.score_metric])
    return sum(parts) / len(parts)


def score_definition(benchmark: str) -> str:
    """The average in words, for tables, JSON and model cards."""
    tasks = [t for t in BENCHMARKS[benchmark].values() if t.in_score]
    terms = ", ".join(f"{t.reported_name(next(iter(t.evals)))} {t.score_metric}" for t in tasks)
    left_out = [t.name for t in BENCHMARKS[benchmark].values() if not t.in_score]
    tail = f"; {', '.join(left_out)} left out, as in BERT's paper" if left_out else ""
    return f"mean of {terms}{tail}"
