"""Rich tables for the classification details of ``finetune eval``."""

from __future__ import annotations

from rich.table import Table


def render_classification(ui, res) -> None:
    t = Table(title="per class")
    for c in ("label", "precision", "recall", "f1", "support"):
        t.add_column(c, justify="left" if c == "label" else "right")
    for row in res.per_class:
        t.add_row(row["label"], f"{row['precision']:.4f}", f"{row['recall']:.4f}", f"{row['f1']:.4f}",
                  str(row["support"]))
    ui.print(t)
    cm = Table(title="confusion matrix (rows: gold, columns: predicted)")
    cm.add_column("gold \\ pred")
    for name in res.labels:
        cm.add_column(name, justify="right")
    for name, row in zip(res.labels, res.confusion_matrix, strict=True):
        cm.add_row(name, *map(str, row))
    ui.print(cm)
    rel = Table(title=f"reliability ({res.calibration['n_bins']} equal-width bins, non-empty shown)")
    for c in ("confidence", "count", "mean confidence", "accuracy", "gap"):
        rel.add_column(c, justify="right")
    for b in res.calibration["bins"]:
        if b["count"]:
            rel.add_row(f"({b['lower']:.3f}, {b['upper']:.3f}]", str(b["count"]), f"{b['mean_confidence']:.4f}",
                        f"{b['accuracy']:.4f}", f"{abs(b['accuracy'] - b['mean_confidence']):.4f}")
    ui.print(rel)
    if res.figures:
        ui.log("figures: " + ", ".join(res.figures.values()))
    if res.saved_to:
        ui.log(f"written: {res.saved_to}")
