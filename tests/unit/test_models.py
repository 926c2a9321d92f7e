"""Models: pooling maths, heads, save/load round trip, model resolution and offline errors."""

from __future__ import annotations

import pytest
import torch

from finetune_cli.errors import ModelError
from finetune_cli.models import HeadSpec, load_text_model, pool, resolve_model, save_text_model


def test_mean_pooling_ignores_padding():
    h = torch.arange(2 * 3 * 2, dtype=torch.float32).reshape(2, 3, 2)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    got = pool(h, mask, "mean")
    want = torch.stack([h[0, :2].mean(0), h[1].mean(0)])
    assert torch.allclose(got, want)
    assert torch.equal(pool(h, mask, "cls"), h[:, 0])
    with pytest.raises(ValueError, match="needs an encoder with a pooler"):
        pool(h, mask, "pooler", None)


@pytest.mark.parametrize("head, pooling, sn", [("pooled", "mean", False), ("pooled", "cls", True),
                                               ("pooled", "pooler", False), ("native", "mean", True)])
def test_save_load_round_trip(tiny_model_dir, tmp_path, head, pooling, sn):
    torch.manual_seed(0)
    model, tok, _ = load_text_model(str(tiny_model_dir), HeadSpec(pooling=pooling, num_labels=3, spectral_norm=sn,
                                                                  head=head))
    model.eval()
    feats = {k: v for k, v in tok(["a short one", "and a longer sentence here"], padding=True, return_tensors="pt").items()}
    with torch.no_grad():
        before = model(feats)
    save_text_model(model, tok, tmp_path / "m", id2label={0: "a", 1: "b", 2: "c"})
    loaded, _, path = load_text_model(str(tmp_path / "m"))
    loaded.eval()
    assert loaded.spec == model.spec and path == str(tmp_path / "m")
    with torch.no_grad():
        after = loaded(feats)
    assert torch.allclose(before.logits, after.logits, atol=1e-6)
    assert loaded.config.id2label == {0: "a", 1: "b", 2: "c"} and loaded.config.label2id["c"] == 2
    from transformers import AutoModel, AutoModelForSequenceClassification

    if head == "native":  # a plain transformers classifier computing the same logits
        hf = AutoModelForSequenceClassification.from_pretrained(tmp_path / "m").eval()
        with torch.no_grad():
            assert torch.allclose(hf(**feats).logits, before.logits, atol=1e-5)
    else:  # a head transformers has no class for: refused, never loaded with a random head
        with pytest.raises(ValueError, match="finetune-pooled-classifier"):
            AutoModel.from_pretrained(tmp_path / "m")


@pytest.mark.parametrize("head", ["pooled", "native"])
def test_spectral_norm_head_is_one_lipschitz(tiny_model_dir, head):
    from finetune_cli.models.native import final_linear

    model, _, _ = load_text_model(str(tiny_model_dir), HeadSpec(num_labels=4, spectral_norm=True, head=head))
    model.train()
    lin = model.classifier.out_proj if head == "pooled" else final_linear(model.hf)
    x = torch.randn(8, model.config.hidden_size)
    for _ in range(30):  # power iterations run in training-mode forwards
        lin(x)
    w = lin.weight
    assert torch.linalg.matrix_norm(w, ord=2).item() == pytest.approx(1.0, abs=1e-3)


def test_resolution(tiny_model_dir, tmp_path):
    path, local = resolve_model("embedded")
    assert local and path.endswith("model")
    assert resolve_model(str(tiny_model_dir)) == (str(tiny_model_dir), True)
    with pytest.raises(ModelError, match="model path does not exist"):
        resolve_model("./missing-folder")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="has no config.json"):
        resolve_model(str(tmp_path / "empty"))
    assert resolve_model("bert-base-uncased") == ("bert-base-uncased", False)


def test_hub_id_offline_gives_one_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError) as e:
        load_text_model("some-org/surely-not-cached-model")
    msg = str(e.value)
    assert "not in the Hugging Face cache" in msg and "offline" in msg and "\n" not in msg


def test_embedded_model_loads_offline():
    model, tok, path = load_text_model("embedded")
    assert model.config.hidden_size == 384 and model.config.num_hidden_layers == 6
