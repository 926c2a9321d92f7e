"""``train.refit_head``: the head's last linear layer refitted to convergence (L2 logistic regression,
scikit-learn's form) on the training set's current features before every evaluation."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from finetune_cli.engine.head_refit import fit_logistic, linear_inputs, refit_head, refit_target
from finetune_cli.errors import TrainingError
from finetune_cli.models.loading import load_text_model
from finetune_cli.models.text_model import HeadSpec
from finetune_cli.pipelines.recipes import load_plan
from finetune_cli.pipelines.train import run_train
from finetune_cli.ui import UI


def _same(a, ref) -> None:
    """Equal up to the solver's tolerance and float32 storage, relative to the size of ``ref``."""
    np.testing.assert_allclose(a, ref, rtol=1e-3, atol=1e-3 * np.abs(ref).max())


def _wb(linear) -> tuple[np.ndarray, np.ndarray]:
    return linear.weight.detach().double().numpy(), linear.bias.detach().double().numpy()


def _blobs(n_classes: int, seed: int = 0, n: int = 30, d: int = 6):
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 1.5, (n_classes, d))
    y = np.repeat(np.arange(n_classes), n)
    return centres[y] + rng.normal(0, 1.0, (len(y), d)), y


def test_fit_logistic_equals_scikit_learn_multinomial():
    from sklearn.linear_model import LogisticRegression

    x, y = _blobs(3)
    w, b = fit_logistic(x, y, 3)
    ref = LogisticRegression(C=1.0, tol=1e-12, max_iter=100000).fit(x, y)  # lbfgs: multinomial for 3 classes
    _same(w, ref.coef_)
    _same(b, ref.intercept_)


def _grad(x, y, w, b, c=1.0):
    """Gradient of 0.5*||W||^2 + c*sum CE(Wx+b, y), written out in numpy."""
    z = x @ w.T + b
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(y)), y] -= 1
    return c * p.T @ x + w, c * p.sum(0)


@pytest.mark.parametrize("k", [2, 4])
def test_fit_logistic_is_the_optimum(k):
    """Two classes: a softmax over 2 logits (the head's shape), not scikit-learn's single sigmoid; so
    the check is the optimality condition itself: the objective's gradient vanishes."""
    x, y = _blobs(k, seed=k)
    w, b = fit_logistic(x, y, k)
    gw, gb = _grad(x, y, w, b)
    assert np.abs(gw).max() < 1e-5 and np.abs(gb).max() < 1e-5
    assert np.abs(w).max() > 0.1  # not the zero start


@pytest.mark.parametrize("head", ["native", "pooled"])
def test_linear_inputs_are_what_the_last_layer_reads(tiny_model_dir, head):
    model, tok, _ = load_text_model(str(tiny_model_dir), HeadSpec(num_labels=3, head=head, pooling="mean"))
    model.train()  # dropout on: linear_inputs must still read the eval-mode inputs
    batch = tok(["a fine film", "dull and long", "yes"], padding=True, return_tensors="pt")
    with torch.no_grad():
        model.eval()
        out = model(dict(batch))
        ref = out.embeddings
        if head == "native":  # BERT's pooler reads the first token: the input of `classifier` is its output
            ref = model.encoder.pooler.activation(model.encoder.pooler.dense(out.features))
    model.train()
    x = linear_inputs(model, out.features)
    torch.testing.assert_close(x, ref)
    last = refit_target(model)
    torch.testing.assert_close(last(x), out.logits)
    assert model.training  # the mode is restored


def test_refit_head_installs_the_fit(tiny_model_dir):
    from finetune_cli.data.encode import encode_table
    from finetune_cli.data.sources import Table

    model, tok, _ = load_text_model(str(tiny_model_dir), HeadSpec(num_labels=2, head="pooled"))
    texts = ["good", "great fun", "a joy", "fine work", "bad", "awful", "dull mess", "boring"]
    labels = [1, 1, 1, 1, 0, 0, 0, 0]
    data = encode_table(Table({"text": texts, "label": labels}, "test"), tok, 16, ("text",), joint=True)
    info = refit_head(model, data, 3, tok.pad_token_id)
    model.eval()
    with torch.no_grad():
        x = model(dict(tok(texts, padding=True, return_tensors="pt"))).embeddings.double().numpy()
    w, b = fit_logistic(x, np.array(labels), 2)
    _same(_wb(model.classifier.out_proj)[0], w)
    _same(_wb(model.classifier.out_proj)[1], b)
    assert info["refit_train_accuracy"] == float(((x @ w.T + b).argmax(1) == np.array(labels)).mean())


def test_no_refit_for_other_heads(tiny_model_dir):
    for spec, what in [(HeadSpec(num_labels=0), "no classifier head"),
                       (HeadSpec(num_labels=1, problem_type="regression", head="pooled"), "regression"),
                       (HeadSpec(num_labels=2, head="pooled", spectral_norm=True), "spectrally normalised")]:
        model, _, _ = load_text_model(str(tiny_model_dir), spec)
        with pytest.raises(TrainingError, match=what):
            refit_target(model)


