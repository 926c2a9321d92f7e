"""The classification part of ``finetune eval`` in depth: per-class scores, confusion matrix,
calibration (ECE, MCE, reliability bins), and the reliability and t-SNE figures.

Written to the output directory (the run directory, or ``--out``): ``eval.json`` (the whole
result, which ``finetune report`` reads) and ``figures/reliability.png``, ``figures/tsne.png``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from finetune_cli.fsutil import atomic_write_json, own_dir
from finetune_cli.metrics.calibration import calibration_metrics
from finetune_cli.metrics.classification import confusion, per_class_metrics
from finetune_cli.rundir import FIGURES


def classification_details(res, logits: np.ndarray, embeddings: np.ndarray, labels: np.ndarray,
                           label_names: list[str], ui, *, bins: int, figures: bool, out_dir: Optional[Path],
                           tsne_max: Optional[int], seed: int, name: str = "eval") -> None:
    """Fill ``res`` (an ``EvalResult``) in place and write its files into ``out_dir``: ``<name>.json``
    and ``figures/`` (``figures-<x>/`` for a name ``eval-<x>``, an evaluation on other data)."""
    labels = np.asarray(labels).astype(np.int64)
    pred = logits.argmax(-1)
    names = list(label_names) or [str(i) for i in range(logits.shape[-1])]
    res.labels = names
    res.per_class = per_class_metrics(labels, pred, names)
    res.confusion_matrix = confusion(labels, pred, len(names))
    res.calibration = calibration_metrics(logits, labels, bins)
    if out_dir is None:
        if figures:
            ui.log("figures and eval.json not written: the model is not a run directory; pass --out DIR")
        return
    out_dir = Path(out_dir)
    res.saved_to = str(out_dir / f"{name}.json")
    from finetune_cli.viz._mpl import available

    if figures and not available():
        ui.warn("figures skipped: matplotlib is not installed (pip install 'finetune-cli[plots]')")
        figures = False
    if figures:
        from finetune_cli.viz.embeddings import tsne_plot
        from finetune_cli.viz.reliability import reliability_diagram

        fig_dir = own_dir(out_dir / (FIGURES if name == "eval" else name.replace("eval-", f"{FIGURES}-", 1)),
                          "figures folder")  # a link there is replaced, never written through
        cal = res.calibration
        where = "/".join(Path(res.model).parts[-3:-1]) or res.model
        title = f"{where} on {Path(res.data).name} (n={res.examples})"
        rel = reliability_diagram(cal["bins"], fig_dir / "reliability.png", ece=cal["ece"], mce=cal["mce"],
                                  title=title)
        res.figures = {"reliability": str(rel)}
        if len(labels) >= 4:
            ts = tsne_plot(embeddings, labels, names, fig_dir / "tsne.png", seed=seed, max_points=tsne_max,
                           title=f"t-SNE, {title}")
            res.figures["tsne"] = ts["path"]
        else:
            ui.log(f"t-SNE skipped: {len(labels)} examples (needs at least 4)")
    atomic_write_json(out_dir / f"{name}.json", res.to_dict())
