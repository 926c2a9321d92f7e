"""SCL (Gunel et al.): the contrastive term against a plain loop over the paper's equation, its
gradient, lone anchors, the combined loss on a real batch, and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from finetune_cli.cli.main import app
from finetune_cli.objectives import build
from finetune_cli.objectives.scl import supervised_contrastive_loss
from finetune_cli.pipelines.recipes import load_recipe
from finetune_cli.recipe import RecipeError

runner = CliRunner()


def reference_scl(z, labels, tau):
    """L = mean over anchors i with N_{y_i} > 1 of
    −1/(N_{y_i}−1) Σ_{j≠i, y_j=y_i} log( exp(z_i·z_j/τ) / Σ_{k≠i} exp(z_i·z_k/τ) )."""
    n = len(labels)
    dot = lambda a, b: sum(float(x) * float(y) for x, y in zip(z[a], z[b], strict=True))  # noqa: E731
    per_anchor = []
    for i in range(n):
        positives = [j for j in range(n) if j != i and labels[j] == labels[i]]
        if not positives:
            continue
        denom = sum(math.exp(dot(i, k) / tau) for k in range(n) if k != i)
        s = sum(math.log(math.exp(dot(i, j) / tau) / denom) for j in positives)
        per_anchor.append(-s / len(positives))
    return sum(per_anchor) / len(per_anchor) if per_anchor else 0.0


@pytest.mark.parametrize("labels", [[0, 1, 0, 1, 1, 0], [0, 0, 1, 2, 2, 2, 3], [1, 1, 1, 1]])
@pytest.mark.parametrize("tau", [0.1, 0.3, 1.0])
def test_matches_loop_reference(labels, tau):
    g = torch.Generator().manual_seed(len(labels))
    z = F.normalize(torch.randn(len(labels), 5, generator=g, dtype=torch.float64), dim=-1)
    got = supervised_contrastive_loss(z, torch.tensor(labels), tau).item()
    assert got == pytest.approx(reference_scl(z.tolist(), labels, tau), rel=1e-6)


def test_gradcheck_float64():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(6, 4, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([0, 1, 0, 2, 1, 1])  # class 2 is a lone anchor
    assert torch.autograd.gradcheck(
        lambda x: supervised_contrastive_loss(F.normalize(x, dim=-1), labels, 0.5), (z,), eps=1e-6, atol=1e-6)


def test_library_gradient_matches_reference_autograd():
    """Gradient of the library function equals autograd through a loop written from the equation."""
    g = torch.Generator().manual_seed(2)
    base = F.normalize(torch.randn(7, 3, generator=g), dim=-1)
    labels = [0, 1, 0, 1, 2, 1, 0]
    a = base.clone().requires_grad_(True)
    supervised_contrastive_loss(a, torch.tensor(labels), 0.3).backward()
    b = base.clone().double().requires_grad_(True)
    terms = []
    for i in range(7):
        pos = [j for j in range(7) if j != i and labels[j] == labels[i]]
        if not pos:
            continue
        den = torch.logsumexp(torch.stack([b[i] @ b[k] / 0.3 for k in range(7) if k != i]), 0)
        terms.append(-sum(b[i] @ b[j] / 0.3 - den for j in pos) / len(pos))
    torch.stack(terms).mean().backward()
    assert torch.allclose(a.grad.double(), b.grad, atol=1e-5)


def test_lone_anchors_give_zero_not_nan():
    z = F.normalize(torch.randn(4, 3), dim=-1).requires_grad_(True)
    loss = supervised_contrastive_loss(z, torch.tensor([0, 1, 2, 3]), 0.1)
    loss.backward()
    assert loss.item() == 0.0 and torch.isfinite(z.grad).all() and z.grad.abs().sum() == 0
    one = torch.randn(1, 3, requires_grad=True)
    out = supervised_contrastive_loss(one, torch.tensor([0]), 0.1)
    out.backward()
    assert out.item() == 0.0 and torch.isfinite(one.grad).all()


def test_lone_anchor_does_not_change_the_others():
    g = torch.Generator().manual_seed(3)
    z = F.normalize(torch.randn(5, 4, generator=g), dim=-1)
    with_lone = supervised_contrastive_loss(z, torch.tensor([0, 0, 1, 1, 2]), 0.3)
    # the lone anchor still sits in the others' denominators, so compare against the reference
    assert with_lone.item() == pytest.approx(reference_scl(z.tolist(), [0, 0, 1, 1, 2], 0.3), rel=1e-5)
    assert torch.isfinite(with_lone)


def _real_batch(tiny_model_dir, n=12, head="native"):
    """A batch from the real class_balanced sampler and collate on quickstart sentences."""
    from finetune_cli.data.encode import collate, encode_table
    from finetune_cli.data.sampling import epoch_batches
    from finetune_cli.data.sources import read_file
    from finetune_cli.models import HeadSpec, load_text_model
    from tests.conftest import QUICKSTART

    t = read_file(str(QUICKSTART / "train.tsv"), {"text": "sentence", "label": "label"}, "tsv", "auto")
    t = t.select(list(range(40)))
    names = sorted(set(t.columns["label"]))
    t.columns["label"] = [names.index(v) for v in t.columns["label"]]
    model, tok, _ = load_text_model(str(tiny_model_dir), HeadSpec(num_labels=len(names), head=head))
    enc = encode_table(t, tok, 32, ("text",), joint=True)
    batches = epoch_batches("class_balanced", enc.lengths, enc.labels, n, seed=0, epoch=0)
    batch = collate(enc, batches[0], tok.pad_token_id)
    return model, batch


@pytest.mark.parametrize("lam", [0.0, 0.9, 1.0])
def test_objective_on_a_real_batch(tiny_model_dir, lam):
    model, batch = _real_batch(tiny_model_dir)
    labels = batch["labels"]
    assert all((labels == c).sum() >= 2 for c in labels.unique())  # the sampler gave positives
    obj = build("scl", {"tau": 0.3, "lam": lam})
    torch.manual_seed(0)
    out = obj(model, batch)
    assert set(out) == {"loss", "ce", "scl"}
    assert out["loss"].item() == pytest.approx(((1 - lam) * out["ce"] + lam * out["scl"]).item(), rel=1e-6)
    assert out["scl"].item() > 0
    out["loss"].backward()
    assert model.encoder.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    head_grad = model.hf.classifier.weight.grad  # the native BERT head's linear map
    if lam == 1.0:
        assert head_grad is None or head_grad.abs().sum() == 0  # λ = 1: CE has weight 0
    else:
        assert head_grad.abs().sum() > 0


def test_objective_uses_normalised_pooled_embeddings(tiny_model_dir):
    """The scl part equals the pure function on the L2-normalised `embeddings` of the same forward."""
    model, batch = _real_batch(tiny_model_dir)
    model.eval()  # no dropout: two forwards agree
    out = build("scl", {"tau": 0.2, "lam": 0.5})(model, batch)
    with torch.no_grad():
        z = F.normalize(model(batch["features"][0]).embeddings, dim=-1)
    expected = supervised_contrastive_loss(z, batch["labels"], 0.2).item()
    assert out["scl"].item() == pytest.approx(expected, rel=1e-5)


def test_two_views_without_dropout_are_the_batch_twice(tiny_model_dir):
    """No dropout: both copies of an example are the same vector, so the SCL term is the reference
    loop on the duplicated set (each anchor gains its copy as a positive) and CE is CE of one copy."""
    model, batch = _real_batch(tiny_model_dir)
    model.eval()
    labels = batch["labels"]
    out = build("scl", {"tau": 0.3, "lam": 0.5, "views": 2})(model, batch)
    with torch.no_grad():
        one = model(batch["features"][0])
    z = F.normalize(one.embeddings, dim=-1).double()
    ref = reference_scl(torch.cat([z, z]).tolist(), labels.tolist() * 2, 0.3)
    assert out["scl"].item() == pytest.approx(ref, rel=1e-5)
    assert out["ce"].item() == pytest.approx(F.cross_entropy(one.logits, labels).item(), rel=1e-5)
    single = build("scl", {"tau": 0.3, "lam": 0.5})(model, batch)
    assert abs(out["scl"].item() - single["scl"].item()) > 1e-3  # the copies change the term


def test_two_views_with_dropout_contrast_the_doubled_forward(tiny_model_dir):
    """Training mode: one forward of the batch stacked twice, each copy with its own dropout; the
    loss is the reference on those 2n embeddings and the mean CE over the 2n logits."""
    from finetune_cli.objectives.base import repeat_rows

    model, batch = _real_batch(tiny_model_dir)
    model.train()
    labels = batch["labels"]
    torch.manual_seed(5)
    out = build("scl", {"tau": 0.3, "lam": 0.9, "views": 2})(model, batch)
    torch.manual_seed(5)
    with torch.no_grad():
        two = model(repeat_rows(batch["features"][0], 2))
    n = len(labels)
    assert not torch.allclose(two.embeddings[:n], two.embeddings[n:])  # dropout made two views
    z = F.normalize(two.embeddings, dim=-1).double()
    assert out["scl"].item() == pytest.approx(reference_scl(z.tolist(), labels.tolist() * 2, 0.3), rel=1e-5)
    assert out["ce"].item() == pytest.approx(F.cross_entropy(two.logits, labels.repeat(2)).item(), rel=1e-5)
    out["loss"].backward()
    assert model.encoder.embeddings.word_embeddings.weight.grad.abs().sum() > 0


def _crop_reference(ids, mask, keep, starts):
    """Row by row: first token, text[s : s+k], last unmasked token; the rest masked."""
    out_ids, out_mask = ids.clone(), torch.zeros_like(mask)
    for i in range(ids.shape[0]):
        n = int(mask[i].sum())
        text = ids[i, 1:n - 1].tolist()
        row = [int(ids[i, 0])] + text[int(starts[i]):int(starts[i]) + int(keep[i])] + [int(ids[i, n - 1])]
        out_ids[i, :len(row)] = torch.tensor(row)
        out_mask[i, :len(row)] = 1
    return out_ids, out_mask


def test_crop_rows_matches_loop_reference():
    from finetune_cli.objectives.base import crop_rows, sample_crops

    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([3, 9, 12, 5, 12, 4])
    ids = torch.randint(5, 100, (6, 12), generator=g)
    mask = (torch.arange(12) < lengths.view(-1, 1)).long()
    ids = ids.masked_fill(mask == 0, 0)
    torch.manual_seed(3)
    keep, starts = sample_crops(lengths, 0.3)
    m = lengths - 2
    assert bool(((keep >= 1) & (keep <= m) & (starts >= 0) & (starts + keep <= m)).all())
    tt = torch.zeros_like(ids)
    out = crop_rows({"input_ids": ids, "attention_mask": mask, "token_type_ids": tt}, keep, starts)
    ref_ids, ref_mask = _crop_reference(ids, mask, keep, starts)
    assert torch.equal(out["attention_mask"], ref_mask)
    assert torch.equal(out["input_ids"] * ref_mask, ref_ids * ref_mask)
    assert torch.equal(out["token_type_ids"], tt)


def test_sample_crops_spans_the_range():
    """u ~ U(low, 1): over many draws the kept share covers [low, 1] and never leaves it."""
    from finetune_cli.objectives.base import sample_crops

    torch.manual_seed(0)
    lengths = torch.full((4000,), 102)  # 100 text tokens: keep/100 is u rounded
    keep, starts = sample_crops(lengths, 0.5)
    share = keep.float() / 100
    assert share.min() >= 0.5 and share.max() <= 1.0
    assert share.min() < 0.52 and share.max() > 0.98 and abs(share.mean().item() - 0.75) < 0.01
    assert starts.max() > 30 and bool((starts + keep <= 100).all())  # short spans start anywhere


def test_cropped_views_are_the_whole_batch_and_its_crops(tiny_model_dir):
    """views 2, crop 0.5, no dropout: the SCL term is the reference on [whole; cropped] embeddings,
    the crops drawn from torch's RNG as sample_crops draws them; CE is the mean over both."""
    from finetune_cli.objectives.base import crop_rows, sample_crops

    model, batch = _real_batch(tiny_model_dir)
    model.eval()
    labels, f = batch["labels"], batch["features"][0]
    torch.manual_seed(11)
    out = build("scl", {"tau": 0.3, "lam": 0.5, "views": 2, "crop": 0.5})(model, batch)
    torch.manual_seed(11)
    cropped = crop_rows(f, *sample_crops(f["attention_mask"].sum(1), 0.5))
    assert cropped["attention_mask"].sum() < f["attention_mask"].sum()
    with torch.no_grad():
        whole, part = model(f), model(cropped)
    z = F.normalize(torch.cat([whole.embeddings, part.embeddings]), dim=-1).double()
    assert out["scl"].item() == pytest.approx(reference_scl(z.tolist(), labels.tolist() * 2, 0.3), rel=1e-5)
    ce = F.cross_entropy(torch.cat([whole.logits, part.logits]), labels.repeat(2)).item()
    assert out["ce"].item() == pytest.approx(ce, rel=1e-5)
    plain = build("scl", {"tau": 0.3, "lam": 0.5, "views": 2})(model, batch)
    assert abs(out["scl"].item() - plain["scl"].item()) > 1e-3  # the crops change the term


