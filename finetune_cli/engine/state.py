"""What a training run leaves: the loop's state (saved in every checkpoint, so a resume continues
it), the result handed to the pipeline, and the exception of a stopped run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional


@dataclass
class TrainState:
    step: int = 0  # optimizer steps done
    epoch: int = 0  # epoch the next batch comes from
    batch_in_epoch: int = 0  # batches of that epoch already trained on
    samples_seen: int = 0
    train_seconds: float = 0.0
    best_metric: Optional[float] = None
    best_step: Optional[int] = None
    evals_without_improvement: int = 0
    last_eval: dict[str, float] = field(default_factory=dict)
    stopped_early: bool = False
    # An evaluation was under way when the run was interrupted: a resume runs it first, so the
    # metrics (and best/, early stopping) are those of a run that never stopped.
    eval_pending: bool = False
    # Loss sums since the last log line, so a resumed run logs the same averages.
    log_window: dict[str, float] = field(default_factory=dict)
    log_window_steps: int = 0

    def record_eval(self, metrics: dict[str, float], metric: str, greater: bool, patience: Optional[int]) -> bool:
        """Note an evaluation at this step: its metrics, a new best by ``metric`` (returns True) or
        one more evaluation without improvement, and early stopping after ``patience`` of those."""
        self.last_eval = metrics
        value = metrics[metric]
        better = self.best_metric is None or (value > self.best_metric if greater else value < self.best_metric)
        if better:
            self.best_metric, self.best_step, self.evals_without_improvement = value, self.step, 0
        else:
            self.evals_without_improvement += 1
        if patience is not None and self.evals_without_improvement >= patience:
            self.stopped_early = True
        return better


@dataclass
class TrainResult:
    state: TrainState
    total_steps: int
    device: str
    precision: str
    samples_per_second: float
    device_name: str = ""  # e.g. "cuda:0 NVIDIA H100 80GB HBM3" or "cpu ×2 threads"
    gpu_mem_peak_gb: Optional[float] = None  # CUDA only
    num_processes: int = 1
    trainable_params: int = 0  # parameters the optimizer updates (LoRA: the adapters and the head)
    cuda_graphs: Optional[dict] = None  # the graph path's widths and capture time (engine.step.GraphedStep)


class Interrupted(Exception):
    """Raised after a Ctrl-C / SIGTERM checkpoint has been written."""

    def __init__(self, checkpoint: Optional[Path]):
        super().__init__(str(checkpoint))
        self.checkpoint = checkpoint
