"""GLUE and CLUE through ``python -m pretrain.evaluate --glue/--clue``: the classic files and
Hugging Face's copies read alike, every task's head and metric names, the protocols, the outputs,
and bad input refused with exit 2 before anything is written.

The folders are written here in the layouts their publishers use (download_glue_data.py's TSVs,
``datasets``' save_to_disk and parquet, CLUE's jsonl); the parity with transformers' Trainer on
real GLUE rows is tests/pretrain/evaluate/test_glue_parity.py.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
from helpers.glue import NLI, sentence, write_glue, write_lines
from helpers.tiny_bert import build_tiny_bert

from bertforge.errors import UserError
from bertforge.pretrain.data.glue.readers import GlueDataError, load_benchmark
from bertforge.pretrain.data.glue.tasks import GLUE_TASKS, benchmark_score, score_definition
from bertforge.pretrain.evaluate.__main__ import main as evaluate_main
from bertforge.pretrain.evaluate.glue.protocols import PROTOCOLS, task_settings
from bertforge.pretrain.evaluate.glue.scores import task_scores
from bertforge.pretrain.evaluate.models import ModelSource


def _examples(datas) -> dict:
    return {
        d.task.name: (
            d.train.texts,
            d.train.labels,
            {k: (v.texts, v.labels) for k, v in d.evals.items()},
        )
        for d in datas
    }


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory) -> Path:
    return write_glue(tmp_path_factory.mktemp("glue") / "glue_data")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("tiny") / "bert")


def test_classic_layout_quirks(glue_dir):
    datas = {d.task.name: d for d in load_benchmark("glue", glue_dir)}
    assert sorted(datas) == ["CoLA", "MNLI", "MRPC", "RTE", "STS-B"]
    cola = datas["CoLA"]  # header-less: the first line is an example, its label column 1
    assert len(cola.train) == 48 and cola.train.labels[:2] == [0, 1]
    assert cola.train.texts[0][1] is None
    mrpc = datas["MRPC"]  # the byte-order mark does not hide the "Quality" column
    assert len(mrpc.train) == 48 and mrpc.train.texts[0][0] == mrpc.train.texts[0][1]
    rte = datas["RTE"]  # a lone quote stays in the text, no line swallowed by it
    assert len(rte.train) == 48 and '" said' in rte.train.texts[0][0]
    assert rte.train.labels[:2] == [0, 1]  # entailment, not_entailment in HF's order
    mnli = datas["MNLI"]
    assert list(mnli.evals) == ["MNLI-m", "MNLI-mm"]
    assert mnli.train.labels[:3] == [0, 1, 2]  # entailment, neutral, contradiction
    sts = datas["STS-B"]
    assert isinstance(sts.train.labels[0], float)


def test_hugging_face_copies_read_as_the_classic_files(glue_dir, tmp_path):
    """save_to_disk and parquet copies (label ids by ClassLabel names) give the same examples."""
    import datasets

    classic = load_benchmark("glue", glue_dir)
    saved, parquet = tmp_path / "saved", tmp_path / "parquet"
    for d in classic:
        t = d.task
        feats = {c: datasets.Value("string") for c in t.hf_columns.texts}
        label = (
            datasets.Value("float32")
            if t.kind == "regression"
            else datasets.ClassLabel(names=list(t.labels))
        )
        features = datasets.Features({**feats, "label": label})

        def table(part, t=t, features=features):
            cols = {c: [x[i] for x in part.texts] for i, c in enumerate(t.hf_columns.texts)}
            return datasets.Dataset.from_dict({**cols, "label": part.labels}, features=features)

        splits = {"train": table(d.train)}
        for name, (_, hf_split) in t.evals.items():
            splits[hf_split] = table(d.evals[name])
        datasets.DatasetDict(splits).save_to_disk(str(saved / t.hf_config))
        for split, ds in splits.items():
            (parquet / t.hf_config).mkdir(parents=True, exist_ok=True)
            ds.to_parquet(str(parquet / t.hf_config / f"{split}-00000-of-00001.parquet"))
    want = _examples(classic)
    for root in (saved, parquet):
        got = _examples(load_benchmark("glue", root))
        assert sorted(got) == sorted(want)
        for name in want:
            w_texts, w_labels, w_evals = want[name]
            g_texts, g_labels, g_evals = got[name]
            assert g_texts == w_texts and g_evals.keys() == w_evals.keys()
            assert np.allclose(g_labels, w_labels, atol=1e-6)  # float32 scores
    assert {d.layout for d in load_benchmark("glue", saved)} == {"save_to_disk"}


def test_metrics_against_their_formulas():
    rng = np.random.default_rng(0)
    gold, pred = rng.integers(0, 2, 200), rng.integers(0, 2, 200)
    pred[:120] = gold[:120]
    tp = float(np.sum((gold == 1) & (pred == 1)))
    tn = float(np.sum((gold == 0) & (pred == 0)))
    fp = float(np.sum((gold == 0) & (pred == 1)))
    fn = float(np.sum((gold == 1) & (pred == 0)))
    mcc = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    got = task_scores(("matthews_correlation", "f1", "accuracy"), gold.tolist(), pred.tolist())
    assert got["matthews_correlation"] == pytest.approx(mcc, abs=1e-12)
    assert got["f1"] == pytest.approx(2 * tp / (2 * tp + fp + fn), abs=1e-12)
    assert got["accuracy"] == pytest.approx((tp + tn) / 200, abs=1e-12)
    x, y = rng.normal(size=50), rng.normal(size=50)
    y = x + 0.5 * y
    ranks = lambda v: np.argsort(np.argsort(v)).astype(float)  # noqa: E731  (no ties here)
    got = task_scores(("pearson", "spearmanr"), y.tolist(), x.tolist())
    assert got["pearson"] == pytest.approx(np.corrcoef(x, y)[0, 1], abs=1e-12)
    assert got["spearmanr"] == pytest.approx(np.corrcoef(ranks(x), ranks(y))[0, 1], abs=1e-12)
    # one score predicted for every pair: no correlation, not a NaN in the table
    assert task_scores(("pearson",), y.tolist(), [1.0] * 50) == {"pearson": 0.0}


def test_glue_score_is_bert_papers_average():
    scores = {
        t.reported_name(s): {m: 0.5 for m in t.metrics}
        for t in GLUE_TASKS.values()
        for s in t.evals
    }
    scores["CoLA"]["matthews_correlation"] = 0.1
    scores["WNLI"]["accuracy"] = 1.0  # left out: it cannot move the score
    scores["MNLI-mm"]["accuracy"] = 1.0  # MNLI enters by its matched accuracy
    assert benchmark_score("glue", scores) == pytest.approx((0.5 * 7 + 0.1) / 8)
    del scores["RTE"]
    assert benchmark_score("glue", scores) is None
    assert "WNLI left out" in score_definition("glue")


def test_protocol_settings():
    rte = task_settings("mosaicbert", "RTE", {})
    assert rte.lrs == (1e-5,) and rte.batch_size == 16 and rte.from_mnli and len(rte.seeds) == 5
    # Composer's decoupled weight decay 1e-5 at lr 1e-5 decays like torch AdamW's 1.0
    assert rte.weight_decay == pytest.approx(1.0)
    assert task_settings("bert", "CoLA", {}).lrs == (5e-5, 4e-5, 3e-5, 2e-5)
    assert task_settings("run_glue", "CoLA", {"lrs": (1e-4,)}).lrs == (1e-4,)
    assert set(PROTOCOLS) == {"bert", "mosaicbert", "run_glue"}


def _run(tiny: Path, glue: Path, out: Path, *extra: str) -> int:
    return evaluate_main(
        ["--models", f"tiny={tiny}", "--glue", str(glue), "--out", str(out), "--no_progress"]
        + ["--max_length", "32", "--batch_size", "16", *extra]
    )


def test_mosaicbert_protocol_end_to_end(tiny, glue_dir, tmp_path, capsys):
    """Every head and metric name; MNLI first, RTE and STS-B started from its fine-tuned model;
    glue.json's shape; per-task seeds as the protocol lists them."""
    out = tmp_path / "eval"
    code = _run(
        tiny,
        glue_dir,
        out,
        "--protocol",
        "mosaicbert",
        "--epochs",
        "1",
        "--only",
        "RTE",
        "MNLI",
        "STS-B",
        "CoLA",
        "MRPC",
    )
    assert code == 0
    doc = json.loads((out / "glue.json").read_text())
    row = doc["models"]["tiny"]
    assert set(row) == {"MNLI-m", "MNLI-mm", "RTE", "STS-B", "CoLA", "MRPC", "glue"}
    assert set(row["STS-B"]) == {"pearson", "spearmanr"}
    assert set(row["CoLA"]) == {"matthews_correlation"}
    assert set(row["MRPC"]) == {"f1", "accuracy"}
    assert row["glue"] is None  # SST-2, QQP, QNLI were not run
    results = {r["task"]: r for r in doc["results"]}
    assert [r["task"] for r in doc["results"]][0] == "MNLI"
    assert results["RTE"]["start"] == "MNLI fine-tuned" and results["CoLA"]["start"] == "pretrained"
    assert [r["seed"] for r in results["RTE"]["runs"]] == [19, 8364, 717, 10536, 90166]
    assert all(r["epochs"] == 1.0 and r["seconds"] > 0 for r in results["RTE"]["runs"])
    assert doc["protocol"] == "mosaicbert" and "median" in doc["reported"]
    table = (out / "glue.md").read_text()
    assert "| tiny |" in table and "MNLI-mm acc" in table and "STS-B spearman" in table
    assert table in capsys.readouterr().out


