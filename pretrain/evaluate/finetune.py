"""One fine-tuning run: a model, a task, a learning rate, a seed -> dev and test scores.

The recipe fits the model and the data rather than a finished BERT-base only: AdamW without weight
decay on biases and LayerNorm, linear warmup then linear decay, gradient clipping at 1, for at
least ``epochs`` passes *and* at least ``min_steps`` optimizer steps (a few hundred examples get
many passes; a small or young model needs them), with the dev score checked ``dev_checks`` times
over the run: the weights of the best check are kept and scored on test, and the run stops after
``patience`` checks without a better dev score. The grid reaches small-model rates (1e-3); the
best median dev score picks the rate (runner.py).

A run is a pure function of (model weights, task data, recipe, lr, seed) on a given device: the
head's initialisation, dropout and the data order all come from the seed, so two runs with the
same seed give the same scores. Token classification labels the first sub-token of each word; the
other sub-tokens are ignored by the loss, and a word cut off by ``max_length`` (or one the
tokenizer turns into nothing) is predicted as "O" (BIO) or as no tag (plain tags), i.e. scored as
a miss.
A classification text over ``max_length`` tokens is cut to its first tokens, split into
windows or cut to its key sentences, as the recipe's ``long_documents`` says (long_documents.py).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np
import torch

from bertforge.pretrain.data.downstream_tasks import TaskData, TaskError
from bertforge.pretrain.data.masking import IGNORE_INDEX
from bertforge.pretrain.evaluate import long_documents as longdoc
from bertforge.pretrain.evaluate.metrics import PRIMARY, score

MISSING_TAG = "<none>"  # the prediction of a plain-tag word the model never saw (truncated)


@dataclass(frozen=True)
class Recipe:
    """Fine-tuning hyper-parameters of one task type (a task's "recipe" key overrides fields)."""

    lrs: tuple[float, ...] = (3e-5, 1e-4, 3e-4, 1e-3)  # grid; the best median dev score wins
    epochs: int = 3  # passes over the training split, at least
    min_steps: int = 300  # optimizer steps, at least (more passes over a small training split)
    dev_checks: int = 10  # dev scores over a run; the best one's weights are scored on test
    patience: int = 3  # stop after this many dev checks without a better score (0: never)
    batch_size: int = 32
    warmup_ratio: float = 0.1  # share of the steps with a linear warmup
    weight_decay: float = 0.01
    max_length: int = 128  # tokens per example (pairs: both texts together)
    grad_clip: float = 1.0
    long_documents: str = longdoc.FIRST  # a text over max_length: first | windows | key_sentences
    window_stride: int = 0  # windows: tokens from one window's start to the next (0: half one)


DEFAULT_RECIPES = {"classification": Recipe(), "token_classification": Recipe()}


def recipe_for(data: TaskData, overrides: dict[str, Any] | None = None) -> Recipe:
    """The task type's default recipe, then the task file's "recipe", then ``overrides``."""
    known = {f.name for f in fields(Recipe)}
    merged: dict[str, Any] = {}
    for source in (data.spec.recipe, overrides or {}):
        unknown = sorted(set(source) - known)
        if unknown:
            raise TaskError(
                f"task {data.spec.name!r}: unknown recipe key(s) {unknown}; known: {sorted(known)}"
            )
        merged.update({k: v for k, v in source.items() if v is not None})
    if data.spec.max_length is not None and "max_length" not in (overrides or {}):
        merged["max_length"] = data.spec.max_length
    if "lrs" in merged:
        merged["lrs"] = tuple(float(x) for x in merged["lrs"])
    recipe = replace(DEFAULT_RECIPES[data.spec.type], **merged)
    longdoc.check(data, recipe.long_documents, recipe.max_length, recipe.window_stride)
    return recipe


@dataclass
class Encoded:
    """Tokenized splits: features for the model, and per example the word ids (token tasks)."""

    train: list[dict[str, Any]]
    dev: list[dict[str, Any]]
    test: list[dict[str, Any]]


def _encode_split(
    tokenizer, data: TaskData, examples: list, max_length: int, long_documents: str, stride: int
) -> list[dict]:
    label_id = {lab: i for i, lab in enumerate(data.labels)}
    feats = []
    if data.spec.type == "classification":
        pairs = [ex.text_pair for ex in examples] if data.scheme == "pair" else None
        texts = [ex.text for ex in examples]
        if long_documents == longdoc.WINDOWS:
            labels = [label_id[ex.label] for ex in examples]
            return longdoc.window_features(tokenizer, texts, labels, max_length, stride)
        if long_documents == longdoc.KEY_SENTENCES:
            texts = longdoc.key_sentence_texts(tokenizer, texts, max_length)
        enc = tokenizer(texts, pairs, truncation=True, max_length=max_length)
        for i, ex in enumerate(examples):
            feats.append({k: enc[k][i] for k in enc} | {"labels": label_id[ex.label]})
        return feats
    if not getattr(tokenizer, "is_fast", False):
        raise TaskError("token classification needs a fast tokenizer (word alignment)")
    enc = tokenizer(
        [ex.tokens for ex in examples],
        is_split_into_words=True,
        truncation=True,
        max_length=max_length,
    )
    for i, ex in enumerate(examples):
        words = enc.word_ids(i)
        labels, prev = [], None
        for w in words:
            first = w is not None and w != prev
            labels.append(label_id.get(ex.tags[w], IGNORE_INDEX) if first else IGNORE_INDEX)
            prev = w
        feat = {k: enc[k][i] for k in enc} | {"labels": labels}
        feats.append(feat | {"_words": words})
    return feats


def encode(
    tokenizer,
    data: TaskData,
    max_length: int,
    long_documents: str = longdoc.FIRST,
    window_stride: int = 0,
) -> Encoded:
    """Tokenize the task's three splits with ``tokenizer``; a text over ``max_length`` tokens as
    ``long_documents`` says (see long_documents.py)."""
    return Encoded(
        *(
            _encode_split(tokenizer, data, part, max_length, long_documents, window_stride)
            for part in (data.train, data.dev, data.test)
        )
    )


def encode_for(tokenizer, data: TaskData, recipe: Recipe) -> Encoded:
    """:func:`encode` with the recipe's length and long-document strategy."""
    return encode(tokenizer, data, recipe.max_length, recipe.long_documents, recipe.window_stride)


def _collate(tokenizer, feats: list[dict[str, Any]], device: torch.device) -> dict:
    plain = [
        {k: v for k, v in f.items() if k not in ("labels", "_words", longdoc.DOC)} for f in feats
    ]
    batch = tokenizer.pad(plain, return_tensors="pt")
    labels = [f["labels"] for f in feats]
    if isinstance(labels[0], list):
        width = batch["input_ids"].shape[1]
        labels = [lab + [IGNORE_INDEX] * (width - len(lab)) for lab in labels]
    batch["labels"] = torch.tensor(labels, dtype=torch.long)
    return {k: v.to(device) for k, v in batch.items()}


def decay_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW parameter groups: ``weight_decay`` on the matrices, none on biases and norms (as
    transformers' Trainer groups them)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 or "LayerNorm" in name else decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def _optimizer(model: torch.nn.Module, lr: float, recipe: Recipe) -> torch.optim.Optimizer:
    return torch.optim.AdamW(decay_groups(model, recipe.weight_decay), lr=lr)


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (head initialisation, dropout)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def total_steps(train_examples: int, recipe: Recipe) -> int:
    """Optimizer steps of a run: ``epochs`` passes, or ``min_steps`` when that is more."""
    per_epoch = math.ceil(train_examples / recipe.batch_size)
    return max(per_epoch * recipe.epochs, recipe.min_steps)


def _batches(n: int, batch_size: int, seed: int) -> Iterator[list[int]]:
    """Example indices a batch at a time, epoch after epoch, each epoch in a new seeded order."""
    order = torch.Generator().manual_seed(seed)
    while True:
        perm = torch.randperm(n, generator=order).tolist()
        for b in range(0, n, batch_size):
            yield perm[b : b + batch_size]


def _fit(
    model,
    tokenizer,
    data: TaskData,
    encoded: Encoded,
    recipe: Recipe,
    lr: float,
    seed: int,
    device,
    progress=None,
) -> dict[str, Any]:
    """Train, checking dev ``recipe.dev_checks`` times; leaves the model at its best dev check.
    ``progress`` (a tqdm bar) counts the planned steps, the ones early stopping skipped too."""
    # Lazy: transformers takes seconds to import; only this path needs it.
    from transformers import get_linear_schedule_with_warmup

    total = total_steps(len(encoded.train), recipe)
    check_every = max(1, math.ceil(total / max(1, recipe.dev_checks)))
    opt = _optimizer(model, lr, recipe)
    sched = get_linear_schedule_with_warmup(opt, int(recipe.warmup_ratio * total), total)
    primary = PRIMARY[data.scheme]
    stream = _batches(len(encoded.train), recipe.batch_size, seed)
    best: dict[str, Any] = {"dev": None, "step": 0, "state": None}
    since_best = 0
    model.train()
    for step in range(1, total + 1):
        batch = [encoded.train[i] for i in next(stream)]
        loss = model(**_collate(tokenizer, batch, device)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if progress is not None:
            progress.update(1)
        if step % check_every and step != total:
            continue
        preds = predict(model, tokenizer, encoded.dev, recipe.batch_size, device)
        dev = score_split(data, data.dev, encoded.dev, preds)
        model.train()
        if best["dev"] is None or dev[primary] > best["dev"][primary]:
            state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            best, since_best = {"dev": dev, "step": step, "state": state}, 0
        else:
            since_best += 1
            if recipe.patience and since_best >= recipe.patience:
                break
    if progress is not None:
        progress.update(total - step)  # stopped early: the bar still ends at its planned total
    model.load_state_dict(best["state"])
    return {"dev": best["dev"], "steps": step, "best_step": best["step"], "planned_steps": total}


@torch.no_grad()
def predict(model, tokenizer, feats, batch_size: int, device) -> list:
    """Argmax predictions: a label id per example (per document when the features are windows:
    long_documents.aggregate_windows), or per token (a list) for token tasks."""
    model.eval()
    out: list = []
    window_logits = []
    for b in range(0, len(feats), batch_size):
        batch = feats[b : b + batch_size]
        logits = model(**_collate(tokenizer, batch, device)).logits.cpu()
        if feats and longdoc.DOC in feats[0]:
            window_logits.append(logits)
            continue
        pred = logits.argmax(-1)
        if pred.ndim == 1:
            out.extend(pred.tolist())
        else:
            out.extend(pred[i, : len(f["input_ids"])].tolist() for i, f in enumerate(batch))
    if window_logits:
        docs = [f[longdoc.DOC] for f in feats]
        probs = longdoc.aggregate_windows(torch.cat(window_logits), docs, max(docs) + 1)
        out = probs.argmax(-1).tolist()
    return out


def _word_tags(data: TaskData, examples: list, feats: list, preds: list) -> list[list[str]]:
    missing = "O" if data.scheme == "bio" else MISSING_TAG
    sentences = []
    for ex, feat, pred in zip(examples, feats, preds):
        tags = [missing] * len(ex.tokens)
        prev = None
        for pos, w in enumerate(feat["_words"]):
            if w is not None and w != prev:
                tags[w] = data.labels[pred[pos]]
            prev = w
        sentences.append(tags)
    return sentences


def score_split(data: TaskData, examples: list, feats: list, preds: list) -> dict[str, float]:
    """Metrics of one split's predictions (see metrics.score)."""
    if data.spec.type == "classification":
        gold = [data.labels.index(ex.label) for ex in examples]
        return score(data.scheme, gold, preds, data.labels)
    pred_tags = _word_tags(data, examples, feats, preds)
    return score(data.scheme, [ex.tags for ex in examples], pred_tags, data.labels)


def run_once(
    source,
    data: TaskData,
    encoded: Encoded,
    recipe: Recipe,
    lr: float,
    seed: int,
    device: torch.device,
    progress=None,
) -> dict[str, Any]:
    """Fine-tune a fresh task model of ``source`` (a models.ModelSource); its best dev check's
    scores, and the test scores of those weights."""
    start = time.perf_counter()
    seed_everything(seed)
    tokenizer = source.tokenizer
    model = source.build(data.spec.type, data.labels).to(device)
    fit = _fit(model, tokenizer, data, encoded, recipe, lr, seed, device, progress)
    preds = predict(model, tokenizer, encoded.test, recipe.batch_size, device)
    result: dict[str, Any] = {"lr": lr, "seed": seed, **fit}
    result["test"] = score_split(data, data.test, encoded.test, preds)
    result["seconds"] = time.perf_counter() - start
    return result


def recipe_dict(recipe: Recipe) -> dict[str, Any]:
    """The recipe as JSON-ready values."""
    d = asdict(recipe)
    d["lrs"] = list(d["lrs"])
    return d
