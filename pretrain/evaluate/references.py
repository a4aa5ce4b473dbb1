"""The two reference rows of every results table: the majority class and a classical model.

A score means little without them: an encoder that does not beat a model that always answers the
most frequent label has learned nothing, and one that does not beat a linear model over n-grams
is not yet worth its GPU hours. Both are fitted on the same train split, chosen on the same dev
split and scored on the same test split as the encoders, by the same metric functions.

- majority class: every example (every token, for token tasks) gets the training split's most
  frequent label. Its score is the chance level of the table.
- classical, sequence classification: TF-IDF over word 1-2-grams and character 1-4-grams
  (``char_wb``, which also covers Chinese text without word segmentation), sublinear tf, into a
  logistic regression (saga solver) whose C is chosen on dev from ``C_GRID``; for text pairs, the
  features of each text side by side plus their TF-IDF cosine similarity.
- classical, token classification: a logistic regression over the usual window features of a
  maximum-entropy tagger (the token, its neighbours two either side, its bigrams with them, its
  prefixes and suffixes up to 3 characters and its shape), C chosen on dev likewise.

Both are deterministic: they have no seed, and their rows show one value.
"""

from __future__ import annotations

import warnings
from collections import Counter
from typing import Any

import numpy as np

from bertforge.pretrain.data.downstream_tasks import TaskData
from bertforge.pretrain.evaluate.metrics import PRIMARY, score

C_GRID = (0.1, 1.0, 10.0, 100.0)
MAX_ITER = 200  # saga passes; a fit that stops short records "converged": false
MAJORITY = "majority class"
CLASSICAL = {
    "classification": "tf-idf + logistic regression",
    "token_classification": "window features + logistic regression",
}


def _majority_label(data: TaskData) -> str:
    if data.spec.type == "classification":
        counts = Counter(ex.label for ex in data.train)
    else:
        counts = Counter(tag for ex in data.train for tag in ex.tags)
    return min(counts, key=lambda lab: (-counts[lab], lab))


def _scores(data: TaskData, examples: list, preds: list) -> dict[str, float]:
    """Predictions as label names (a list per sentence for token tasks) -> the task's metrics."""
    if data.spec.type == "classification":
        gold = [data.labels.index(ex.label) for ex in examples]
        return score(data.scheme, gold, [data.labels.index(p) for p in preds], data.labels)
    return score(data.scheme, [ex.tags for ex in examples], preds, data.labels)


def majority_class(data: TaskData) -> dict[str, Any]:
    """Dev and test scores of always answering the most frequent training label."""
    label = _majority_label(data)

    def preds(examples: list) -> list:
        if data.spec.type == "classification":
            return [label] * len(examples)
        return [[label] * len(ex.tokens) for ex in examples]

    return {
        "model": MAJORITY,
        "label": label,
        "dev": _scores(data, data.dev, preds(data.dev)),
        "test": _scores(data, data.test, preds(data.test)),
    }


def _text_features(data: TaskData):
    """A fitted feature function of classification examples (see the module doc)."""
    # Lazy: scikit-learn/scipy/seqeval take seconds to import; only scoring needs them.
    from scipy.sparse import csr_matrix, hstack
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.pipeline import make_union

    union = make_union(
        TfidfVectorizer(analyzer="word", ngram_range=(1, 2), sublinear_tf=True, min_df=1),
        TfidfVectorizer(analyzer="char_wb", ngram_range=(1, 4), sublinear_tf=True, min_df=1),
    )
    texts = [ex.text for ex in data.train]
    if data.scheme == "pair":
        texts += [ex.text_pair for ex in data.train]
    union.fit(texts)

    def features(examples: list):
        a = union.transform([ex.text for ex in examples])
        if data.scheme != "pair":
            return a
        b = union.transform([ex.text_pair for ex in examples])

        def norm(m):
            return np.sqrt(np.asarray(m.multiply(m).sum(1)).ravel())

        dot = np.asarray(a.multiply(b).sum(1)).ravel()
        cosine = dot / np.maximum(norm(a) * norm(b), 1e-12)
        return hstack([a, b, csr_matrix(cosine[:, None])]).tocsr()

    return features


