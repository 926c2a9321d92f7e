"""Refitting the classifier's last linear layer to convergence (``train.refit_head``).

In a few-shot run the head trained jointly with the encoder is under-fitted: it moves at the head
learning rate for a few hundred steps (and an objective like SCL gives it only ``1 - lam`` of the
loss), while SetFit and the linear probe fit their logistic-regression head to convergence on the
final features. With ``train.refit_head`` the trainer does the same before every evaluation: the
current encoder (eval mode, no dropout) encodes the training set, and the last linear layer of the
head is replaced by the L2-regularised multinomial logistic regression on those inputs, in
scikit-learn's form (``0.5 * ||W||^2 + C * sum(log-loss)``, ``C = 1``, bias not penalised, solved by
L-BFGS in float64 from zero). The problem is strictly convex, so the fit does not depend on the head
it replaces, and a resumed run refits exactly the same head. Training continues from the refitted
head, and ``best/`` is chosen with it, so the selection sees the head that is saved.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from finetune_cli.data.encode import EncodedData
from finetune_cli.engine.inference import forward_all
from finetune_cli.errors import TrainingError
from finetune_cli.metrics.names import REFIT_METRICS

REFIT_C = 1.0  # scikit-learn's LogisticRegression default


def refit_target(model) -> nn.Linear:
    """The head's last linear layer, or a one-line error saying why this model has none to refit."""
    spec = model.spec
    if not model.has_classifier:
        raise TrainingError("train.refit_head: the model has no classifier head (use a classification objective)")
    if spec.problem_type != "single_label_classification":
        raise TrainingError(f"train.refit_head fits a softmax (logistic-regression) head: it needs a single-label "
                            f"classifier, not {spec.problem_type}")
    if spec.spectral_norm:
        raise TrainingError("train.refit_head: the head is spectrally normalised (r4f); a refit would undo the "
                            "1-Lipschitz constraint")
    if model.hf is not None:
        from finetune_cli.models.native import final_linear, head_family

        if head_family(model.hf) is None:
            raise TrainingError(f"train.refit_head needs to know the classification head of {type(model.hf).__name__}, "
                                f"which finetune supports for BERT-like and RoBERTa-like models; set model.head=pooled")
        return final_linear(model.hf)
    return model.classifier.out_proj


def linear_inputs(model, features: torch.Tensor) -> torch.Tensor:
    """What the head's last linear layer receives for classifier-input ``features`` (eval mode)."""
    target = refit_target(model)
    seen: list[torch.Tensor] = []
    handle = target.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach()))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model.classify(features)
    finally:
        handle.remove()
        model.train(was_training)
    return seen[-1]


def fit_logistic(x: np.ndarray, y: np.ndarray, num_labels: int, c: float = REFIT_C,
                 max_iter: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    """Multinomial logistic regression with scikit-learn's L2 form: minimise
    ``0.5 * ||W||^2 + c * sum_i CE(W x_i + b, y_i)`` (bias unpenalised). Returns ``(W, b)``."""
    xt = torch.as_tensor(np.asarray(x), dtype=torch.float64)
    yt = torch.as_tensor(np.asarray(y), dtype=torch.long)
    w = torch.zeros(num_labels, xt.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros(num_labels, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=max_iter, history_size=20, tolerance_grad=1e-9,
                            tolerance_change=1e-14, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = c * nn.functional.cross_entropy(xt @ w.T + b, yt, reduction="sum") + 0.5 * (w * w).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach().numpy(), b.detach().numpy()


def refit_head(model, train_data: EncodedData, batch_size: int, pad_id: int, procs: Any = None) -> dict[str, float]:
    """Replace the head's last linear layer of ``model`` (a ``TextModel``, unwrapped) by the logistic
    regression on the training set's current inputs to it. Call on every rank (the encoding is
    sharded when ``procs`` is given, see ``inference.sharded``); the main process fits and
    broadcasts the fit. Returns the fit's training accuracy."""
    target = refit_target(model)
    labels = np.asarray(train_data.labels)
    feats = forward_all(model, train_data, batch_size, pad_id, want=("features",))["features"]
    device = target.weight.device
    x = linear_inputs(model, torch.as_tensor(feats, device=device, dtype=target.weight.dtype)).double().cpu().numpy()
    # Every rank holds the same gathered inputs; only the main process fits, the others take its fit.
    fit = fit_logistic(x, labels, model.num_labels) if procs is None or procs.is_main else None
    w, b = procs.broadcast(fit) if procs is not None else fit
    with torch.no_grad():
        target.weight.copy_(torch.as_tensor(w, dtype=target.weight.dtype))
        target.bias.copy_(torch.as_tensor(b, dtype=target.bias.dtype))
    return {REFIT_METRICS[0]: float(((x @ w.T + b).argmax(1) == labels).mean())}
