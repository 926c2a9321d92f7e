"""matplotlib with the non-interactive Agg backend, or a one-line error when it is missing."""

from __future__ import annotations

from pathlib import Path

from finetune_cli.errors import FinetuneError
from finetune_cli.fsutil import atomic_file


def available() -> bool:
    """Whether matplotlib is installed (it is the optional ``plots`` extra)."""
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def pyplot():
    try:
        import matplotlib
    except ImportError:
        raise FinetuneError("figures need matplotlib (pip install 'finetune-cli[plots]'), "
                            "or pass --no-figures") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    path = Path(path)
    try:
        with atomic_file(path) as tmp:  # a failed write leaves no half PNG
            fig.savefig(tmp, dpi=120, bbox_inches="tight", format=path.suffix.lstrip(".") or "png")
    finally:
        plt.close(fig)
    return path
