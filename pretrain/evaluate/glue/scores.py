"""GLUE's and CLUE's metrics, under the names Hugging Face ``evaluate``'s ``glue`` metric returns.

Computed by scikit-learn and SciPy, as ``evaluate`` computes them: ``matthews_correlation``
(CoLA), ``accuracy``, ``f1`` (binary, of the positive class: MRPC's paraphrases, QQP's
duplicates), ``pearson`` and ``spearmanr`` (STS-B). Values are fractions, as ``evaluate`` returns
them; tables print them x 100, as papers do. A correlation of constant predictions (a young model
that predicts one STS-B score for every pair) is undefined; it counts as 0, no correlation.
"""

from __future__ import annotations

from collections.abc import Sequence


def task_scores(metrics: Sequence[str], gold: Sequence, pred: Sequence) -> dict[str, float]:
    """``{metric: value}`` for each of ``metrics`` (class ids, or floats for regression)."""
    # Lazy: scikit-learn and SciPy take seconds to import; only scoring needs them.
    from scipy.stats import pearsonr, spearmanr
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    out = {}
    for m in metrics:
        if m == "accuracy":
            out[m] = accuracy_score(gold, pred)
        elif m == "f1":
            out[m] = f1_score(gold, pred, zero_division=0)
        elif m == "matthews_correlation":
            out[m] = matthews_corrcoef(gold, pred)
        elif m in ("pearson", "spearmanr") and len(set(pred)) < 2:
            out[m] = 0.0  # constant predictions: undefined, counted as no correlation
        elif m == "pearson":
            out[m] = pearsonr(pred, gold)[0]
        elif m == "spearmanr":
            out[m] = spearmanr(pred, gold)[0]
        else:
            raise ValueError(f"unknown metric {m!r}")
        out[m] = float(out[m])
    return out