def _shape(token: str) -> str:
    kinds = {
        "X" if c.isupper() else "x" if c.isalpha() else "d" if c.isdigit() else c for c in token[:6]
    }
    return "".join(sorted(kinds))


def _window_features(tokens: list[str], i: int) -> dict[str, float]:
    """The maximum-entropy tagger's features of token ``i`` (see the module doc)."""

    def at(k: int) -> str:
        j = i + k
        return tokens[j].lower() if 0 <= j < len(tokens) else ("<s>" if j < 0 else "</s>")

    w = tokens[i]
    feats = {f"w[{k}]={at(k)}": 1.0 for k in (-2, -1, 0, 1, 2)}
    feats[f"w[-1,0]={at(-1)}|{at(0)}"] = 1.0
    feats[f"w[0,1]={at(0)}|{at(1)}"] = 1.0
    for n in (1, 2, 3):
        if len(w) > n:
            feats[f"pre{n}={w[:n].lower()}"] = 1.0
            feats[f"suf{n}={w[-n:].lower()}"] = 1.0
    feats[f"shape={_shape(w)}"] = 1.0
    return feats


def _token_rows(examples: list) -> list[dict[str, float]]:
    return [_window_features(ex.tokens, i) for ex in examples for i in range(len(ex.tokens))]


def _regroup(examples: list, flat: list[str]) -> list[list[str]]:
    out, pos = [], 0
    for ex in examples:
        out.append(list(flat[pos : pos + len(ex.tokens)]))
        pos += len(ex.tokens)
    return out


def classical(data: TaskData) -> dict[str, Any]:
    """Dev and test scores of the classical model, C chosen on dev (see the module doc)."""
    # Lazy: scikit-learn/scipy/seqeval take seconds to import; only scoring needs them.
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.feature_extraction import DictVectorizer
    from sklearn.linear_model import LogisticRegression

    if data.spec.type == "classification":
        features = _text_features(data)
        x = {part: features(getattr(data, part)) for part in ("train", "dev", "test")}
        y = [ex.label for ex in data.train]

        def unflatten(examples: list, pred: list) -> list:
            return list(pred)
    else:
        vec = DictVectorizer()
        vec.fit(_token_rows(data.train))
        x = {
            part: vec.transform(_token_rows(getattr(data, part)))
            for part in ("train", "dev", "test")
        }
        y = [tag for ex in data.train for tag in ex.tags]
        unflatten = _regroup
    x = {part: _int32_indices(m) for part, m in x.items()}
    primary = PRIMARY[data.scheme]
    best: dict[str, Any] | None = None
    # one model along the increasing C grid, each fit starting from the last one's weights
    model = LogisticRegression(solver="saga", max_iter=MAX_ITER, tol=1e-3, warm_start=True)
    for c in C_GRID:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            model.set_params(C=c).fit(x["train"], y)
        dev = _scores(data, data.dev, unflatten(data.dev, model.predict(x["dev"])))
        if best is None or dev[primary] > best["dev"][primary]:
            converged = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
            test_pred = unflatten(data.test, model.predict(x["test"]))
            best = {"C": c, "dev": dev, "test_pred": test_pred, "converged": converged}
    test = _scores(data, data.test, best["test_pred"])
    return {
        "model": CLASSICAL[data.spec.type],
        "C": best["C"],
        "converged": best["converged"],
        "dev": best["dev"],
        "test": test,
    }


def _int32_indices(matrix):
    """CSR with 32-bit indices: scikit-learn's linear models refuse the 64-bit ones that recent
    scipy versions give to large vocabularies."""
    matrix = matrix.tocsr()
    if matrix.nnz < 2**31:
        matrix.indices = matrix.indices.astype(np.int32)
        matrix.indptr = matrix.indptr.astype(np.int32)
    return matrix


def reference_rows(data: TaskData) -> list[dict[str, Any]]:
    """Both reference rows of one task."""
    return [majority_class(data), classical(data)]
