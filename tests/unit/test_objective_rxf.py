"""R3F / R4F: the symmetric KL against a plain loop, gradients, noise only in training, the
spectrally-normalised R4F head (and its save/load), and hyper-parameter validation."""

from __future__ import annotations

import math

import pytest
import torch
from typer.testing import CliRunner

from finetune_cli.errors import DataError
from finetune_cli.objectives.rxf import r3f_loss, symmetric_kl
from finetune_cli.pipelines.recipes import load_recipe
from finetune_cli.recipe import RecipeError
from tests.unit._objective_batch import model_and_batch, no_dropout


def _softmax(z):
    m = max(z)
    e = [math.exp(v - m) for v in z]
    s = sum(e)
    return [v / s for v in e]


def reference_symmetric_kl(a, b):
    """(1/N) Σ_i [KL(p_i‖q_i) + KL(q_i‖p_i)], KL(p‖q) = Σ_c p_c log(p_c / q_c), written out."""
    total = 0.0
    for za, zb in zip(a.tolist(), b.tolist(), strict=True):
        p, q = _softmax(za), _softmax(zb)
        total += sum(pc * math.log(pc / qc) for pc, qc in zip(p, q, strict=True))
        total += sum(qc * math.log(qc / pc) for pc, qc in zip(p, q, strict=True))
    return total / len(a)


def reference_ce(a, labels):
    return sum(-math.log(_softmax(z)[y]) for z, y in zip(a.tolist(), labels.tolist(), strict=True)) / len(a)


def _logits(n=6, c=3, seed=0, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, c, generator=g, dtype=torch.float64) * scale


def test_symmetric_kl_matches_the_loop_and_is_a_symmetric_divergence():
    a, b = _logits(seed=0), _logits(seed=1)
    assert symmetric_kl(a, b).item() == pytest.approx(reference_symmetric_kl(a, b), rel=1e-10)
    assert symmetric_kl(a, b).item() == pytest.approx(symmetric_kl(b, a).item(), rel=1e-12)
    assert symmetric_kl(a, a).item() == 0.0
    # batch mean, not mean over N·C entries (torch's default kl_div reduction): duplicating the
    # batch leaves it unchanged, adding classes that carry no mass leaves it unchanged too
    assert symmetric_kl(torch.cat([a, a]), torch.cat([b, b])).item() == pytest.approx(symmetric_kl(a, b).item())
    pad = torch.full((6, 5), -1e4, dtype=torch.float64)
    assert symmetric_kl(torch.cat([a, pad], 1), torch.cat([b, pad], 1)).item() == pytest.approx(
        symmetric_kl(a, b).item(), rel=1e-9)


@pytest.mark.parametrize("lam", [0.0, 0.5, 1.0, 3.0])
def test_r3f_loss_is_ce_plus_lambda_kl(lam):
    a, b = _logits(seed=2), _logits(seed=3)
    y = torch.tensor([0, 1, 2, 2, 1, 0])
    total, ce, kl = r3f_loss(a, b, y, lam)
    assert ce.item() == pytest.approx(reference_ce(a, y), rel=1e-10)
    assert total.item() == pytest.approx(reference_ce(a, y) + lam * reference_symmetric_kl(a, b), rel=1e-10)


def test_gradients_against_finite_differences():
    a = _logits(4, 3, seed=4).requires_grad_()
    b = _logits(4, 3, seed=5).requires_grad_()
    y = torch.tensor([0, 2, 1, 1])
    assert torch.autograd.gradcheck(lambda x, z: symmetric_kl(x, z), (a, b))
    assert torch.autograd.gradcheck(lambda x, z: r3f_loss(x, z, y, 0.7)[0], (a, b))


@pytest.mark.parametrize("name", ["r3f", "r4f"])
def test_nonzero_gradient_and_parts_on_a_real_batch(tiny_model_dir, quickstart_data, name):
    model, _, batch, obj = model_and_batch(tiny_model_dir, quickstart_data, name, "objective.eps=1e-2")
    model.train()
    out = obj(model, batch)
    assert set(out) == {"loss", "ce", "sym_kl"} == {"loss", *obj.parts}
    assert out["sym_kl"].item() > 0
    assert out["loss"].item() == pytest.approx(out["ce"].item() + out["sym_kl"].item(), rel=1e-5)
    out["loss"].backward()
    assert model.encoder.encoder.layer[0].attention.self.query.weight.grad.abs().sum() > 0
    assert model.encoder.embeddings.word_embeddings.weight.grad.abs().sum() > 0


def test_noise_moves_the_prediction_only_through_eps(tiny_model_dir, quickstart_data):
    """With dropout off, the noisy forward equals the clean one at ε = 0 (KL exactly 0) and
    differs at ε > 0: the KL measures the noise, nothing else."""
    for eps, positive in ((0.0, False), (0.05, True)):
        model, _, batch, obj = model_and_batch(tiny_model_dir, quickstart_data, "r3f", f"objective.eps={eps}")
        no_dropout(model).train()
        kl = obj(model, batch)["sym_kl"].item()
        # ε = 0: identical rows, up to float rounding of a 2N-row batch
        assert (kl > 1e-8) == positive and kl < (1.0 if positive else 1e-10), (eps, kl)


