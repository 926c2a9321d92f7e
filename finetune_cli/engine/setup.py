"""What the training loop is built from: the accelerator (device, mixed precision), the optimizer
and its parameter groups, the learning-rate schedule, the evaluation cadence, and head-only training
(a frozen encoder). The loop itself is ``engine/trainer.py``."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any, Optional

import torch

from finetune_cli.engine.device import resolve_precision
from finetune_cli.engine.head_refit import refit_target
from finetune_cli.errors import ModelError, TrainingError
from finetune_cli.models.text_model import enable_gradient_checkpointing, parameter_counts
from finetune_cli.recipe import TrainConfig
from finetune_cli.ui import launched_world_size

# ---- device -----------------------------------------------------------------------------------

def make_accelerator(dev: torch.device, precision: str, graphs: bool = False, **tracking_kwargs):
    """``dev``: the resolved device (``Processes.device``). ``precision``: auto (bf16 on a GPU that
    has it) | fp32 | bf16 | fp16 (fp16 uses a gradient scaler; GPU only). ``graphs``: the step is
    captured as CUDA graphs, so autocast keeps no cache of cast weights (a cache filled during a
    capture would hold the capture's tensors). ``tracking_kwargs``: ``log_with`` and
    ``project_dir`` for experiment trackers (see ``engine.tracking``)."""
    from accelerate import Accelerator
    from accelerate.utils import AutocastKwargs

    if dev.type == "cuda" and dev.index is not None and launched_world_size() == 1:
        torch.cuda.set_device(dev)
    use_cpu = dev.type == "cpu"
    # accelerate keeps one process-wide state and refuses a second Accelerator with other settings;
    # a single-process caller (tests, multi-seed runs, probe stages) may train several times with
    # different devices or precisions, so start each run from a clean state. Under a launcher
    # (WORLD_SIZE > 1) the distributed state must stay.
    if launched_world_size() == 1:
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(reset_partial_state=True)
    if dev.type == "cuda":
        # An earlier run in this process may sit in a cycle the collector has not reached yet (a first
        # run's imports leave some: caught exceptions keep its frames), holding device memory: free it
        # before this run's model moves to the device.
        gc.collect()
    prec = resolve_precision(precision, dev, "train.precision", TrainingError)
    mp = "no" if prec == "fp32" else prec  # accelerate's name for no mixed precision
    handlers = [AutocastKwargs(cache_enabled=False)] if graphs else []
    return Accelerator(cpu=use_cpu, mixed_precision=mp, kwargs_handlers=handlers, **tracking_kwargs)


ENCODER_PREFIX = "encoder."


def freeze_encoder(model: torch.nn.Module) -> int:
    """Stop gradients into the encoder (``train.freeze_encoder``): only the heads train. Returns the
    number of parameters frozen. Features are then a fixed function of the input, so no autograd
    graph is built through the encoder and a step costs one forward pass of it."""
    n = 0
    for name, p in model.named_parameters():
        if name.startswith(ENCODER_PREFIX):
            p.requires_grad_(False)
            n += p.numel()
    return n


def set_train_mode(model: torch.nn.Module, frozen_encoder: bool) -> None:
    """``model.train()``, except that a frozen encoder stays in eval mode: frozen *features* are the
    point of head-only training (with dropout on, every epoch would see different features)."""
    model.train()
    if frozen_encoder:
        for name, m in model.named_modules():  # "encoder", or "module.encoder" under DDP
            if name + "." == ENCODER_PREFIX or name.endswith("." + ENCODER_PREFIX[:-1]):
                m.eval()


def _param_groups(model: torch.nn.Module, cfg: TrainConfig) -> list[dict[str, Any]]:
    """No weight decay on biases and norms (BERT's recipe); the new heads may get their own lr.
    Frozen parameters (``requires_grad`` off, e.g. ``train.freeze_encoder``) are left out."""
    groups: dict[tuple[bool, bool], list[torch.nn.Parameter]] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        no_decay = p.ndim < 2 or "LayerNorm" in name or "layer_norm" in name or name.endswith(".bias")
        head = not name.startswith(ENCODER_PREFIX)
        groups.setdefault((no_decay, head), []).append(p)
    out = []
    for (no_decay, head), params in sorted(groups.items()):
        out.append({"params": params, "weight_decay": 0.0 if no_decay else cfg.weight_decay,
                    "lr": (cfg.head_lr or cfg.lr) if head else cfg.lr})
    return out


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device,
                    graphs: bool = False) -> torch.optim.Optimizer:
    """``train.optimizer`` over the parameter groups of :func:`_param_groups`, at ``train.lr``.
    ``graphs``: AdamW for a captured step: fused, capturable, each group's learning rate a tensor on
    ``device`` that the scheduler writes in place (float64 where the kernel takes it, so the schedule
    is the float one to the bit; float32 on CUDA, the dtype its fused kernel reads)."""
    groups = _param_groups(model, cfg)
    if graphs:
        for g in groups:
            g["lr"] = tensor_lr(g["lr"], device)
        return torch.optim.AdamW(groups, lr=groups[0]["lr"], fused=True, capturable=True)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr)
    if cfg.optimizer == "adafactor":
        from transformers.optimization import Adafactor

        # A fixed learning rate (train.lr and the schedule), as transformers' Trainer sets it up.
        return Adafactor(groups, lr=cfg.lr, scale_parameter=False, relative_step=False, warmup_init=False)
    # Fused AdamW (CPU and CUDA): one kernel for the whole update instead of a few per tensor;
    # on the CPU it is several times faster than the per-tensor loop.
    fused = device.type in ("cpu", "cuda") if cfg.optimizer == "adamw_fused" else False
    return torch.optim.AdamW(groups, lr=cfg.lr, fused=fused or None)


def tensor_lr(lr: float | torch.Tensor, device: torch.device) -> torch.Tensor:
    """A learning rate as the tensor a captured AdamW step reads (see :func:`build_optimizer`)."""
    dtype = torch.float32 if device.type == "cuda" else torch.float64
    return lr.to(device, dtype) if isinstance(lr, torch.Tensor) else torch.tensor(lr, dtype=dtype, device=device)


def build_scheduler(opt: torch.optim.Optimizer, cfg: TrainConfig, total_steps: int):
    """``train.lr_scheduler`` from transformers' ``get_scheduler`` (its ``linear`` is
    ``get_linear_schedule_with_warmup``); ``train.warmup_steps`` when set, else ``warmup_ratio``."""
    from transformers import get_scheduler

    warmup = cfg.warmup_steps if cfg.warmup_steps is not None else int(cfg.warmup_ratio * total_steps)
    return get_scheduler(cfg.lr_scheduler, opt, num_warmup_steps=warmup, num_training_steps=total_steps)


def warmup_note(cfg: TrainConfig, total_steps: int) -> Optional[str]:
    """The warning for ``train.warmup_steps`` beyond the run's last step (the learning rate never
    reaches ``train.lr``), else None. A warning, not a refusal: a short trial run of a long recipe is
    a fair thing to do."""
    if cfg.warmup_steps is None or cfg.warmup_steps <= total_steps:
        return None
    return (f"train.warmup_steps {cfg.warmup_steps} is more than the run's {total_steps} steps: the learning rate "
            f"never reaches train.lr (it ends at {total_steps / cfg.warmup_steps:.0%} of it); lower "
            f"train.warmup_steps, or set train.warmup_ratio instead")


def eval_interval(cfg: TrainConfig, steps_per_epoch: int, total_steps: int) -> int:
    """Steps between evaluations. ``min_evals`` ties the cadence to the step budget: without
    ``eval_every`` the run evaluates every ``total_steps // min_evals`` steps instead of once per
    epoch (a 40-example epoch is 3 steps: per-epoch evaluation would dominate the run), and an
    ``eval_every`` longer than that is shortened (a few-shot run can be shorter than
    ``eval_every``), so ``best/`` and early stopping act in every run."""
    if not cfg.min_evals:
        return cfg.eval_every or steps_per_epoch
    every = max(1, total_steps // cfg.min_evals)
    return min(cfg.eval_every, every) if cfg.eval_every else every


def check_trainable(model: torch.nn.Module, cfg: TrainConfig, evaluated: bool, log: Callable[[str], None]) -> int:
    """Freeze the encoder when the recipe asks (``train.freeze_encoder``), then refuse a job that
    cannot train: nothing left to train, or a head refit without an evaluation set (``evaluated``).
    Returns the number of parameters the optimizer will update."""
    if cfg.freeze_encoder and freeze_encoder(model) == 0:
        raise TrainingError(f"train.freeze_encoder: the model has no `{ENCODER_PREFIX}*` parameters to freeze")
    if cfg.refit_head:
        refit_target(model)  # a model with no head to refit fails here, not at the first evaluation
        if not evaluated:
            raise TrainingError("train.refit_head refits the head before each evaluation: give the run an "
                                "evaluation set (data.eval_split or data.eval)")
    trainable, total = parameter_counts(model)
    if not trainable:
        raise TrainingError("nothing to train: train.freeze_encoder is on and the model has no head "
                            "(use a classification objective)")
    log(f"trainable parameters: {trainable:,} of {total:,} ({100 * trainable / total:.2f}%)")
    return trainable


def prepare_model(model: torch.nn.Module, cfg: TrainConfig, longest: int) -> tuple[int, Optional[int]]:
    """``train.gradient_checkpointing`` and ``train.compile`` on the model (after the optimizer was
    built, before it is wrapped); returns the batch widths' multiple and cap: with ``compile``,
    widths are rounded up to multiples of 16 (never past ``longest``, the longest example), so
    torch.compile sees a handful of shapes, not one per batch width."""
    if cfg.gradient_checkpointing:
        try:
            enable_gradient_checkpointing(model)
        except ValueError as e:
            raise ModelError(f"train.gradient_checkpointing: {e}; set it to false") from None
    if not cfg.compile:
        return 1, None
    # Module.compile() compiles in place: parameter names, saving and DDP wrapping are unchanged.
    (model.encoder if hasattr(model, "encoder") else model).compile()
    return 16, longest
