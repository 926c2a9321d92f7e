"""A model and a training batch built the way ``finetune train`` builds them (recipe → objective
contract → heads, sampler, collate), on the tiny random BERT and the quickstart data."""

from __future__ import annotations

import torch
from torch import nn


def model_and_batch(tiny_model_dir, quickstart_data, objective: str, *overrides: str, batch_size: int = 8,
                    train_file: str | None = None):
    from finetune_cli.data import collate, epoch_batches
    from finetune_cli.models import load_text_model
    from finetune_cli.objectives import build
    from finetune_cli.pipelines.common import encode, load_data
    from finetune_cli.pipelines.recipes import load_plan

    plan = load_plan(None, [f"model.name={tiny_model_dir}", "model.max_length=32",
                                f"data.train={train_file or quickstart_data['train']}", "data.columns.text=sentence",
                                f"objective.name={objective}", *overrides])
    data = load_data(plan, None)
    torch.manual_seed(0)
    model, tok, _ = load_text_model(str(tiny_model_dir), plan.head_spec(len(data.label_names or ()), 0.1))
    enc = encode(plan, data.train, tok)
    batches = epoch_batches(plan.objective_cls.sampler, enc.lengths, enc.labels, batch_size, plan.recipe.train.seed, 0)
    batch = collate(enc, batches[0], tok.pad_token_id)
    return model, tok, batch, build(objective, plan.recipe.objective.params)


def no_dropout(model: nn.Module) -> nn.Module:
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    return model