def test_one_pass_equals_two_passes(tiny_model_dir, quickstart_data):
    """The objective encodes clean and noisy rows in one 2N batch; with dropout off, the clean half
    matches a plain forward and the noisy half a separate noisy forward with the same noise."""
    model, _, batch, _ = model_and_batch(tiny_model_dir, quickstart_data, "r3f")
    no_dropout(model).train()
    f = batch["features"][0]
    n = len(batch["labels"])
    both = {k: torch.cat([v, v]) for k, v in f.items()}
    torch.manual_seed(3)
    joint = model(both, noise=("normal", 0.1, n)).logits
    torch.manual_seed(3)
    noisy = model(f, noise=("normal", 0.1)).logits
    torch.testing.assert_close(joint[:n], model(f).logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(joint[n:], noisy, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(joint[:n], joint[n:], atol=1e-4)


def test_no_noise_and_no_kl_in_eval_mode(tiny_model_dir, quickstart_data):
    model, _, batch, obj = model_and_batch(tiny_model_dir, quickstart_data, "r3f", "objective.eps=0.5")
    model.eval()
    torch.manual_seed(1)
    out = obj(model, batch)
    assert set(out) == {"loss", "ce"}
    with torch.no_grad():
        plain = torch.nn.functional.cross_entropy(model(batch["features"][0]).logits, batch["labels"])
    assert torch.equal(out["loss"].detach(), plain)


def test_noisy_pass_does_not_train_the_word_embeddings(tiny_model_dir, quickstart_data):
    """As in fairseq: noise is added to detached token embeddings."""
    model, _, batch, _ = model_and_batch(tiny_model_dir, quickstart_data, "r3f")
    model.train()
    model(batch["features"][0], noise=("uniform", 1e-3)).logits.sum().backward()
    g = model.encoder.embeddings.word_embeddings.weight.grad
    assert g is None or g.abs().sum() == 0
    assert model.encoder.embeddings.position_embeddings.weight.grad.abs().sum() > 0


def test_normal_noise_has_the_requested_scale(tiny_model_dir, quickstart_data, monkeypatch):
    model, _, batch, _ = model_and_batch(tiny_model_dir, quickstart_data, "r3f")
    seen = {}
    enc = model.encoder
    orig = enc.forward

    def spy(*a, **k):
        if k.get("inputs_embeds") is not None:
            seen["z"] = k["inputs_embeds"] - enc.get_input_embeddings()(batch["features"][0]["input_ids"])
        return orig(*a, **k)

    monkeypatch.setattr(enc, "forward", spy)
    torch.manual_seed(0)
    model(batch["features"][0], noise=("normal", 0.1))
    assert seen["z"].std().item() == pytest.approx(0.1, rel=0.05)
    model(batch["features"][0], noise=("uniform", 0.1))
    z = seen["z"]
    assert z.abs().max().item() <= 0.1 + 1e-6 and z.std().item() == pytest.approx(0.1 / math.sqrt(3), rel=0.05)


def test_regression_labels_are_refused(tiny_model_dir, quickstart_data):
    model, _, batch, obj = model_and_batch(tiny_model_dir, quickstart_data, "r3f")
    batch["labels"] = batch["labels"].float()
    with pytest.raises(DataError, match="class labels"):
        obj(model, batch)


def test_r4f_head_is_spectrally_normalised_and_r3f_is_not(tiny_model_dir, quickstart_data):
    from torch.nn.utils import parametrize

    from finetune_cli.models.native import final_linear

    m3, *_ = model_and_batch(tiny_model_dir, quickstart_data, "r3f")
    assert not parametrize.is_parametrized(final_linear(m3.hf)) and not m3.spec.spectral_norm
    model, _, batch, obj = model_and_batch(tiny_model_dir, quickstart_data, "r4f")
    lin = final_linear(model.hf)  # the native head's last linear map (BERT: `classifier`)
    assert model.spec.spectral_norm and parametrize.is_parametrized(lin, "weight")
    with torch.no_grad():  # make the raw weight far from 1-Lipschitz
        lin.parametrizations.weight.original.mul_(50.0)
    model.train()
    for _ in range(5):  # each training forward runs one power iteration
        obj(model, batch)
    w = lin.weight
    assert torch.linalg.matrix_norm(w.detach(), ord=2).item() == pytest.approx(1.0, abs=1e-3)
    raw = lin.parametrizations.weight.original
    assert torch.linalg.matrix_norm(raw.detach(), ord=2).item() > 5


def test_r4f_model_saves_and_loads_with_the_same_logits(tiny_model_dir, quickstart_data, tmp_path):
    from finetune_cli.models import load_text_model, save_text_model

    model, tok, batch, obj = model_and_batch(tiny_model_dir, quickstart_data, "r4f")
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        obj(model, batch)["loss"].backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    with torch.no_grad():
        before = model(batch["features"][0]).logits
    save_text_model(model, tok, tmp_path / "m")
    loaded, _, _ = load_text_model(str(tmp_path / "m"))
    loaded.eval()
    from torch.nn.utils import parametrize

    from finetune_cli.models.native import final_linear

    assert loaded.spec.spectral_norm and parametrize.is_parametrized(final_linear(loaded.hf), "weight")
    with torch.no_grad():
        after = loaded(batch["features"][0]).logits
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["r3f", "r4f"])
@pytest.mark.parametrize("bad,msg", [("objective.eps=-1e-5", "eps must be >= 0"),
                                     ("objective.lam=-0.1", "lam must be >= 0"),
                                     ("objective.noise=gaussian", "noise must be one of uniform, normal"),
                                     ("objective.epsilon=1e-5", "did you mean `objective.eps`")])
def test_invalid_hyperparameters_fail_at_recipe_validation(name, bad, msg):
    with pytest.raises(RecipeError, match=msg):
        load_recipe(name, [bad])


def test_cli_reports_a_bad_eps_before_loading_any_model(tmp_path):
    from finetune_cli.cli.main import app

    res = CliRunner().invoke(app, ["train", "--recipe", "r3f", "objective.eps=-1", "model.name=/no/such/model",
                                   f"output.dir={tmp_path}"])
    assert res.exit_code != 0
    assert "eps must be >= 0" in res.output and "no/such/model" not in res.output
    assert not any(tmp_path.iterdir())
