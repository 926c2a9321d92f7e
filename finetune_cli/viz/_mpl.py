"""matplotlib with the non-interactive Agg backend, or a one-line error when it is missing."""

from __future__ import annotations

from pathlib import Path

from finetune_cli.errors import FinetuneError


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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
