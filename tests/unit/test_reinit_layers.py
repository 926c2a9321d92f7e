"""model.reinit_layers: the top k encoder layers (and the pooler) start from BERT's initialisation."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from finetune_cli.cli.main import app
from finetune_cli.errors import ModelError
from finetune_cli.models import HeadSpec
from finetune_cli.models.loading import build_text_model, load_encoder
from finetune_cli.models.text_model import encoder_layers, reinit_top_layers


@pytest.fixture(scope="module")
def trained_dir(tiny_model_dir, tmp_path_factory):
    """The tiny BERT with every parameter moved off its init (biases non-zero, LayerNorms not 1),
    as a pre-trained model's are, so a re-initialised value is told from a kept one."""
    import shutil

    out = tmp_path_factory.mktemp("tiny-trained")
    shutil.copytree(tiny_model_dir, out, dirs_exist_ok=True)
    enc = load_encoder(str(tiny_model_dir), None, None)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in enc.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    enc.save_pretrained(out)
    return out


def _pretrained(path):
    return load_encoder(str(path), None, None)


def _build(path, k, head="pooled", seed=0):
    return build_text_model(str(path), lambda d: HeadSpec(num_labels=2, head=head),
                            before_heads=lambda: torch.manual_seed(seed), reinit_layers=k)[0]


def _params(module):
    return {n: p.detach().clone() for n, p in module.named_parameters()}


@pytest.mark.parametrize("head", ["pooled", "native"])
def test_top_layer_and_pooler_reinitialised_the_rest_kept(trained_dir, head):
    before = _params(_pretrained(trained_dir))
    enc = _build(trained_dir, 1, head).encoder
    after = _params(enc)
    top = str(len(encoder_layers(enc)) - 1)
    fresh = [n for n in after if f"layer.{top}." in n or n.startswith("pooler.")]
    kept = [n for n in after if n not in fresh]
    assert fresh and kept
    for n in kept:  # embeddings and the lower layer are the pre-trained ones
        assert torch.equal(after[n], before[n]), n
    std = enc.config.initializer_range
    for n in fresh:
        v = after[n]
        assert not torch.equal(v, before[n]), n
        if "LayerNorm.weight" in n:
            assert torch.equal(v, torch.ones_like(v)), n
        elif n.endswith("bias"):
            assert torch.equal(v, torch.zeros_like(v)), n
        else:  # a linear weight drawn from N(0, std²)
            assert v.mean().abs() < 0.2 * std and v.std().item() == pytest.approx(std, rel=0.15), n


def test_zero_changes_nothing_and_the_seed_decides(trained_dir):
    before = _params(_pretrained(trained_dir))
    assert all(torch.equal(p, before[n]) for n, p in _params(_build(trained_dir, 0).encoder).items())
    a, b = _params(_build(trained_dir, 2, seed=1).encoder), _params(_build(trained_dir, 2, seed=1).encoder)
    c = _params(_build(trained_dir, 2, seed=2).encoder)
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert not all(torch.equal(a[n], c[n]) for n in a)


def test_more_layers_than_the_encoder_has_is_a_model_error(tiny_model_dir):
    with pytest.raises(ModelError, match="model.reinit_layers: reinit_layers 3 exceeds the encoder's 2 layers"):
        _build(tiny_model_dir, 3)


def test_finds_the_layers_of_other_architectures():
    from transformers import DistilBertConfig, DistilBertModel, RobertaConfig, RobertaModel

    small = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=64, vocab_size=100)
    roberta = RobertaModel(RobertaConfig(**small))
    assert encoder_layers(roberta) is roberta.encoder.layer
    distil = DistilBertModel(DistilBertConfig(dim=32, n_layers=3, n_heads=2, hidden_dim=64, vocab_size=100))
    assert encoder_layers(distil) is distil.transformer.layer
    with pytest.raises(ValueError, match="no list of transformer layers"):
        encoder_layers(nn.Linear(2, 2))
    reinit_top_layers(distil, 1)  # DistilBERT's LayerNorms and linears take the same init
    assert torch.equal(distil.transformer.layer[2].output_layer_norm.weight, torch.ones(32))


def test_cli_run_starts_the_top_layer_afresh(tiny_recipe, trained_dir, tmp_path):
    """Through `finetune train`: the recipe key reaches the model. A few steps at lr 1e-3 move a
    weight by ~1e-2, so the saved top layer is near the pre-trained one without re-init and far
    from it with; the lower layer is near it either way."""
    from safetensors.torch import load_file

    pre = _params(_pretrained(trained_dir))
    runner = CliRunner()
    dist = {}
    for k in (0, 1):
        res = runner.invoke(app, ["train", "-r", "quickstart", *tiny_recipe(
            f"model.name={trained_dir}", "model.head=pooled", "data.max_train_samples=16",
            f"model.reinit_layers={k}", f"output.name=r{k}"), "-q"])
        assert res.exit_code == 0, res.output
        saved = load_file(str(tmp_path / "runs" / f"r{k}" / "final" / "model.safetensors"))
        dist[k] = {layer: max((saved[n] - pre[n]).abs().mean().item() for n in saved
                              if f"layer.{layer}." in n and n.endswith("weight"))
                   for layer in (0, 1)}
    assert dist[0][0] < 0.02 and dist[1][0] < 0.02 and dist[0][1] < 0.02
    assert dist[1][1] > 0.05
