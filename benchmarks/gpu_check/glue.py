"""The GPU check's GLUE part: GLUE fine-tuning throughput, and the short pretraining run scored
by the job that ``--downstream_eval glue:DIR`` starts during training.

1. Throughput: a BERT-base-shaped model (random init: speed does not depend on the weights)
   fine-tuned once with the run_glue settings (batch 32, 128 tokens, 3 epochs) on an RTE-like
   task in GLUE's layout (:mod:`benchmarks.tasks.glue_like`, written here), through
   :func:`pretrain.evaluate.glue.finetune.fine_tune`; its ``train_examples_per_second`` (the
   whole run: the model's build, every step, no dev scoring).
2. The train part's run that saves a checkpoint (the resume configuration) scored at its newest
   checkpoint by ``python -m pretrain.evaluate.downstream RUN --tasks glue:DIR`` (called in this
   process) on the RTE-like and STS-B-like tasks, beside its tokens and GPU-hours (one GPU: the
   run's training hours at the checkpoint). GLUE's own score needs its eight tasks, which a node
   without network does not have: the records hold the two tasks' scores and no GLUE score.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.gpu_check.common import PartResult, Plan, run_name, save_part, shards_dir
from benchmarks.tasks.glue_like import write_glue_like


def random_source(preset: str, tokenizer_dir: Path):
    """A ``ModelSource`` of a randomly initialised BERT of ``preset``'s shape (transformers'
    BertModel, SDPA) with the shards' tokenizer."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from bertforge.pretrain.evaluate.models import ModelSource
    from bertforge.pretrain.model.registry import PRESETS

    p = PRESETS[preset]
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    conf = BertConfig(
        vocab_size=len(tok),
        hidden_size=p.hidden_size,
        num_hidden_layers=p.num_hidden_layers,
        num_attention_heads=p.num_attention_heads,
        intermediate_size=p.intermediate_size,
        max_position_embeddings=p.max_position_embeddings,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    state = {f"bert.{k}": v for k, v in BertModel(conf).state_dict().items()}
    return ModelSource(conf, state, tok, f"random {preset}")


def finetune_throughput(plan: Plan, data: Path, tokenizer_dir: Path, device) -> dict:
    """One run_glue fine-tuning of the random model on the RTE-like task; its row."""
    from bertforge.pretrain.data.glue.readers import load_benchmark
    from bertforge.pretrain.evaluate.glue.finetune import encode, fine_tune
    from bertforge.pretrain.evaluate.glue.protocols import task_settings

    (rte,) = load_benchmark("glue", data, ["RTE"])
    settings = task_settings("run_glue", "RTE", {})  # batch 32, 128 tokens, 3 epochs
    source = random_source(plan.glue_model, tokenizer_dir)
    train = encode(source.tokenizer, rte.train, settings.max_length)
    dev = rte.evals["dev"]
    evals = {"dev": (encode(source.tokenizer, dev, settings.max_length), dev.labels)}
    result, _ = fine_tune(
        source,
        rte.task,
        train,
        rte.train.labels,
        evals,
        settings,
        settings.lrs[0],
        settings.seeds[0],
        device,
    )
    lengths = [len(ids) for ids in train["input_ids"]]
    return {
        "model": f"{plan.glue_model} (random init)",
        "task": "RTE-like",
        "train examples": len(rte.train),
        "epochs": settings.epochs,
        "batch": settings.batch_size,
        "max_length": settings.max_length,
        "mean tokens": round(sum(lengths) / len(lengths), 1),
        "steps": result["steps"],
        "train examples/s": round(result["train_examples_per_second"], 1),
        "dev accuracy": round(result["scores"]["dev"]["accuracy"], 3),
        "seconds": round(result["seconds"], 1),
    }


def score_run(plan: Plan, out: Path, data: Path, device: str) -> dict:
    """The glue job on the train part's checkpointed run: the part's details."""
    from bertforge.pretrain.evaluate import downstream

    run = out / "train" / run_name(*plan.resume_config)
    if not (run / "checkpoints").is_dir():
        raise RuntimeError(f"needs the train part's run {run} with its checkpoint")
    folder = out / "glue" / "run_scores"
    records_file = folder / "records.jsonl"
    folder.mkdir(parents=True, exist_ok=True)
    records_file.unlink(missing_ok=True)
    argv = [str(run), "--tasks", f"glue:{data}", "--out", str(records_file)]
    argv += ["--max_examples", str(plan.glue_max_examples), "--device", device]
    if downstream.main(argv) != 0:
        raise RuntimeError("the glue job failed (logs/glue.log)")
    records = [json.loads(x) for x in records_file.read_text().splitlines() if x.strip()]
    first, score = records[0], next((r for r in records if r["task"] == "GLUE"), None)
    return {
        "run": f"{run.name}@{first['step']}",
        "run tokens": first.get("tokens"),
        "run GPU-hours": None if "hours" not in first else round(first["hours"], 4),
        "run scores x 100": ", ".join(
            f"{r['task']} {r['metric']} {100 * r['value']:.1f}" for r in records
        ),
        "run train/dev examples per task": f"{first['train']}/{first['test']}",
        "run GLUE score": round(100 * score["value"], 1)
        if score
        else "none: the synthetic folder holds 2 of GLUE's 8 tasks",
        "run plot": str(folder / "glue_vs_tokens.png"),
    }


def part_glue(plan: Plan, out: Path, res: PartResult, deadline: float) -> None:
    """Throughput row, then the run's scores (module doc)."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    data = write_glue_like(out / "glue" / "data", plan.glue_examples, plan.glue_dev)
    tokenizer_dir = shards_dir(out, plan.seq_lens[0]) / "tokenizer"
    res.rows.append(finetune_throughput(plan, data, tokenizer_dir, torch.device(device)))
    save_part(out, res)
    res.details.update(score_run(plan, out, data, device))
    res.status = "ok"
