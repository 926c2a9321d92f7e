from finetune_cli.engine.inference import forward_all
from finetune_cli.engine.trainer import Interrupted, Trainer, TrainResult, TrainState, list_checkpoints

__all__ = ["Interrupted", "TrainResult", "TrainState", "Trainer", "forward_all", "list_checkpoints"]
