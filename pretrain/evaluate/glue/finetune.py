"""One GLUE/CLUE fine-tuning run: a model, a task, a learning rate, a seed -> dev scores.

What transformers' ``Trainer`` does with ``run_glue.py``'s settings, written out so that it is
fast and its randomness is ours to seed: AdamW without weight decay on biases and LayerNorm
weights, a linear warmup over ``ceil(warmup_ratio x steps)`` steps then linear decay to 0, the
gradient norm clipped at ``grad_clip``, ``ceil(epochs x batches per epoch)`` steps over the whole
train split, then every reported split scored once. Batches are padded to their longest example
(dynamic padding) and drawn by transformers' ``LengthGroupedSampler`` (examples of similar
length together, in a new seeded order each epoch), so little of a batch is padding; evaluation
runs longest-first. A classification task's head has one output per class and a cross-entropy
loss; a regression task's (STS-B) one output and a mean-squared-error loss
(``problem_type="regression"``). The seed fixes the head's initialisation, dropout and the data
order: the same seed gives the same scores on one device.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch

from bertforge.pretrain.data.glue.readers import Examples
from bertforge.pretrain.data.glue.tasks import REGRESSION, BenchmarkTask
from bertforge.pretrain.evaluate.finetune import decay_groups, seed_everything
from bertforge.pretrain.evaluate.glue.protocols import Settings
from bertforge.pretrain.evaluate.glue.scores import task_scores

FEATURES = ("input_ids", "token_type_ids", "attention_mask")
FUSED_ADAMW_DEVICES = ("cpu", "cuda")  # where torch's fused AdamW runs


def encode(tokenizer, examples: Examples, max_length: int) -> dict[str, list]:
    """Token ids of a split (pairs joined by the tokenizer), cut at ``max_length`` tokens."""
    first = [a for a, _ in examples.texts]
    second = [b for _, b in examples.texts] if examples.texts[0][1] is not None else None
    enc = tokenizer(first, second, truncation=True, max_length=max_length)
    return {k: enc[k] for k in FEATURES if k in enc}


def collate(features: dict[str, list], index: list[int], pad_id: int, device) -> dict:
    """A batch of ``index``, padded to its longest example (``attention_mask`` 0 on padding)."""
    width = max(len(features["input_ids"][i]) for i in index)
    batch = {}
    for key, rows in features.items():
        fill = pad_id if key == "input_ids" else 0
        out = torch.full((len(index), width), fill, dtype=torch.long)
        for r, i in enumerate(index):
            out[r, : len(rows[i])] = torch.as_tensor(rows[i])
        batch[key] = out.to(device, non_blocking=True)
    return batch


def _train_batches(lengths: list[int], batch_size: int, seed: int, total: int):
    """``total`` batches of example indices, length-grouped, a new seeded order each epoch."""
    # Lazy: transformers takes seconds to import; only this path needs it.
    from transformers.trainer_pt_utils import LengthGroupedSampler

    done, epoch = 0, 0
    while done < total:
        g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        order = list(LengthGroupedSampler(batch_size, lengths=lengths, generator=g))
        for b in range(0, len(order), batch_size):
            yield order[b : b + batch_size]
            done += 1
            if done == total:
                return
        epoch += 1


def total_steps(train_examples: int, settings: Settings) -> int:
    """Optimizer steps of a run: ``epochs`` passes over the train split."""
    return max(1, math.ceil(settings.epochs * math.ceil(train_examples / settings.batch_size)))


@torch.no_grad()
def predict(model, features: dict[str, list], batch_size: int, pad_id: int, device, task):
    """Class ids (or scores, regression) of every example, in the split's order."""
    model.eval()
    n = len(features["input_ids"])
    order = sorted(range(n), key=lambda i: -len(features["input_ids"][i]))
    out = np.empty(n, dtype=np.float64 if task.kind == REGRESSION else np.int64)
    for b in range(0, n, batch_size):
        index = order[b : b + batch_size]
        with _autocast(device):
            logits = model(**collate(features, index, pad_id, device)).logits.float().cpu()
        out[index] = logits[:, 0].numpy() if task.kind == REGRESSION else logits.argmax(-1).numpy()
    return out.tolist()


def _autocast(device):
    """bf16 autocast on a GPU that has it; fp32 elsewhere (the CPU, and the tests)."""
    use = device.type == "cuda" and torch.cuda.is_bf16_supported()
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=use)


def fine_tune(
    source,
    task: BenchmarkTask,
    train: dict[str, list],
    train_labels: list,
    evals: dict[str, tuple[dict[str, list], list]],
    settings: Settings,
    lr: float,
    seed: int,
    device: torch.device,
    progress=None,
) -> tuple[dict[str, Any], torch.nn.Module]:
    """Fine-tune a fresh task model of ``source`` (a ``models.ModelSource``); its scores on each
    reported split (``evals``: name -> (features, gold labels)) and the model itself."""
    start = time.perf_counter()
    seed_everything(seed)
    model = source.build_for(task.kind, list(task.labels)).to(device)
    pad_id = source.tokenizer.pad_token_id or 0
    total = total_steps(len(train_labels), settings)
    opt = torch.optim.AdamW(
        decay_groups(model, settings.weight_decay),
        lr=lr,
        betas=settings.adam_betas,
        eps=settings.adam_eps,
        # one fused kernel per step, Trainer's default since torch 2.8; on the CPU torch's other
        # AdamW steps each tensor in turn: a fifth of a MiniLM step's time (cProfile, 2 cores)
        fused=device.type in FUSED_ADAMW_DEVICES,
    )
    # Lazy: transformers takes seconds to import; only this path needs it.
    from transformers import get_linear_schedule_with_warmup

    warmup = math.ceil(settings.warmup_ratio * total)  # as Trainer's get_warmup_steps rounds
    sched = get_linear_schedule_with_warmup(opt, warmup, total)
    dtype = torch.float32 if task.kind == REGRESSION else torch.long
    labels = torch.tensor(train_labels, dtype=dtype)
    lengths = [len(x) for x in train["input_ids"]]
    model.train()
    examples = tokens = 0  # tokens: padding included, the work a batch costs
    # Training time: the first batch drawn to the last optimizer step (not the model's build,
    # not the scoring), the span the Trainer comparison in benchmarks/evaluation times too.
    train_start, train_cpu = time.perf_counter(), time.process_time()
    for index in _train_batches(lengths, settings.batch_size, seed, total):
        batch = collate(train, index, pad_id, device)
        batch["labels"] = labels[index].to(device)
        with _autocast(device):
            loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        examples += len(index)
        tokens += batch["input_ids"].numel()
        if progress is not None:
            progress.update(1)
    train_seconds = time.perf_counter() - train_start
    train_cpu = time.process_time() - train_cpu  # this process's CPU time: steadier when shared
    scores = {
        name: task_scores(
            task.metrics, gold, predict(model, feats, 2 * settings.batch_size, pad_id, device, task)
        )
        for name, (feats, gold) in evals.items()
    }
    result = {
        "lr": lr,
        "seed": seed,
        "epochs": settings.epochs,
        "steps": total,
        "scores": scores,
        "train_examples": examples,
        "train_tokens": tokens,
        "train_seconds": train_seconds,
        "train_cpu_seconds": train_cpu,
        "train_examples_per_second": examples / train_seconds,
        "seconds": time.perf_counter() - start,
    }
    return result, model
