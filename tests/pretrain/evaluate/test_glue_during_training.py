"""--downstream_eval glue:DIR[:TASKS] without a model: the spec and its checks, the records of a
job's results (the GLUE score only when every averaged task ran), tokens seen, and the plot.
The trainer run with such a spec: tests/e2e/test_downstream_during_training.py."""

from __future__ import annotations

import json

import pytest

from benchmarks.tasks.glue_like import write_glue_like
from bertforge.pretrain.data.glue.readers import GlueDataError
from bertforge.pretrain.data.glue.spec import is_benchmark_spec, load_spec, parse_spec
from bertforge.pretrain.data.glue.tasks import GLUE_TASKS
from bertforge.pretrain.evaluate.glue.checkpoint_job import benchmark_records, tokens_seen
from bertforge.pretrain.evaluate.glue.progress_plot import first_metrics, read_records, redraw


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory):
    return write_glue_like(tmp_path_factory.mktemp("glue"), train=12, dev=6)


def test_spec_forms():
    assert is_benchmark_spec("glue:/data/glue") and is_benchmark_spec("clue:x:AFQMC")
    assert not is_benchmark_spec("tasks.json") and not is_benchmark_spec("superglue:x")
    spec = parse_spec("glue:/data/glue:RTE, sts-b")
    assert (spec.benchmark, str(spec.root), spec.names) == ("glue", "/data/glue", ("RTE", "sts-b"))
    assert parse_spec("clue:/data/clue").names == ()


def test_spec_reads_the_tasks_named_or_all(glue_dir):
    _, datas = load_spec(f"glue:{glue_dir}:stsb")
    assert [d.task.name for d in datas] == ["STS-B"]
    _, datas = load_spec(f"glue:{glue_dir}")
    assert [d.task.name for d in datas] == ["STS-B", "RTE"]  # GLUE's order
    assert len(datas[1].train) == 12 and len(datas[1].evals["dev"]) == 6


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("glue:{d}/nowhere", "is not a folder"),
        ("glue:{d}:RTE,BoolQ", "BoolQ is not a GLUE task; the tasks: CoLA, SST-2"),
        ("glue:{d}:RTE,MRPC", "does not hold MRPC (looked for"),
        ("glue:{d}:RTE,rte", "RTE is named twice"),
        ("glue:{d}:RTE,", "an empty folder or task name"),
        ("glue:", "give glue:DIR or glue:DIR:TASK,TASK"),
        ("glue:{d}/RTE", "holds no GLUE task"),
    ],
)
def test_bad_specs_name_the_flag(glue_dir, spec, says):
    text = spec.format(d=glue_dir)
    with pytest.raises(GlueDataError) as e:
        load_spec(text)
    assert str(e.value).startswith(f"--downstream_eval {text}: ")
    assert says in str(e.value)


def test_a_bad_line_names_the_flag_and_the_file(tmp_path):
    data = write_glue_like(tmp_path / "glue", train=4, dev=2)
    dev = data / "RTE" / "dev.tsv"
    dev.write_text(dev.read_text() + "9\ta\tb\tmaybe\n")
    with pytest.raises(GlueDataError, match=rf"--downstream_eval glue:{data}: {dev}:4: .*'maybe'"):
        load_spec(f"glue:{data}")


def _results(task_names: list[str]) -> dict:
    """What evaluate_benchmark returns for one model, each metric scored 0.5."""
    from bertforge.pretrain.evaluate.glue.suite import summary

    results = []
    for name in task_names:
        task = GLUE_TASKS[name]
        evals = {
            task.reported_name(s): {m: {"median": 0.5} for m in task.metrics} for s in task.evals
        }
        sizes = {n: 10 for n in evals}
        run = {"seed": 42, "seconds": 2.0}
        results.append(
            {"model": "m", "task": name, "lr": 2e-5, "evals": evals, "train": 8, "runs": [run]}
            | {"eval_sizes": sizes}
        )
    out = {"benchmark": "glue", "results": results}
    out["summary"] = summary(out)
    return out


