"""Classification metrics on arrays (scikit-learn does the arithmetic).

Single-label evaluation reports accuracy, macro-F1, Matthews correlation and the metrics GLUE and
most papers report: ``f1``, ``precision`` and ``recall`` of the positive class (label id 1) for a
two-class task (GLUE's MRPC/QQP F1), their macro averages for more classes; ``roc_auc`` and
``pr_auc`` (average precision) of the softmax probabilities: of the positive class for two classes,
one-vs-rest macro averages for more. An AUC needs every class among the gold labels: otherwise it
is left out, and :func:`undefined_metrics` says why.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

# Rank metrics: computed from the scores, defined only when every class has a gold row.
SCORE_METRICS = ("roc_auc", "pr_auc")


def undefined_metrics(y_true: np.ndarray, num_labels: int) -> dict[str, str]:
    """``{metric: why}`` for the metrics the gold labels leave undefined (an AUC with a class absent)."""
    present = set(np.asarray(y_true).astype(np.int64).tolist())
    missing = [c for c in range(max(num_labels, 2)) if c not in present]
    if not missing:
        return {}
    why = (f"class id{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} "
           f"{'have' if len(missing) > 1 else 'has'} no gold row in the evaluation data")
    return {m: why for m in SCORE_METRICS}


def classification_metrics(y_true: np.ndarray, y_pred: np.ndarray, probs: Optional[np.ndarray] = None,
                           notes: Optional[dict[str, str]] = None) -> dict[str, float]:
    """Accuracy, macro-F1, Matthews correlation, F1/precision/recall (positive class of two, macro
    of more) and, given the class probabilities ``probs`` (n, C), ROC-AUC and PR-AUC (left out, with
    the reason in ``notes``, when a class has no gold row)."""
    from sklearn.metrics import (  # on use: it costs ~100 MB
        accuracy_score,
        average_precision_score,
        f1_score,
        matthews_corrcoef,
        precision_recall_fscore_support,
        roc_auc_score,
    )

    y_true = np.asarray(y_true)
    y_pred = np.asarray(y_pred)
    n_cls = probs.shape[-1] if probs is not None else int(max(y_true.max(initial=0), y_pred.max(initial=0))) + 1
    binary = n_cls <= 2
    if binary:  # the positive class (id 1), as GLUE reports MRPC's and QQP's F1
        p, r, f, _ = precision_recall_fscore_support(y_true, y_pred, average="binary", pos_label=1, zero_division=0)
    else:
        p, r, f, _ = precision_recall_fscore_support(y_true, y_pred, labels=list(range(n_cls)), average="macro",
                                                     zero_division=0)
    out = {
        "accuracy": float(accuracy_score(y_true, y_pred)),
        "f1_macro": float(f1_score(y_true, y_pred, average="macro", zero_division=0)),
        "mcc": float(matthews_corrcoef(y_true, y_pred)) if len(np.unique(np.concatenate([y_true, y_pred]))) > 1 else 0.0,
        "f1": float(f), "precision": float(p), "recall": float(r),
    }
    if probs is None:
        return out
    undefined = undefined_metrics(y_true, n_cls)
    if notes is not None:
        notes.update(undefined)
    if undefined:
        return out
    probs = np.asarray(probs, dtype=np.float64)
    if binary:
        out["roc_auc"] = float(roc_auc_score(y_true, probs[:, 1]))
        out["pr_auc"] = float(average_precision_score(y_true, probs[:, 1]))
    else:
        onehot = np.eye(n_cls, dtype=np.int64)[y_true.astype(np.int64)]
        out["roc_auc"] = float(roc_auc_score(y_true, probs, multi_class="ovr", average="macro",
                                             labels=list(range(n_cls))))
        out["pr_auc"] = float(average_precision_score(onehot, probs, average="macro"))
    return out


def per_class_metrics(y_true: np.ndarray, y_pred: np.ndarray, label_names: list[str]) -> list[dict]:
    """Precision, recall, F1 and support of every class, in label-id order (id i = label_names[i])."""
    from sklearn.metrics import precision_recall_fscore_support

    ids = list(range(len(label_names)))
    p, r, f, s = precision_recall_fscore_support(np.asarray(y_true), np.asarray(y_pred), labels=ids,
                                                 zero_division=0)
    return [{"label": name, "precision": float(p[i]), "recall": float(r[i]), "f1": float(f[i]),
             "support": int(s[i])} for i, name in enumerate(label_names)]


def confusion(y_true: np.ndarray, y_pred: np.ndarray, num_labels: int) -> list[list[int]]:
    """Confusion matrix: row = gold label id, column = predicted label id."""
    from sklearn.metrics import confusion_matrix

    m = confusion_matrix(np.asarray(y_true), np.asarray(y_pred), labels=list(range(num_labels)))
    return m.astype(int).tolist()
