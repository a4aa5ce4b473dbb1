"""What a classification task does with a text longer than ``max_length`` tokens (the recipe's
``long_documents``; ``--long_documents`` on the command line):

- ``first`` (the default): the first ``max_length`` tokens, the rest cut off;
- ``windows``: the whole text in windows of ``max_length`` tokens (special tokens included),
  each starting ``window_stride`` tokens after the previous one (0: half a window, so every token
  but those of the first and last half window is seen twice); the last window ends at or after
  the text's end. Training takes every window as an example with its document's label (so an
  "epoch" is a pass over the windows); a dev or test document's prediction is the mean of its
  windows' class probabilities (:func:`aggregate_windows`);
- ``key_sentences``: a text over the length is cut to its TextRank key sentences
  (``data_prep.key_sentences``, the ranking ``data_prep build --key_sentences`` keeps) that fit in
  ``max_length`` tokens, in document order, then truncated if still over (one sentence longer than
  the whole budget). A text that fits is left as it is.

Each is the same for the training, dev and test splits, so a model is scored on what it was
trained on. Sentence pairs and token classification take ``first`` only (an error otherwise).
"""

from __future__ import annotations

from typing import Any

import torch

from bertforge.data_prep.key_sentences import (
    joined,
    rank_order,
    sentence_words,
    similarity,
    split_sentences,
    textrank,
)
from bertforge.pretrain.data.downstream_tasks import TaskData, TaskError

FIRST, WINDOWS, KEY_SENTENCES = "first", "windows", "key_sentences"
STRATEGIES = (FIRST, WINDOWS, KEY_SENTENCES)
DOC = "_doc"  # a window's feature key: the index of its document in the split


def check(data: TaskData, strategy: str, max_length: int, window_stride: int) -> None:
    """A clear error for a strategy that is unknown or does not apply to the task."""
    name = data.spec.name
    if strategy not in STRATEGIES:
        raise TaskError(
            f"task {name!r}: long_documents {strategy!r} is not one of {', '.join(STRATEGIES)}"
        )
    if strategy == FIRST:
        return
    if data.spec.type != "classification" or data.scheme == "pair":
        raise TaskError(
            f"task {name!r}: long_documents {strategy!r} works on single-text classification "
            "only; sentence pairs and token classification take 'first'"
        )
    if window_stride < 0 or window_stride > max_length - 2:
        raise TaskError(
            f"task {name!r}: window_stride {window_stride} must be 0 (half a window) or 1 to "
            f"max_length - 2 ({max_length - 2}), so that no token falls between two windows"
        )


def window_features(
    tokenizer, texts: list[str], labels: list[int], max_length: int, stride: int
) -> list[dict[str, Any]]:
    """Every text in windows of ``max_length`` tokens ``stride`` tokens apart (0: half a window),
    one feature per window with its document's label and index (``DOC``)."""
    if not getattr(tokenizer, "is_fast", False):
        raise TaskError("long_documents 'windows' needs a fast tokenizer (overflowing windows)")
    body = max_length - tokenizer.num_special_tokens_to_add(pair=False)
    step = stride or max(1, body // 2)
    if step > body:
        raise TaskError(f"window_stride {step} is over a window's {body} text tokens")
    # transformers' "stride" is the overlap of two consecutive windows
    enc = tokenizer(
        texts,
        truncation=True,
        max_length=max_length,
        stride=body - step,
        return_overflowing_tokens=True,
    )
    docs = enc["overflow_to_sample_mapping"]
    keys = [k for k in enc if k != "overflow_to_sample_mapping"]
    return [
        {k: enc[k][i] for k in keys} | {"labels": labels[d], DOC: d} for i, d in enumerate(docs)
    ]


def key_sentence_text(text: str, budget: int, count_tokens) -> str:
    """``text`` cut to its highest-ranked TextRank sentences whose tokens (``count_tokens``:
    sentences -> token counts) sum to at most ``budget``, in document order; ``text`` itself when
    it fits. A sentence that would overflow is skipped and lower-ranked ones are still tried: the
    budget is a few sentences, and stopping at the first misfit would leave much of it empty.
    The top sentence alone is kept when none fits (the caller truncates it)."""
    spans = split_sentences(text)
    counts = count_tokens([text[a:b] for a, b in spans])
    if sum(counts) <= budget:
        return text
    order = rank_order(textrank(similarity([sentence_words(text[a:b]) for a, b in spans])))
    kept, used = [], 0
    for i in order:
        if used + counts[i] <= budget:
            kept.append(i)
            used += counts[i]
    return joined(text, [spans[i] for i in sorted(kept or order[:1])])


def key_sentence_texts(tokenizer, texts: list[str], max_length: int) -> list[str]:
    """:func:`key_sentence_text` of every text, the budget ``max_length`` less special tokens."""
    budget = max_length - tokenizer.num_special_tokens_to_add(pair=False)

    def count(sentences: list[str]) -> list[int]:
        ids = tokenizer(sentences, add_special_tokens=False)["input_ids"]
        return [len(x) for x in ids]

    return [key_sentence_text(t, budget, count) for t in texts]


def aggregate_windows(logits: torch.Tensor, docs: list[int], n_docs: int) -> torch.Tensor:
    """Per document, the mean of its windows' softmax probabilities ([n_docs, classes]).

    Probabilities rather than logits: a window's vote is bounded by 1, so one window of text that
    says little about the class (a code example, a list of names) but gets large logits cannot
    outvote the others, as it can in a mean of logits (a geometric mean of probabilities)."""
    probs = torch.softmax(logits.float(), dim=-1)
    index = torch.as_tensor(docs, dtype=torch.long)
    sums = torch.zeros(n_docs, probs.shape[1]).index_add_(0, index, probs)
    counts = torch.zeros(n_docs).index_add_(0, index, torch.ones(len(docs)))
    if bool((counts == 0).any()):
        raise ValueError("a document without a window")
    return sums / counts[:, None]
