"""Scores of downstream predictions, computed by well-kept libraries.

- classification: accuracy and macro-F1 over all the task's labels (scikit-learn);
- token classification with BIO tags: entity-level precision, recall and F1 (seqeval, the
  conlleval definition: an entity counts only when its type and both boundaries are right);
- token classification with plain tags (POS): token accuracy and macro-F1 over tags.
Each function returns a dict of metric name -> float; ``PRIMARY`` names the one that picks the
learning rate and heads the table.
"""

from __future__ import annotations

PRIMARY = {"single": "macro_f1", "pair": "macro_f1", "bio": "entity_f1", "plain": "accuracy"}


def classification_scores(gold: list[int], pred: list[int], num_labels: int) -> dict[str, float]:
    """Accuracy and macro-F1 (labels absent from both gold and pred count as F1 0)."""
    # Lazy: scikit-learn/scipy/seqeval take seconds to import; only scoring needs them.
    from sklearn.metrics import accuracy_score, f1_score

    return {
        "accuracy": float(accuracy_score(gold, pred)),
        "macro_f1": float(
            f1_score(gold, pred, labels=list(range(num_labels)), average="macro", zero_division=0)
        ),
    }


def entity_scores(gold: list[list[str]], pred: list[list[str]]) -> dict[str, float]:
    """Entity-level precision, recall and F1 of BIO-tagged sentences (seqeval)."""
    # Lazy: scikit-learn/scipy/seqeval take seconds to import; only scoring needs them.
    from seqeval.metrics import f1_score, precision_score, recall_score

    return {
        "entity_f1": float(f1_score(gold, pred, zero_division=0)),
        "entity_precision": float(precision_score(gold, pred, zero_division=0)),
        "entity_recall": float(recall_score(gold, pred, zero_division=0)),
    }


def tag_scores(gold: list[list[str]], pred: list[list[str]], labels: list[str]) -> dict[str, float]:
    """Token accuracy and macro-F1 of plain tags (each token scored on its own)."""
    # Lazy: scikit-learn/scipy/seqeval take seconds to import; only scoring needs them.
    from sklearn.metrics import accuracy_score, f1_score

    flat_gold = [t for sent in gold for t in sent]
    flat_pred = [t for sent in pred for t in sent]
    return {
        "accuracy": float(accuracy_score(flat_gold, flat_pred)),
        "macro_f1": float(
            f1_score(flat_gold, flat_pred, labels=labels, average="macro", zero_division=0)
        ),
    }


def score(scheme: str, gold: list, pred: list, labels: list[str]) -> dict[str, float]:
    """Dispatch on the task's scheme (see tasks.TaskData.scheme)."""
    if scheme in ("single", "pair"):
        return classification_scores(gold, pred, len(labels))
    if scheme == "bio":
        return entity_scores(gold, pred)
    return tag_scores(gold, pred, labels)