def test_one_cropped_view_is_the_batch_cropped_and_trimmed(tiny_model_dir):
    """views 1, crop 0.5, no dropout: the batch itself is cropped (crops drawn as sample_crops draws
    them), cut to its longest crop, and both terms are those of the cropped batch alone."""
    from finetune_cli.objectives.base import crop_rows, sample_crops, trim_padding

    model, batch = _real_batch(tiny_model_dir)
    model.eval()
    labels, f = batch["labels"], batch["features"][0]
    torch.manual_seed(11)
    out = build("scl", {"tau": 0.3, "lam": 0.5, "crop": 0.5})(model, batch)
    torch.manual_seed(11)
    cropped = trim_padding(crop_rows(f, *sample_crops(f["attention_mask"].sum(1), 0.5)))
    assert cropped["input_ids"].shape[1] == int(cropped["attention_mask"].sum(1).max()) < f["input_ids"].shape[1]
    with torch.no_grad():
        part = model(cropped)
    z = F.normalize(part.embeddings, dim=-1).double()
    assert out["scl"].item() == pytest.approx(reference_scl(z.tolist(), labels.tolist(), 0.3), rel=1e-5)
    assert out["ce"].item() == pytest.approx(F.cross_entropy(part.logits, labels).item(), rel=1e-5)
    whole = build("scl", {"tau": 0.3, "lam": 0.5})(model, batch)
    assert abs(out["scl"].item() - whole["scl"].item()) > 1e-3  # the crop changed the term


