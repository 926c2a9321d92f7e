"""t-SNE picture of sentence embeddings coloured by gold label (as in the SCL paper, Fig. 3)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import numpy as np

from finetune_cli.errors import DataError
from finetune_cli.viz._mpl import pyplot, save


def tsne_perplexity(n: int, wanted: float = 30.0) -> float:
    """scikit-learn needs perplexity < n; small sets get about n/4 (at least 2)."""
    if n < 4:
        raise DataError(f"a t-SNE picture needs at least 4 examples, got {n}")
    return float(min(wanted, max(2.0, (n - 1) / 4)))


def tsne_2d(embeddings: np.ndarray, seed: int = 0, perplexity: Optional[float] = None) -> np.ndarray:
    """2-D t-SNE of ``embeddings`` (PCA initialisation, fixed seed: the same input gives the same picture)."""
    from sklearn.manifold import TSNE
    from threadpoolctl import threadpool_limits

    x = np.asarray(embeddings, dtype=np.float32)
    p = tsne_perplexity(len(x)) if perplexity is None else perplexity
    # One thread: the Barnes-Hut OpenMP loop spin-waits, and on a busy machine (or beside torch's
    # own threads) several threads ran 25x slower than one in our measurements.
    with threadpool_limits(limits=1):
        return TSNE(n_components=2, perplexity=p, init="pca", random_state=seed,
                    learning_rate="auto").fit_transform(x)


def tsne_plot(embeddings: np.ndarray, labels: np.ndarray, label_names: Sequence[str], path: Path, *,
              seed: int = 0, max_points: Optional[int] = 2000, title: str = "") -> dict:
    """Write the t-SNE PNG; returns ``{"path", "points", "perplexity"}``.

    More than ``max_points`` examples are subsampled (seeded, every class kept in proportion).
    """
    labels = np.asarray(labels)
    idx = np.arange(len(labels))
    if max_points is not None and len(idx) > max_points:
        idx = np.sort(np.random.default_rng(seed).choice(len(idx), size=max_points, replace=False))
    perplexity = tsne_perplexity(len(idx))
    xy = tsne_2d(np.asarray(embeddings)[idx], seed=seed, perplexity=perplexity)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 5.0))
    cmap = plt.get_cmap("tab10" if len(label_names) <= 10 else "tab20")
    for c, name in enumerate(label_names):
        m = labels[idx] == c
        if m.any():
            ax.scatter(xy[m, 0], xy[m, 1], s=9, alpha=0.75, color=cmap(c % cmap.N), label=f"{name} ({int(m.sum())})",
                       linewidths=0)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.legend(fontsize=8, markerscale=2, loc="best")
    ax.set_title(title or f"t-SNE of pooled embeddings (perplexity {perplexity:g})", fontsize=10)
    save(fig, path)
    return {"path": str(path), "points": int(len(idx)), "perplexity": perplexity}
