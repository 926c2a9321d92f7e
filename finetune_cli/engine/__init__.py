from finetune_cli.engine.device import resolve_device
from finetune_cli.engine.inference import forward_all
from finetune_cli.engine.state import Interrupted, TrainResult, TrainState
from finetune_cli.engine.trainer import Trainer

__all__ = ["Interrupted", "TrainResult", "TrainState", "Trainer", "forward_all", "resolve_device"]