def _saved_run(recipe, run_dir):
    """``(saved model, (weight, bias) of its pooled head, its encoder's pooled embeddings of the run's
    training set in float64, their labels)``."""
    from finetune_cli.data.encode import encode_table
    from finetune_cli.engine.inference import forward_all
    from finetune_cli.pipelines.common import load_data

    model, tok, _ = load_text_model(str(run_dir / "final"))
    data = load_data(recipe, None, need_train=True)
    enc = encode_table(data.train, tok, recipe.recipe.model.max_length, ("text",), joint=True)
    x = forward_all(model, enc, 16, tok.pad_token_id, want=("embeddings",))["embeddings"].astype(np.float64)
    return model, _wb(model.classifier.out_proj), x, np.asarray(enc.labels)


def _lines(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_run_with_refit_head_saves_the_refitted_head(tiny_recipe):
    """The last evaluation (at the last step) refits the head; nothing trains after it, so the saved
    head is the logistic regression on the saved encoder's features of the training set."""
    recipe = load_plan(None, tiny_recipe("model.head=pooled", "model.pooling=mean", "train.max_steps=6",
                                         "train.min_evals=2", "train.refit_head=true"))
    out = run_train(recipe, UI(quiet=True), device="cpu")
    evals = [x for x in _lines(out.run_dir) if "eval/accuracy" in x]
    assert [x["step"] for x in evals] == [3, 6] and all("eval/refit_train_accuracy" in x for x in evals)
    _, head, x, y = _saved_run(recipe, out.run_dir)
    w, b = fit_logistic(x, y, 2)
    _same(head[0], w)
    _same(head[1], b)


def test_a_run_without_refit_head_does_not_save_that_head(tiny_recipe):
    """The control: the same run without refit_head ends on a head that is not the optimum."""
    recipe = load_plan(None, tiny_recipe("model.head=pooled", "model.pooling=mean", "train.max_steps=6",
                                           "train.min_evals=2"))
    out = run_train(recipe, UI(quiet=True), device="cpu")
    assert not any("eval/refit_train_accuracy" in x for x in _lines(out.run_dir))
    _, head, x, y = _saved_run(recipe, out.run_dir)
    w, _ = fit_logistic(x, y, 2)
    assert np.abs(head[0] - w).max() > 0.05 * np.abs(w).max()


def test_a_run_with_refit_saves_the_fit_on_unit_vectors(tiny_recipe):
    """With refit_head the last evaluation (the last step) installs the logistic regression; with
    head_normalize its inputs are the normalised embeddings of the saved encoder."""
    recipe = load_plan(None, tiny_recipe("model.head=pooled", "model.head_normalize=true", "model.pooling=mean",
                                           "train.max_steps=6", "train.min_evals=2", "train.refit_head=true"))
    out = run_train(recipe, UI(quiet=True), device="cpu")
    model, head, x, y = _saved_run(recipe, out.run_dir)
    assert model.spec.normalize
    assert "L2-normalise" in (out.run_dir / "final" / "README.md").read_text()  # the model card says so
    w, b = fit_logistic(x / np.linalg.norm(x, axis=1, keepdims=True), y, 2)
    np.testing.assert_allclose(head[0], w, rtol=1e-3, atol=1e-3 * np.abs(w).max())
    np.testing.assert_allclose(head[1], b, rtol=1e-3, atol=1e-3 * np.abs(b).max() + 1e-6)
    # and it is not the fit on the raw embeddings (the two differ by more than the tolerance)
    w_raw, _ = fit_logistic(x, y, 2)
    assert np.abs(w_raw - w).max() > 0.05 * np.abs(w).max()


def test_refit_head_with_r4f_is_refused_in_one_line(tiny_recipe):
    """Refused when the recipe is resolved (so `recipes validate` refuses it too), before any model
    loads; the loaded model's own check stays for a head the recipe cannot describe."""
    from finetune_cli.errors import RecipeError

    with pytest.raises(RecipeError, match="spectrally normalised"):
        load_plan(None, tiny_recipe("objective.name=r4f", "train.refit_head=true", "train.max_steps=2"))


def test_linear_inputs_of_a_roberta_head():
    """RoBERTa's native head is dense -> tanh -> dropout -> out_proj: the refit target is out_proj and
    its input tanh(dense(h0))."""
    from transformers import RobertaConfig, RobertaForSequenceClassification

    from finetune_cli.models.text_model import TextModel

    torch.manual_seed(0)
    cfg = RobertaConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=40, num_labels=3)
    model = TextModel(RobertaForSequenceClassification(cfg), HeadSpec(num_labels=3, head="native"))
    h0 = torch.randn(5, 16)
    head = model.hf.classifier
    assert refit_target(model) is head.out_proj
    x = linear_inputs(model, h0)
    torch.testing.assert_close(x, torch.tanh(head.dense(h0)))
    model.eval()
    torch.testing.assert_close(head.out_proj(x), model.classify(h0))