def test_same_seed_same_scores_and_mnli_start_changes_the_encoder(tiny, glue_dir, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    args = ("--only", "RTE", "--epochs", "1", "--lrs", "1e-3", "--seeds", "2")
    assert _run(tiny, glue_dir, a, *args) == 0 and _run(tiny, glue_dir, b, *args) == 0
    runs = [json.loads((d / "glue.json").read_text())["results"][0]["runs"] for d in (a, b)]
    assert [r["scores"] for r in runs[0]] == [r["scores"] for r in runs[1]]
    # the MNLI start: the encoder is the fine-tuned one, the classifier is left behind
    source = ModelSource.from_hf_dir(tiny)
    model = source.build_for("classification", ["a", "b", "c"])
    for p in model.parameters():
        p.data.add_(1.0)
    started = source.with_encoder_of(model, "test").build_for("regression", [])
    key = "bert.encoder.layer.0.attention.self.query.weight"
    assert (started.state_dict()[key] == model.state_dict()[key]).all()
    assert started.classifier.out_features == 1 and started.config.problem_type == "regression"


def test_clue_jsonl(tiny, tmp_path):
    root = tmp_path / "clue"
    rng = random.Random(1)
    for split, n in (("train", 40), ("dev", 12)):
        rows = [
            {"sentence1": sentence(rng), "sentence2": sentence(rng), "label": NLI[i % 3]}
            for i in range(n)
        ]
        rows.append({"sentence1": "a", "sentence2": "b", "label": "-"})  # no gold label: dropped
        write_lines(
            root / "ocnli" / f"{split}.json", [json.dumps(r, ensure_ascii=False) for r in rows]
        )
        csl = [
            {"id": i, "abst": sentence(rng), "keyword": ["cat", "dog"], "label": str(i % 2)}
            for i in range(n)
        ]
        write_lines(root / "csl" / f"{split}.json", [json.dumps(r) for r in csl])
    datas = {d.task.name: d for d in load_benchmark("clue", root)}
    assert len(datas["OCNLI"].train) == 40 and datas["CSL"].train.texts[0][0] == "cat dog"
    out = tmp_path / "out"
    code = evaluate_main(
        ["--models", str(tiny), "--clue", str(root), "--out", str(out), "--no_progress"]
        + ["--epochs", "1", "--max_length", "32"]
    )
    assert code == 0
    row = json.loads((out / "clue.json").read_text())["models"]["bert"]
    assert set(row) == {"OCNLI", "CSL", "clue"} and row["clue"] is None  # 4 tasks missing


def _fresh_copy(glue_dir: Path, dest: Path) -> Path:
    import shutil

    shutil.copytree(glue_dir, dest)
    return dest


@pytest.mark.parametrize(
    "case, fix",
    [
        ("missing_dev", "dev_mismatched.tsv beside train.tsv"),
        ("unknown_task", "not a GLUE task"),
        ("absent_task", "task SST-2 is not there"),
        ("missing_column", "no column '#2 String'"),
        ("bad_label", "label 'maybe' is not one of"),
        ("mnli_start", "add MNLI"),
        ("flag_without_meaning", "--patience: not part of a --glue protocol"),
    ],
)
def test_bad_input_exit_2_nothing_written(tiny, glue_dir, tmp_path, capsys, case, fix):
    root = _fresh_copy(glue_dir, tmp_path / "glue")
    extra: list[str] = []
    if case == "missing_dev":
        (root / "MNLI" / "dev_mismatched.tsv").unlink()
    elif case == "unknown_task":
        extra = ["--only", "SQuAD"]
    elif case == "absent_task":
        extra = ["--only", "SST-2"]
    elif case == "missing_column":
        path = root / "MRPC" / "train.tsv"
        path.write_text(path.read_text("utf-8-sig").replace("#2 String", "#2 Text"), "utf-8")
    elif case == "bad_label":
        path = root / "RTE" / "dev.tsv"
        lines = path.read_text().splitlines()
        lines[3] = lines[3].rsplit("\t", 1)[0] + "\tmaybe"
        path.write_text("\n".join(lines) + "\n")
    elif case == "mnli_start":
        extra = ["--protocol", "mosaicbert", "--only", "RTE"]
    elif case == "flag_without_meaning":
        extra = ["--patience", "2"]
    out = tmp_path / "out"
    assert _run(tiny, root, out, *extra) == 2
    err = capsys.readouterr().err
    assert fix in err
    if case == "bad_label":
        assert f"{root / 'RTE' / 'dev.tsv'}:4" in err  # the file and its line
    assert not out.exists() or not any(out.rglob("glue.*"))


def test_errors_are_user_errors():
    with pytest.raises(GlueDataError, match="no such folder"):
        load_benchmark("glue", "/nonexistent/glue")
    assert issubclass(GlueDataError, UserError)


@pytest.mark.slow  # worker processes of their own
def test_tasks_side_by_side_give_the_serial_scores(tiny, glue_dir, tmp_path):
    """--device cpu,cpu: one worker process per device, MNLI before the tasks that start from
    it; every run's scores equal the serial run's (one thread per worker, one thread here)."""
    import torch

    args = ["--protocol", "mosaicbert", "--epochs", "1", "--seeds", "1", "--max_train_examples"]
    args += ["24", "--only", "MNLI", "RTE"]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)  # two workers: a thread each
        assert _run(tiny, glue_dir, tmp_path / "two", "--device", "cpu,cpu", *args) == 0
        torch.set_num_threads(1)
        assert _run(tiny, glue_dir, tmp_path / "one", "--device", "cpu", *args) == 0
    finally:
        torch.set_num_threads(threads)
    two, one = (json.loads((tmp_path / d / "glue.json").read_text()) for d in ("two", "one"))
    assert two["device"] == "cpu, cpu" and one["device"] == "cpu"
    scores = [
        {r["task"]: [x["scores"] for x in r["runs"]] for r in d["results"]} for d in (two, one)
    ]
    assert scores[0] == scores[1]
    assert {r["task"]: r["start"] for r in two["results"]}["RTE"] == "MNLI fine-tuned"