@pytest.mark.parametrize("views", [1, 2])
def test_crop_leaves_text_pairs_whole(tiny_model_dir, views):
    """Cropping would cut a joint pair's separator: a pair batch trains exactly as without crop."""
    from finetune_cli.models import HeadSpec, load_text_model

    model, tok, _ = load_text_model(str(tiny_model_dir), HeadSpec(num_labels=2, head="pooled"))
    model.eval()
    f = dict(tok(["a fine film", "dull"], ["it is", "very dull"], padding=True, return_tensors="pt"))
    batch = {"features": [f], "labels": torch.tensor([0, 1])}
    whole = build("scl", {"views": views})(model, batch)
    assert build("scl", {"views": views, "crop": 0.5})(model, batch)["loss"].item() == pytest.approx(
        whole["loss"].item(), rel=1e-6)
    f.pop("token_type_ids")  # RoBERTa-style pairs carry no segment ids: the separator seen twice tells
    whole = build("scl", {"views": views})(model, batch)
    assert build("scl", {"views": views, "crop": 0.5})(model, batch)["loss"].item() == pytest.approx(
        whole["loss"].item(), rel=1e-6)
    single = dict(tok(["a fine film of many words", "dull"], padding=True, return_tensors="pt"))  # cropped
    b1 = {"features": [single], "labels": torch.tensor([0, 1])}
    assert build("scl", {"views": views, "crop": 0.1})(model, b1)["loss"].item() != pytest.approx(
        build("scl", {"views": views})(model, b1)["loss"].item(), rel=1e-6)


