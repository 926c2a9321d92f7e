"""Evaluation of a classifier's outputs by problem type (transformers' ``problem_type``)."""

from __future__ import annotations

import numpy as np

from finetune_cli.errors import DataError

LABEL_TYPES = {"single_label_classification": "class", "regression": "float", "multi_label_classification": "multi"}


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


def softmax(x: np.ndarray) -> np.ndarray:
    z = np.asarray(x, dtype=np.float64)
    z = np.exp(z - z.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def multilabel_metrics(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float]:
    """Micro- and macro-F1 over labels, and subset accuracy (every label of the row right)."""
    from sklearn.metrics import f1_score

    y_true = np.asarray(y_true).astype(int)
    y_pred = np.asarray(y_pred).astype(int)
    return {
        "f1_micro": float(f1_score(y_true, y_pred, average="micro", zero_division=0)),
        "f1_macro": float(f1_score(y_true, y_pred, average="macro", zero_division=0)),
        "subset_accuracy": float((y_true == y_pred).all(axis=1).mean()),
    }


def tuned_thresholds(labels: np.ndarray, probs: np.ndarray, default: float = 0.5) -> np.ndarray:
    """Per-label decision thresholds: for each label (column), the threshold ``t`` among that label's
    own probabilities whose decisions ``probs >= t`` give the highest F1 against ``labels`` (ties:
    the highest such ``t``, the fewest rows predicted). A label with no positive row has no F1 to
    maximise and keeps ``default``.

    One sort per label: with the rows in decreasing probability, the true positives above each
    distinct probability are a cumulative sum, so every candidate's F1 = 2 TP / (predicted +
    positives) comes at once (the O(n log n) form of trying every candidate)."""
    y = np.asarray(labels) > 0.5
    p = np.asarray(probs, dtype=np.float64)
    out = np.full(p.shape[1], float(default))
    for j in range(p.shape[1]):
        positives = int(y[:, j].sum())
        if positives == 0:
            continue
        order = np.argsort(-p[:, j], kind="stable")
        s, tp = p[order, j], np.cumsum(y[order, j])
        last = np.flatnonzero(np.r_[s[1:] != s[:-1], True])  # the last row of each distinct probability
        f1 = 2 * tp[last] / (last + 1 + positives)
        out[j] = s[last[int(np.argmax(f1))]]  # argmax: the first, i.e. highest, threshold of the best F1
    return out


def regression_metrics(pred: np.ndarray, gold: np.ndarray) -> dict[str, float]:
    from scipy.stats import pearsonr, spearmanr

    pred = np.asarray(pred, dtype=np.float64).reshape(len(pred), -1)[:, 0]
    gold = np.asarray(gold, dtype=np.float64)
    return {"pearson": float(pearsonr(pred, gold)[0]), "spearman": float(spearmanr(pred, gold)[0])}


def task_metrics(label_type: str | None, logits: np.ndarray, labels: np.ndarray | None,
                 threshold: float | np.ndarray = 0.5, notes: dict[str, str] | None = None) -> dict[str, float]:
    """Metrics of ``logits`` against ``labels`` for a label type (``class``: accuracy, macro-F1,
    MCC, F1/precision/recall of the argmax and ROC-AUC/PR-AUC of the softmax, see
    ``metrics.classification``; ``float``: Pearson/Spearman of the single output; ``multi``:
    micro/macro-F1 and subset accuracy of ``sigmoid >= threshold``, one per label or one for all).
    ``notes`` receives ``{metric: why}`` for a metric left out."""
    if labels is None:
        raise DataError("evaluation needs labelled data")
    if label_type == "class":
        from finetune_cli.metrics.classification import classification_metrics

        return classification_metrics(labels, logits.argmax(-1), softmax(logits), notes)
    if label_type == "float":
        return regression_metrics(logits, labels)
    if label_type == "multi":
        return multilabel_metrics(labels, sigmoid(logits) >= threshold)
    raise DataError("evaluation needs labelled data")


def per_label(threshold: float | np.ndarray, label_names: list[str], problem_type: str) -> dict[str, float] | None:
    """A multi-label model's decision threshold of each label, by name (None for other problem types)."""
    if problem_type != "multi_label_classification":
        return None
    t = np.broadcast_to(np.asarray(threshold, dtype=np.float64), (len(label_names),))
    return {name: float(v) for name, v in zip(label_names, t, strict=True)}


def prediction_columns(logits: np.ndarray, problem_type: str, label_names: list[str],
                       threshold: float | np.ndarray = 0.5) -> dict[str, list]:
    """Per-row predictions as output columns.

    * single-label: ``pred_label`` (argmax) and ``prob_<label>`` (softmax, rows sum to 1);
    * regression: ``pred_score`` (the single output);
    * multi-label: ``pred_labels`` (the labels whose sigmoid >= ``threshold``, one for all labels or
      one per label; a list) and ``prob_<label>`` (each label's sigmoid).
    """
    logits = np.asarray(logits, dtype=np.float64)
    if problem_type == "regression":
        return {"pred_score": [float(x) for x in logits.reshape(len(logits), -1)[:, 0]]}
    names = list(label_names) or [f"LABEL_{i}" for i in range(logits.shape[-1])]
    if problem_type == "multi_label_classification":
        p = sigmoid(logits)
        out: dict[str, list] = {"pred_labels": [[names[j] for j in np.flatnonzero(r >= threshold)] for r in p]}
    else:
        p = softmax(logits)
        out = {"pred_label": [names[j] for j in p.argmax(-1)]}
    for j, name in enumerate(names):
        out[f"prob_{name}"] = [float(x) for x in p[:, j]]
    return out
