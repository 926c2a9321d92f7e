"""Core-tuning: focal contrastive loss against a loop over the equation, hard-pair mining and
mixup against loop references, the assembled objective on a real batch, bad input."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from finetune_cli.objectives import build
from finetune_cli.objectives import core_tuning as ct
from finetune_cli.objectives.scl import supervised_contrastive_loss
from finetune_cli.pipelines.recipes import load_recipe
from finetune_cli.recipe import RecipeError


def reference_focal(z, labels, tau, gamma):
    """mean over anchors i with positives of −1/|P_i| Σ_{j∈P_i} (1 − p_ij)^γ log p_ij,
    p_ij = exp(z_i·z_j/τ) / Σ_{k≠i} exp(z_i·z_k/τ)."""
    n = len(labels)
    dot = lambda a, b: sum(x * y for x, y in zip(z[a], z[b], strict=True))  # noqa: E731
    per = []
    for i in range(n):
        P = [j for j in range(n) if j != i and labels[j] == labels[i]]
        if not P:
            continue
        den = sum(math.exp(dot(i, k) / tau) for k in range(n) if k != i)
        s = 0.0
        for j in P:
            p = math.exp(dot(i, j) / tau) / den
            s += (1 - p) ** gamma * math.log(p)
        per.append(-s / len(P))
    return sum(per) / len(per) if per else 0.0


@pytest.mark.parametrize("gamma", [0.0, 1.0, 2.0])
@pytest.mark.parametrize("labels", [[0, 1, 0, 1, 2, 0], [3, 3, 1, 1, 1]])
def test_focal_contrastive_matches_loop_reference(gamma, labels):
    g = torch.Generator().manual_seed(len(labels))
    z = F.normalize(torch.randn(len(labels), 4, generator=g, dtype=torch.float64), dim=-1)
    got = ct.focal_contrastive_loss(z, torch.tensor(labels), 0.5, gamma).item()
    assert got == pytest.approx(reference_focal(z.tolist(), labels, 0.5, gamma), rel=1e-6)


def test_gamma_zero_is_supervised_contrastive():
    z = F.normalize(torch.randn(8, 5, dtype=torch.float64), dim=-1)
    y = torch.tensor([0, 1, 1, 0, 2, 2, 0, 3])
    assert ct.focal_contrastive_loss(z, y, 0.07, 0.0).item() == pytest.approx(
        supervised_contrastive_loss(z, y, 0.07).item(), rel=1e-9)


def test_focal_weight_lowers_the_loss_of_easy_pairs():
    z = F.normalize(torch.randn(8, 5, dtype=torch.float64), dim=-1)
    y = torch.tensor([0, 1, 1, 0, 2, 2, 0, 3])
    assert ct.focal_contrastive_loss(z, y, 0.1, 2.0) < ct.focal_contrastive_loss(z, y, 0.1, 1.0) < \
        ct.focal_contrastive_loss(z, y, 0.1, 0.0)


@pytest.mark.parametrize("gamma", [1.0, 2.0])
def test_focal_gradcheck_float64(gamma):
    z = torch.randn(6, 3, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([0, 1, 0, 1, 2, 1])
    assert torch.autograd.gradcheck(lambda x: ct.focal_contrastive_loss(F.normalize(x, dim=-1), y, 0.3, gamma),
                                    (z,), eps=1e-6, atol=1e-6)


def test_focal_without_positives_is_zero_not_nan():
    z = torch.randn(3, 4, requires_grad=True)
    loss = ct.focal_contrastive_loss(F.normalize(z, dim=-1), torch.tensor([0, 1, 2]), 0.07)
    loss.backward()
    assert loss.item() == 0.0 and torch.isfinite(z.grad).all()


def test_hard_pairs_match_loop_reference():
    g = torch.Generator().manual_seed(4)
    f = torch.randn(9, 6, generator=g)
    labels = torch.tensor([0, 1, 0, 2, 1, 0, 1, 2, 3])  # class 3: no positive
    anchors = torch.arange(9)
    hp, hn = ct.hard_pair_indices(f, labels, anchors)
    fn = F.normalize(f, dim=-1).tolist()
    cos = lambda a, b: sum(x * y for x, y in zip(fn[a], fn[b], strict=True))  # noqa: E731
    for i in range(9):
        pos = [j for j in range(9) if j != i and labels[j] == labels[i]]
        neg = [j for j in range(9) if labels[j] != labels[i]]
        assert hp[i].item() == (min(pos, key=lambda j: cos(i, j)) if pos else i)
        assert hn[i].item() == max(neg, key=lambda j: cos(i, j))


def test_hard_pairs_for_a_subset_of_anchors_and_without_negatives():
    f = torch.randn(6, 4)
    labels = torch.tensor([0, 1, 0, 1, 0, 1])
    hp_all, hn_all = ct.hard_pair_indices(f, labels, torch.arange(6))
    hp, hn = ct.hard_pair_indices(f, labels, torch.tensor([4, 1]))
    assert hp.tolist() == [hp_all[4], hp_all[1]] and hn.tolist() == [hn_all[4], hn_all[1]]
    hp, hn = ct.hard_pair_indices(f[:3], torch.tensor([5, 5, 5]), torch.arange(3))
    assert hn.tolist() == [0, 1, 2]  # no negative: the anchor itself


def test_random_negative_is_of_another_class():
    torch.manual_seed(0)
    labels = torch.tensor([0, 0, 0, 1, 2, 2])
    anchors = torch.arange(6).repeat(200)
    r = ct.random_negative_indices(labels, anchors)
    assert (labels[r] != labels[anchors]).all()
    # uniform among the candidates: anchor 3 (class 1) has 5 negatives, each drawn ~1/5 of the time
    counts = torch.bincount(r[anchors == 3], minlength=6)[[0, 1, 2, 4, 5]].float()
    assert counts.min() > 20 and counts.max() < 70
    only = ct.random_negative_indices(torch.tensor([1, 1, 1]), torch.arange(3))
    assert (only != torch.arange(3)).all()  # one class: another row


def test_mixup_is_the_papers_two_convex_combinations():
    torch.manual_seed(1)
    f = torch.randn(8, 5, dtype=torch.float64)
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    y = F.one_hot(labels, 3).double()
    anchors = torch.arange(8)
    fm, ym = ct.hardness_directed_mixup(f, y, labels, anchors, alpha=1.0, neg_min_weight=0.8)
    assert fm.shape == (16, 5) and ym.shape == (16, 3)
    assert torch.allclose(ym.sum(1), torch.ones(16, dtype=ym.dtype))
    hp, hn = ct.hard_pair_indices(f, labels, anchors)
    for i in range(8):
        # semi-hard negative: (1−λ)·f_i + λ·f_r with λ ≥ 0.8 and r of another class
        lam = 1 - ym[i, labels[i]].item()
        assert lam >= 0.8 - 1e-6
        f_r = (fm[i] - (1 - lam) * f[i]) / lam
        match = [r for r in range(8) if torch.allclose(f_r, f[r], atol=1e-5)]
        assert match and labels[match[0]] != labels[i]
        assert ym[i, labels[match[0]]].item() == pytest.approx(lam)
        # hard positive: λ·f_p + (1−λ)·f_n, p least similar positive, n most similar negative
        lam = ym[8 + i, labels[i]].item()
        assert torch.allclose(fm[8 + i], lam * f[hp[i]] + (1 - lam) * f[hn[i]], atol=1e-6)


def test_mixing_weights_follow_beta_and_the_clip():
    torch.manual_seed(2)
    m = 4000
    labels = torch.tensor([0, 1] * (m // 2))
    f = torch.randn(m, 2)
    y = F.one_hot(labels, 2).float()
    _, ym = ct.hardness_directed_mixup(f, y, labels, torch.arange(m), alpha=1.0, neg_min_weight=0.8)
    lam_neg = 1 - ym[:m].gather(1, labels.view(-1, 1)).squeeze(1)
    lam_pos = ym[m:].gather(1, labels.view(-1, 1)).squeeze(1)
    # Beta(1, 1) is uniform: 80% of negative weights are clipped up to exactly 0.8
    assert (lam_neg - 0.8).abs().lt(1e-6).float().mean().item() == pytest.approx(0.8, abs=0.03)
    assert lam_pos.mean().item() == pytest.approx(0.5, abs=0.03) and lam_pos.min() < 0.1


def test_contrast_labels():
    y = torch.tensor([[1, 0], [0.2, 0.8], [0.7, 0.3], [0.2, 0.8], [0, 1]])
    assert ct.contrast_labels(y, "dominant").tolist() == [0, 1, 0, 1, 1]
    ids = ct.contrast_labels(y, "exact").tolist()
    assert ids[1] == ids[3] and len({ids[0], ids[1], ids[2], ids[4]}) == 4


def _real_batch(tiny_model_dir, n=12, head="native"):
    from tests.unit.test_objective_scl import _real_batch as rb

    model, batch = rb(tiny_model_dir, n, head)
    from finetune_cli.models.text_model import ProjectionHead

    model.projection = ProjectionHead(model.encoder.config.hidden_size)  # core_tuning needs_projection
    return model, batch


@pytest.mark.parametrize("head", ["native", "pooled"])
def test_objective_on_a_real_batch_has_parts_and_gradients(tiny_model_dir, head):
    from finetune_cli.models.native import final_linear

    model, batch = _real_batch(tiny_model_dir, head=head)
    obj = build("core_tuning", {"eta": 0.5})
    out = obj(model, batch)
    assert set(out) == {"loss", "ce", "con"}
    assert out["loss"].item() == pytest.approx((out["ce"] + 0.5 * out["con"]).item(), rel=1e-6)
    out["loss"].backward()
    lin = final_linear(model.hf) if head == "native" else model.classifier.out_proj
    extra = [model.encoder.pooler.dense.weight] if head == "native" else []  # BERT's head starts at its pooler
    for p in (model.encoder.embeddings.word_embeddings.weight, lin.weight, model.projection.dense.weight, *extra):
        assert p.grad is not None and p.grad.abs().sum() > 0


@pytest.mark.parametrize("how, head", [("dominant", "native"), ("exact", "native"), ("dominant", "pooled")])
def test_objective_assembles_ce_on_mixed_rows_and_focal_con(tiny_model_dir, monkeypatch, how, head):
    """Recompute both parts from the mixed rows the objective made (dropout off). With the native
    head the mixed features are first-token states and the whole BERT head (pooler, linear)
    classifies them; checked against the head written out by hand."""
    model, batch = _real_batch(tiny_model_dir, head=head)
    model.eval()
    seen = {}
    orig = ct.hardness_directed_mixup

    def spy(*a, **k):
        seen["out"] = orig(*a, **k)
        return seen["out"]

    monkeypatch.setattr(ct, "hardness_directed_mixup", spy)
    out = build("core_tuning", {"eta": 2.0, "tau": 0.2, "gamma": 1.5, "mixed_positives": how})(model, batch)
    with torch.no_grad():
        out0 = model(batch["features"][0])
        f = out0.features
        fm, ym = seen["out"]
        feats = torch.cat([f, fm])
        y = torch.cat([F.one_hot(batch["labels"], 2).float(), ym])
        if head == "native":
            assert torch.equal(f, model.encoder(**batch["features"][0]).last_hidden_state[:, 0])
            hf = model.hf
            logits = hf.classifier(torch.tanh(hf.bert.pooler.dense(feats)))
            assert torch.allclose(model.classify(f), out0.logits, atol=1e-6)  # classify == transformers' forward
        else:
            logits = model.classifier(feats)
        logp = F.log_softmax(logits, -1)
        ce = -(y * logp).sum(1).mean()
        g = F.normalize(model.projection(feats), dim=-1)
        ids = y.argmax(1) if how == "dominant" else ct.contrast_labels(y, "exact")
        con = reference_focal(g.double().tolist(), ids.tolist(), 0.2, 1.5)
    assert out["ce"].item() == pytest.approx(ce.item(), rel=1e-5)
    assert out["con"].item() == pytest.approx(con, rel=1e-4)


def test_declares_contract():
    from finetune_cli.objectives import registry

    cls = registry.get("core_tuning")
    assert cls.sampler == "class_balanced" and cls.needs_projection and cls.needs_classifier
    assert cls.label_type == "class" and cls.min_classes == 2


@pytest.mark.parametrize("override,msg", [
    ("objective.tau=0", "tau must be > 0.0"),
    ("objective.eta=-1", "eta must be >= 0.0"),
    ("objective.alpha=0", "alpha must be > 0.0"),
    ("objective.gamma=-0.5", "gamma must be >= 0.0"),
    ("objective.neg_min_weight=1.2", "neg_min_weight must be <= 1.0"),
    ("objective.mixed_positives=soft", "mixed_positives must be one of dominant, exact"),
])
def test_bad_hyperparameters_fail_at_recipe_validation(override, msg):
    with pytest.raises(RecipeError, match=msg):
        load_recipe("core_tuning", [override])


def test_interrupted_core_tuning_run_resumes_exactly(tiny_recipe, tmp_path):
    """Core-tuning draws mixing weights and random negatives, and reads class_balanced batches:
    a run cut after step 2 and resumed must end with the same weights as an uncut run."""
    from tests.unit.test_engine import _assert_same_weights, _StopAt, _train

    common = ("objective.name=core_tuning", "train.max_steps=4", "train.save_every=1", "train.batch_size=6",
              "data.max_train_samples=30")
    ref = _train(tiny_recipe(*common, f"output.dir={tmp_path / 'ref'}"))
    run = tiny_recipe(*common, f"output.dir={tmp_path / 'cut'}")
    with pytest.raises(RuntimeError):
        _train(run, callbacks=[_StopAt(2, RuntimeError("simulated crash"))])
    resumed = _train(run)
    assert resumed.resumed_from is not None and resumed.resumed_from.name == "checkpoint-2"
    _assert_same_weights(ref.run_dir / "final", resumed.run_dir / "final")