def test_crop_on_pair_data_trains(tmp_path, tiny_model_dir):
    rows = ["sentence\tsentence2\tlabel"] + [f"a good film {i}\tit is fine\tpos\nbad movie {i}\tawful\tneg"
                                               for i in range(8)]
    (tmp_path / "p.tsv").write_text("\n".join(rows) + "\n")
    res = runner.invoke(app, ["train", "-r", "quickstart", f"model.name={tiny_model_dir}", "objective.name=scl",
                              "objective.views=2", "objective.crop=0.5", f"data.train={tmp_path / 'p.tsv'}",
                              f"data.eval={tmp_path / 'p.tsv'}", "data.columns.text=sentence",
                              "data.columns.text_pair=sentence2", "train.max_steps=2",
                              f"output.dir={tmp_path / 'runs'}", "--device", "cpu", "-q"])
    assert res.exit_code == 0, res.stderr


def test_declares_class_balanced_sampler():
    from finetune_cli.data.sampling import SAMPLERS
    from finetune_cli.objectives import registry

    cls = registry.get("scl")
    assert cls.sampler == "class_balanced" and cls.sampler in SAMPLERS
    assert cls.label_type == "class" and cls.min_classes == 2


@pytest.mark.parametrize("override,msg", [
    ("objective.tau=0", "tau must be > 0.0"),
    ("objective.tau=-0.1", "tau must be > 0.0"),
    ("objective.lam=1.5", "lam must be <= 1.0"),
    ("objective.lam=-0.01", "lam must be >= 0.0"),
    ("objective.temperature=0.1", "`scl` takes tau, lam"),
    ("objective.views=0", "views must be >= 1"),
    ("objective.views=1.5", "`objective.views` in scl must be an integer"),
    ("objective.views=true", "`objective.views` in scl must be an integer"),
    ("objective.crop=0", "crop must be > 0.0"),
    ("objective.crop=1.5", "crop must be <= 1.0"),
])
def test_bad_hyperparameters_fail_at_recipe_validation(override, msg):
    with pytest.raises(RecipeError, match=msg):
        load_recipe("scl", [override])


