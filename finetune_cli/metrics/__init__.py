from finetune_cli.metrics.classification import classification_metrics

__all__ = ["classification_metrics"]
