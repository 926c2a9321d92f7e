"""Training objectives, one per file, registered by short name (see ``registry``)."""

from finetune_cli.objectives.base import Objective
from finetune_cli.objectives.registry import build, get, names, register

__all__ = ["Objective", "build", "get", "names", "register"]
