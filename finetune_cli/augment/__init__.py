"""Data augmentation: back-translation with temperature sampling, and simple word edits."""

from finetune_cli.errors import FinetuneError


class AugmentOptionError(FinetuneError):
    """A bad ``finetune augment`` option (negative temperature, no method chosen, …)."""

# Defaults of ``finetune augment --backtranslate`` (Marian models of the OPUS-MT project).
DEFAULT_FORWARD = "Helsinki-NLP/opus-mt-en-de"
DEFAULT_BACKWARD = "Helsinki-NLP/opus-mt-de-en"
