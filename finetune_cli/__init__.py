"""finetune: fine-tune pre-trained text encoders with modern objectives, and measure what they do."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("finetune-cli")  # one source: pyproject.toml, as installed
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "unknown"
