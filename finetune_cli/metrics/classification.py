"""Classification metrics on arrays (scikit-learn does the arithmetic)."""

from __future__ import annotations

import numpy as np


def classification_metrics(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float]:
    """Accuracy, macro-F1 and Matthews correlation."""
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef  # on use: it costs ~100 MB

    y_true = np.asarray(y_true)
    y_pred = np.asarray(y_pred)
    return {
        "accuracy": float(accuracy_score(y_true, y_pred)),
        "f1_macro": float(f1_score(y_true, y_pred, average="macro", zero_division=0)),
        "mcc": float(matthews_corrcoef(y_true, y_pred)) if len(np.unique(np.concatenate([y_true, y_pred]))) > 1 else 0.0,
    }


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
