from finetune_cli.metrics.classification import classification_metrics

__all__ = ["classification_metrics"]

from finetune_cli.metrics.names import METRIC_NAMES, metric_names  # noqa: E402,F401