def test_bad_hyperparameter_fails_before_any_model_loads(tmp_path, monkeypatch):
    import finetune_cli.models.loading as loading

    def no_model(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(loading, "load_encoder", no_model)
    res = runner.invoke(app, ["train", "-r", "scl", "objective.lam=2", f"output.dir={tmp_path}", "-q"])
    assert res.exit_code == 2
    assert "lam must be <= 1.0" in res.stderr.strip().splitlines()[-1]
    assert not any(tmp_path.iterdir())


def _write(tmp_path, rows, name="d.tsv"):
    p = tmp_path / name
    p.write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows))
    return p


@pytest.mark.parametrize("objective", ["scl", "core_tuning"])
def test_regression_scores_are_refused(tmp_path, tiny_model_dir, objective):
    rng = np.random.default_rng(0)
    p = _write(tmp_path, [(f"sentence {i}", f"{rng.uniform(0, 5):.1f}") for i in range(20)] + [("x", "3.8")])
    res = runner.invoke(app, ["train", "-r", objective, "~data.dataset", f"data.train={p}",
                              "data.columns.text=sentence", f"model.name={tiny_model_dir}",
                              f"output.dir={tmp_path / 'runs'}", "-q", "--device", "cpu"])
    assert res.exit_code != 0
    line = res.stderr.strip().splitlines()[-1]
    assert "is a regression score" in line and "needs class labels" in line and str(p) in line


@pytest.mark.parametrize("objective", ["scl", "core_tuning"])
def test_one_class_is_refused(tmp_path, tiny_model_dir, objective):
    p = _write(tmp_path, [(f"great {i}", "positive") for i in range(10)])
    res = runner.invoke(app, ["train", "-r", objective, "~data.dataset", f"data.train={p}",
                              "data.columns.text=sentence", f"model.name={tiny_model_dir}",
                              f"output.dir={tmp_path / 'runs'}", "-q", "--device", "cpu"])
    assert res.exit_code != 0
    assert "has 1 class(es); this objective needs at least 2" in res.stderr.strip().splitlines()[-1]


def test_integer_labels_and_explicit_label_names_still_work(tmp_path):
    """The score check must not refuse integer class ids, nor numbers declared as class names."""
    from finetune_cli.data.tasks import load_task_data
    from finetune_cli.pipelines.recipes import load_recipe as lr

    p = _write(tmp_path, [("a", "0"), ("b", "1"), ("c", "2")])
    r = lr(None, [f"data.train={p}", "data.columns.text=sentence"])
    d = load_task_data(r.data, seed=0, label_type="class", required_columns=("text", "label"))
    assert d.label_names == ["0", "1", "2"]
    q = _write(tmp_path, [("a", "0.5"), ("b", "1.5")], "q.tsv")
    r = lr(None, [f"data.train={q}", "data.columns.text=sentence", "data.label_names=['0.5','1.5']"])
    assert load_task_data(r.data, seed=0, label_type="class", required_columns=("text", "label")).num_labels == 2