def test_records_and_the_score_only_when_every_averaged_task_ran():
    extra = {"step": 4, "tokens": 1000, "hours": 0.01}
    records = benchmark_records(_results(["RTE", "STS-B", "MNLI"]), extra)
    assert [(r["task"], r["metric"]) for r in records] == [
        ("RTE", "accuracy"),
        ("STS-B", "pearson"),
        ("STS-B", "spearmanr"),
        ("MNLI-m", "accuracy"),
        ("MNLI-mm", "accuracy"),
    ]
    r = records[0]
    assert r | extra == r and r["split"] == "downstream" and r["benchmark"] == "glue"
    assert (r["lr"], r["seed"], r["train"], r["test"], r["seconds"]) == (2e-5, 42, 8, 10, 2.0)
    every = [t for t in GLUE_TASKS if t != "WNLI"]
    score = benchmark_records(_results(every), extra)[-1]
    assert (score["task"], score["metric"], score["value"]) == ("GLUE", "score", 0.5)
    assert score["seconds"] == 2.0 * len(every)


def test_tokens_seen_takes_each_steps_last_record(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    lines = [{"step": 1, "tokens": 10}, {"step": 2, "tokens": 20}, {"step": 3, "tokens": 30}]
    lines += [{"step": 3, "tokens": 31}, {"split": "validation", "step": 3, "val_loss": 1.0}]
    metrics.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert tokens_seen(metrics, 3) == 61  # a guard's rollback repeated step 3
    assert tokens_seen(metrics, 2) == 30
    assert tokens_seen(metrics, 5) is None  # steps 4 and 5 are not there
    assert tokens_seen(tmp_path / "nowhere.jsonl", 1) is None


def test_plot_from_every_record_of_the_folder(tmp_path):
    rows = []
    for step, hours in ((2, 0.1), (4, 0.2)):
        extra = {"step": step, "tokens": 2_000_000 * step, "hours": hours}
        rows += benchmark_records(_results(["RTE", "STS-B"]), extra)
    (tmp_path / "step_00000002.jsonl").write_text(json.dumps(rows[0]) + "\n")
    (tmp_path / "step_00000004.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = read_records(tmp_path, "glue")
    assert len(got) == len(rows)  # the step-2 RTE record in both files counts once
    path = redraw(tmp_path, "glue")
    assert path == tmp_path / "glue_vs_tokens.png" and path.stat().st_size > 10_000
    assert first_metrics("glue")["STS-B"] == "pearson" and first_metrics("glue")["GLUE"] == "score"
    for r in rows:  # a run whose checkpoints record neither: no plot, a warning
        r.pop("tokens"), r.pop("hours")
    other = tmp_path / "other"
    other.mkdir()
    (other / "step_00000002.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert redraw(other, "glue") is None and not (other / "glue_vs_tokens.png").exists()


def test_the_job_gets_the_spec_and_the_runs_device(glue_dir, tmp_path, monkeypatch):
    """--downstream_device reaches the glue job's command line (its fine-tuning runs there,
    bf16 autocast on CUDA); a bad folder fails when the jobs are set up, not in the first job."""
    from bertforge.pretrain.components import downstream_jobs

    started = []

    class Job:
        pid = 0

    monkeypatch.setattr(
        downstream_jobs.subprocess, "Popen", lambda cmd, **kw: started.append(cmd) or Job()
    )
    spec = f"glue:{glue_dir}:RTE"
    jobs = downstream_jobs.DownstreamJobs(
        tmp_path, spec, 2, max_examples=8, device="cuda:1", rank=0, metrics=None
    )
    jobs.after_save(2)
    (cmd,) = started
    assert cmd[cmd.index("--device") + 1] == "cuda:1" and cmd[cmd.index("--tasks") + 1] == spec
    assert cmd[cmd.index("--max_examples") + 1] == "8"
    with pytest.raises(GlueDataError, match="is not a folder"):
        downstream_jobs.DownstreamJobs(
            tmp_path, "glue:/nowhere", 2, max_examples=8, device="cpu", rank=0, metrics=None
        )
