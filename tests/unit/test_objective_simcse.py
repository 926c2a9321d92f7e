"""SimCSE: the loss against a loop-based InfoNCE reference, gradients, the doubled-batch pass,
NLI triplets, similarity metrics against loops, and the train/embed/eval/sentence-transformers path."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from finetune_cli.cli.main import app
from finetune_cli.data.nli import nli_triplets
from finetune_cli.data.sources import Table
from finetune_cli.metrics.similarity import alignment, cosine_scores, positive_threshold, uniformity
from finetune_cli.objectives.simcse import SimCSESup, SimCSEUnsup, duplicate_masks, simcse_loss, text_keys

STS = "sentence1\tsentence2\tscore\n" + "".join(
    f"{a}\t{b}\t{s}\n" for a, b, s in [
        ("a man is playing a guitar .", "a man plays the guitar .", 4.8),
        ("a woman is slicing an onion .", "a woman cuts an onion .", 4.2),
        ("a dog runs in the park .", "the stock market fell today .", 0.2),
        ("kids are playing football .", "children play soccer .", 3.9),
        ("the cat sleeps on the sofa .", "a plane lands at the airport .", 0.0),
        ("a man is cooking pasta .", "someone is making food .", 3.1),
    ])


def _ref_loss(z1, z2, tau, hard=None, w=0.0, mask=None, hard_mask=None):
    """Plain loops over the paper's equation: -log e^{s_ii} / (Σ_j e^{s_ij} + Σ_j e^{s'_ij + w[i=j]})."""
    n = len(z1)
    cos = lambda a, b: float(a @ b / (a.norm() * b.norm()))  # noqa: E731
    total = 0.0
    for i in range(n):
        num = math.exp(cos(z1[i], z2[i]) / tau)
        den = 0.0
        for j in range(n):
            if mask is None or not mask[i, j]:
                den += math.exp(cos(z1[i], z2[j]) / tau)
            if hard is not None and (hard_mask is None or not hard_mask[i, j]):
                den += math.exp(cos(z1[i], hard[j]) / tau + (w if i == j else 0.0))
        total += -math.log(num / den)
    return total / n


@pytest.mark.parametrize("with_hard", [False, True])
@pytest.mark.parametrize("w", [0.0, 0.7])
def test_loss_matches_loop_reference(with_hard, w):
    g = torch.Generator().manual_seed(0)
    z1, z2, h = (torch.randn(5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    tau = 0.5
    got = simcse_loss(z1, z2, tau, h if with_hard else None, w)
    assert got.item() == pytest.approx(_ref_loss(z1, z2, tau, h if with_hard else None, w), rel=1e-5)


def test_masks_match_reference_and_gradient_is_finite():
    g = torch.Generator().manual_seed(1)
    z1, z2, h = (torch.randn(4, 3, generator=g, requires_grad=True) for _ in range(3))
    k = torch.tensor([1, 2, 1, 3])
    mask, hmask = duplicate_masks(k, k, torch.tensor([9, 1, 9, 9]))
    assert mask[0, 2] and mask[2, 0] and not mask.diagonal().any()
    assert hmask[0, 1] and hmask[2, 1] and not hmask[1, 1]
    loss = simcse_loss(z1, z2, 0.1, h, 0.0, mask, hmask)
    assert loss.item() == pytest.approx(_ref_loss(z1.detach(), z2.detach(), 0.1, h.detach(), 0.0, mask, hmask), rel=1e-4)
    loss.backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0 for t in (z1, z2, h))


def test_gradient_check_float64():
    g = torch.Generator().manual_seed(2)
    z1, z2, h = (torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    # simcse_loss casts to float32 internally; gradcheck the float64 maths by patching the cast off.
    f = lambda a, b, c: simcse_loss(a, b, 0.3, c, 0.5)  # noqa: E731
    out = f(z1, z2, h)
    out.backward()
    eps = 1e-4
    for t in (z1, z2, h):
        num = torch.zeros_like(t)
        for idx in np.ndindex(*t.shape):
            with torch.no_grad():
                t[idx] += eps
                up = f(z1, z2, h).item()
                t[idx] -= 2 * eps
                dn = f(z1, z2, h).item()
                t[idx] += eps
            num[idx] = (up - dn) / (2 * eps)
        assert torch.allclose(t.grad, num, atol=2e-3), (t.grad, num)


def test_text_keys_ignore_padding():
    ids = torch.tensor([[101, 7, 8, 102, 0], [101, 7, 8, 102, 0], [101, 7, 9, 102, 0], [101, 7, 8, 102, 5]])
    am = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    k = text_keys({"input_ids": ids, "attention_mask": am})
    assert k[0] == k[1] and k[0] != k[2] and k[0] != k[3]


def _tiny(tiny_model_dir, pooling="mean", projection=False):
    from finetune_cli.models.loading import load_encoder, load_tokenizer
    from finetune_cli.models.text_model import HeadSpec, TextModel

    torch.manual_seed(0)
    enc = load_encoder(str(tiny_model_dir))
    return TextModel(enc, HeadSpec(pooling=pooling, projection=projection)), load_tokenizer(str(tiny_model_dir))


def test_doubled_batch_views_differ_with_dropout_and_match_without(tiny_model_dir):
    model, tok = _tiny(tiny_model_dir)
    f = dict(tok(["a first sentence .", "another one here"], padding=True, return_tensors="pt"))
    from finetune_cli.objectives.base import repeat_rows

    model.train()
    z = model(repeat_rows(f, 2)).embeddings
    assert not torch.allclose(z[:2], z[2:])
    model.eval()
    z = model(repeat_rows(f, 2)).embeddings
    assert torch.allclose(z[:2], z[2:], atol=1e-6)
    # the objective: dropout off makes both views identical, so the loss is the loss of z against itself
    loss = SimCSEUnsup(tau=0.05, mask_duplicates=False)(model, {"features": [f]})["loss"]
    e = model(f).embeddings
    assert loss.item() == pytest.approx(simcse_loss(e, e, 0.05).item(), rel=1e-5)


def test_encoder_dropout_zero_makes_training_views_identical(tiny_model_dir):
    from finetune_cli.models.text_model import set_encoder_dropout
    from finetune_cli.objectives.base import repeat_rows

    model, tok = _tiny(tiny_model_dir)
    set_encoder_dropout(model.encoder, 0.0)
    model.train()
    z = model(repeat_rows(dict(tok(["a first sentence .", "another"], padding=True, return_tensors="pt")), 2)).embeddings
    assert torch.allclose(z[:2], z[2:], atol=1e-6)
    assert model.encoder.config.hidden_dropout_prob == 0.0


def test_objectives_train_with_gradient(tiny_model_dir):
    model, tok = _tiny(tiny_model_dir, pooling="cls", projection=True)
    model.train()
    f = lambda xs: dict(tok(xs, padding=True, return_tensors="pt"))  # noqa: E731
    out = SimCSEUnsup()(model, {"features": [f(["one", "two words", "three words here"])]})
    out["loss"].backward()
    assert model.projection.dense.weight.grad.abs().sum() > 0
    model.zero_grad()
    out = SimCSESup(hard_neg_weight=0.5)(model, {"features": [f(["a", "b c", "d"]), f(["e f", "g", "h"]), f(["i", "j", "k l"])]})
    out["loss"].backward()
    assert model.encoder.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="tau"):
        SimCSEUnsup(tau=0.0)


def test_nli_triplets():
    t = Table({"text": ["p1", "p1", "p1", "p2", "p2", "p3"], "text_pair": ["e1", "c1", "n1", "e2", "e2b", "c3"],
               "label": ["entailment", "contradiction", "neutral", "entailment", "entailment", "contradiction"]}, "x")
    t2 = Table({**t.columns, "label": ["entailment", "contradiction", "neutral", "entailment", "contradiction", "contradiction"]}, "x")
    out = nli_triplets(t2)
    assert out.columns == {"text": ["p1", "p2"], "text_pair": ["e1", "e2"], "hard_neg": ["c1", "e2b"]}
    from finetune_cli.errors import DataError

    assert nli_triplets(t).columns["text"] == ["p1"]  # p2 has no contradiction, p3 no entailment
    with pytest.raises(DataError, match="no \\(premise"):
        nli_triplets(t.select([2, 3, 4, 5]))


def test_similarity_metrics_against_loops():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(6, 3)), rng.normal(size=(6, 3))
    na = a / np.linalg.norm(a, axis=1, keepdims=True)
    nb = b / np.linalg.norm(b, axis=1, keepdims=True)
    assert np.allclose(cosine_scores(a, b), [float(na[i] @ nb[i]) for i in range(6)])
    assert alignment(a, b) == pytest.approx(sum(float(np.sum((na[i] - nb[i]) ** 2)) for i in range(6)) / 6)
    pairs = [math.exp(-2 * float(np.sum((na[i] - na[j]) ** 2))) for i in range(6) for j in range(i + 1, 6)]
    assert uniformity(a) == pytest.approx(math.log(sum(pairs) / len(pairs)))
    assert positive_threshold(np.array([0.0, 5.0])) == 4.0
    assert positive_threshold(np.array([1.0, 4.5])) == 4.0
    assert positive_threshold(np.array([0.0, 0.9])) == pytest.approx(0.8)


def _write_data(tmp_path):
    sts = tmp_path / "sts.tsv"
    sts.write_text(STS)
    txt = tmp_path / "sents.txt"
    txt.write_text("\n".join(f"sentence number {i} about {w} ." for i, w in
                             enumerate(["cats", "dogs", "rain", "music", "code", "tea", "maps", "ice"] * 4)) + "\n")
    return sts, txt


def test_train_embed_eval_and_sentence_transformers_round_trip(tmp_path, tiny_model_dir):
    sts, txt = _write_data(tmp_path)
    r = CliRunner()
    res = r.invoke(app, ["train", "--recipe", "simcse_unsup", f"model.name={tiny_model_dir}", f"data.train={txt}",
                         f"data.eval={sts}", "data.max_train_samples=32", "train.batch_size=8", "train.eval_every=2",
                         f"output.dir={tmp_path / 'runs'}", "output.name=u", "--device", "cpu", "--quiet"])
    assert res.exit_code == 0, res.output
    run = tmp_path / "runs" / "u"
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert sum("eval/spearman" in x for x in lines) == 2
    s = json.loads((run / "summary.json").read_text())
    assert s["metric"] == "spearman" and s["best_step"] in (2, 4)
    assert (run / "best" / "modules.json").is_file()
    assert json.loads((run / "best" / "1_Pooling" / "config.json").read_text())["pooling_mode_mean_tokens"]

    out = tmp_path / "e.npy"
    res = r.invoke(app, ["embed", str(run), str(txt), "-o", str(out), "--device", "cpu", "--json"])
    assert res.exit_code == 0, res.output
    emb = np.load(out)
    assert emb.shape == (32, 32) and np.load(tmp_path / "e.ids.npy").tolist() == list(range(1, 33))
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(run / "best"), device="cpu")
    ref = st.encode(txt.read_text().splitlines(), batch_size=7, convert_to_numpy=True)
    assert np.allclose(emb, ref, atol=1e-5)

    pq = tmp_path / "e.parquet"
    res = r.invoke(app, ["embed", str(run), str(sts), "-c", "sentence1", "-o", str(pq), "--normalize", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    import pyarrow.parquet as pqm

    tab = pqm.read_table(pq).to_pylist()
    assert len(tab) == 6 and tab[0]["row_id"] == 1 and abs(np.linalg.norm(tab[0]["embedding"]) - 1) < 1e-5

    res = r.invoke(app, ["eval", str(run), "--device", "cpu", "--json"])
    assert res.exit_code == 0, res.output
    m = json.loads(res.stdout)["metrics"]
    a = st.encode([x.split("\t")[0] for x in STS.splitlines()[1:]])
    b = st.encode([x.split("\t")[1] for x in STS.splitlines()[1:]])
    from scipy.stats import spearmanr

    assert m["spearman"] == pytest.approx(spearmanr(cosine_scores(a, b), [4.8, 4.2, 0.2, 3.9, 0.0, 3.1])[0], abs=1e-4)
    assert m["positive_pairs"] == 2 and "alignment" in m and "uniformity" in m


def test_sup_recipe_with_nli_triplets_and_errors(tmp_path, tiny_model_dir):
    sts, _ = _write_data(tmp_path)
    nli = tmp_path / "nli.tsv"
    rows = [(f"premise {i} .", f"entails {i} .", "entailment") for i in range(12)] + \
           [(f"premise {i} .", f"contradicts {i} .", "contradiction") for i in range(12)]
    nli.write_text("premise\thypothesis\tlabel\n" + "".join("\t".join(r) + "\n" for r in rows))
    r = CliRunner()
    res = r.invoke(app, ["train", "--recipe", "simcse_sup", f"model.name={tiny_model_dir}", f"data.train={nli}",
                         f"data.eval={sts}", "train.batch_size=4", f"output.dir={tmp_path / 'runs'}", "output.name=s",
                         "--device", "cpu", "--quiet"])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "runs" / "s" / "summary.json").read_text())["steps"] == 3
    res = r.invoke(app, ["embed", str(tiny_model_dir), str(sts), "-c", "nope", "-o", str(tmp_path / "x.npy")])
    assert res.exit_code != 0 and "missing column `nope`" in res.output
    res = r.invoke(app, ["embed", str(tiny_model_dir), str(sts), "-c", "sentence1", "-o", str(tmp_path / "x.csv")])
    assert res.exit_code != 0 and ".npy or .parquet" in res.output


def _encoder_grads_nonzero(model) -> bool:
    return model.encoder.embeddings.word_embeddings.weight.grad.abs().sum().item() > 0


def test_unsup_gradient_on_a_batch_from_the_real_sampler(tiny_model_dir, quickstart_data):
    """simcse_unsup on a batch the training sampler and collate build: finite loss above 0, a
    non-zero encoder gradient, and the two dropout views of the doubled batch differ."""
    from tests.unit._objective_batch import model_and_batch

    model, _, batch, obj = model_and_batch(tiny_model_dir, quickstart_data, "simcse_unsup", "data.columns.label=null")
    out = obj(model, batch)
    assert torch.isfinite(out["loss"]) and out["loss"].item() > 0
    out["loss"].backward()
    assert _encoder_grads_nonzero(model)


def test_sup_gradient_on_a_batch_from_the_real_sampler(tiny_model_dir, quickstart_data, tmp_path):
    """simcse_sup on (anchor, positive, hard negative) triplets through the real sampler and collate."""
    from tests.unit._objective_batch import model_and_batch

    rows = [ln.split("\t")[0] for ln in open(quickstart_data["train"], encoding="utf-8").read().splitlines()[1:41]]
    f = tmp_path / "triplets.tsv"
    f.write_text("sentence\tpos\tneg\n" + "".join(f"{a}\t{a.lower()}\t{rows[(i + 7) % len(rows)]}\n"
                                                  for i, a in enumerate(rows)))
    model, _, batch, obj = model_and_batch(tiny_model_dir, quickstart_data, "simcse_sup", "data.columns.label=null",
                                           "data.columns.text_pair=pos", "data.columns.hard_neg=neg",
                                           train_file=str(f))
    assert len(batch["features"]) == 3  # anchor, positive, hard negative encoded separately
    out = obj(model, batch)
    assert torch.isfinite(out["loss"]) and out["loss"].item() > 0
    out["loss"].backward()
    assert _encoder_grads_nonzero(model)
