from finetune_cli.models.loading import load_text_model, resolve_model, save_text_model
from finetune_cli.models.text_model import HeadSpec, ModelOutput, TextModel, pool

__all__ = ["HeadSpec", "ModelOutput", "TextModel", "load_text_model", "pool", "resolve_model", "save_text_model"]
