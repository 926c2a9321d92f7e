"""FastFit (Yehudai & Bandel): token max-sim and SupCon against plain loops over the paper's
equations, the whole loss against a loop on a tiny model, its gradient on a real batch, the labels
head, the recipe's checks, and a CLI run whose eval, predict and exported ONNX folder agree."""

from __future__ import annotations

import csv
import json
import math

import pytest
import torch
import torch.nn.functional as F

from finetune_cli.objectives.fastfit import max_sim, supcon_from_similarity, text_label_similarity
from tests.unit._cli import invoke


def loop_max_sim(a, a_len, b, b_len):
    """s(a, b) = 1/|a| Σ_{t<|a|} max_{u<|b|} a_t·b_u, on lists of token vectors."""
    dot = lambda x, y: sum(float(p) * float(q) for p, q in zip(x, y, strict=True))  # noqa: E731
    return sum(max(dot(a[t], b[u]) for u in range(b_len)) for t in range(a_len)) / a_len


def loop_supcon(sim, labels, tau):
    """Khosla et al. eq. 2 averaged over anchors: −1/|P(i)| Σ_p log(exp(S_ip/τ) / Σ_{a≠i} exp(S_ia/τ))."""
    n, terms = len(labels), []
    for i in range(n):
        pos = [p for p in range(n) if p != i and labels[p] == labels[i]]
        if not pos:
            continue
        den = sum(math.exp(sim[i][a] / tau) for a in range(n) if a != i)
        terms.append(-sum(math.log(math.exp(sim[i][p] / tau) / den) for p in pos) / len(pos))
    return sum(terms) / len(terms)


def test_max_sim_matches_loop_and_ignores_padding():
    g = torch.Generator().manual_seed(0)
    a = F.normalize(torch.randn(3, 5, 4, generator=g, dtype=torch.float64), dim=-1)
    b = F.normalize(torch.randn(4, 6, 4, generator=g, dtype=torch.float64), dim=-1)
    a_len, b_len = [5, 2, 3], [6, 1, 4, 2]
    am = torch.tensor([[1] * n + [0] * (5 - n) for n in a_len])
    bm = torch.tensor([[1] * n + [0] * (6 - n) for n in b_len])
    got = max_sim(a, am, b, bm, chunk=50)  # several chunks
    for i in range(3):
        for j in range(4):
            ref = loop_max_sim(a[i].tolist(), a_len[i], b[j].tolist(), b_len[j])
            assert got[i, j].item() == pytest.approx(ref, abs=1e-9)
    # what sits in the padding changes nothing
    a2 = a.clone()
    a2[1, 3:] = 7.0
    assert torch.equal(max_sim(a2, am, b, bm), max_sim(a, am, b, bm))


@pytest.mark.parametrize("labels", [[0, 1, 0, 1, 2, 2], [0, 0, 1, 2, 1, 3]])
@pytest.mark.parametrize("tau", [0.07, 0.5])
def test_supcon_matches_loop(labels, tau):
    g = torch.Generator().manual_seed(len(labels))
    s = torch.rand(len(labels), len(labels), generator=g, dtype=torch.float64) * 2 - 1
    got = supcon_from_similarity(s, torch.tensor(labels), tau).item()
    assert got == pytest.approx(loop_supcon(s.tolist(), labels, tau), rel=1e-9)


def test_label_rows_take_the_texts_direction():
    s = torch.arange(16.0).view(4, 4)
    out = text_label_similarity(s, torch.tensor([False, True, False, True]))
    assert out[1, 0] == s[0, 1] and out[3, 2] == s[2, 3] and out[1, 3] == s[1, 3] and out[0, 1] == s[0, 1]


# ---- on the tiny model -----------------------------------------------------------------------------

def _setup(tiny_model_dir, quickstart_data, *overrides, batch_size=6):
    from finetune_cli.pipelines.common import attach_label_texts
    from finetune_cli.pipelines.recipes import load_plan
    from tests.unit._objective_batch import model_and_batch

    model, tok, batch, obj = model_and_batch(tiny_model_dir, quickstart_data, "fastfit", *overrides,
                                             batch_size=batch_size)
    plan = load_plan(None, [f"model.name={tiny_model_dir}", f"data.train={quickstart_data['train']}",
                            "data.columns.text=sentence", "objective.name=fastfit", *overrides])
    attach_label_texts(plan, model, tok, ["negative", "positive"])
    return model, tok, batch, obj


@pytest.mark.parametrize("similarity", ["tokens", "pooled"])
def test_loss_matches_the_paper_loop_on_a_tiny_model(tiny_model_dir, quickstart_data, similarity):
    """Eval mode (no dropout), two views: the loss is a loop over the 2·V·B rows (each text, and
    beside it its label's name): the pairwise similarity by the paper's definition on each row's
    own token states, then SupCon over all rows, plus 0.1·CE of the head on the text rows."""
    model, tok, batch, obj = _setup(tiny_model_dir, quickstart_data, f"objective.similarity={similarity}",
                                    "objective.views=2")
    model.eval()
    out = obj(model, batch)
    labels = batch["labels"].tolist()
    texts = batch["features"][0]
    names = ["negative", "positive"]
    rows = [(texts["input_ids"][i][texts["attention_mask"][i].bool()].tolist(), labels[i], False) for i in
            range(len(labels))]
    rows += [(tok(names[y])["input_ids"], y, True) for y in labels]
    rows = rows * 2  # two views; without dropout they are equal
    with torch.no_grad():
        enc = [model({"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)})
               for ids, _, _ in rows]
    n = len(rows)
    sim = [[0.0] * n for _ in range(n)]
    for i in range(n):
        for j in range(n):
            if similarity == "pooled":
                sim[i][j] = float(F.cosine_similarity(enc[i].embeddings, enc[j].embeddings).double())
            else:
                # the text's tokens carry the sum when a label row meets a text row
                p, q = (j, i) if rows[i][2] and not rows[j][2] else (i, j)
                a = F.normalize(enc[p].tokens[0].double(), dim=-1).tolist()
                b = F.normalize(enc[q].tokens[0].double(), dim=-1).tolist()
                sim[i][j] = loop_max_sim(a, len(a), b, len(b))
    ref_sim = loop_supcon(sim, [y for _, y, _ in rows], 0.07)
    assert out["sim"].item() == pytest.approx(ref_sim, abs=2e-4)  # padded batch vs one row at a time
    logits = torch.cat([e.logits for e, r in zip(enc, rows, strict=True) if not r[2]]).double()
    ce = F.cross_entropy(logits, torch.tensor(labels * 2)).item()
    assert out["ce"].item() == pytest.approx(ce, abs=1e-5)
    assert out["loss"].item() == pytest.approx(out["sim"].item() + 0.1 * out["ce"].item(), rel=1e-6)


def test_loss_matches_the_loop_on_its_own_forward(tiny_model_dir, quickstart_data):
    """The same loop on the token states of the objective's own two passes (the texts at their
    width, the label texts at theirs) agrees to 1e-6."""
    from finetune_cli.objectives.base import repeat_rows

    model, tok, batch, obj = _setup(tiny_model_dir, quickstart_data, "objective.views=2")
    model.eval()
    got = obj(model, batch)["sim"].item()
    labels = batch["labels"]
    lab = model.label_inputs()
    texts, docs = repeat_rows(batch["features"][0], 2), repeat_rows({k: v[labels] for k, v in lab.items()}, 2)
    assert docs["input_ids"].shape[1] < texts["input_ids"].shape[1]  # the label texts' own, shorter width
    with torch.no_grad():
        t = [F.normalize(x, dim=-1).tolist() for rows in (texts, docs) for x in model(rows).tokens.double()]
    lens = texts["attention_mask"].sum(1).tolist() + docs["attention_mask"].sum(1).tolist()
    b = len(labels)
    is_label = [r >= 2 * b for r in range(4 * b)]
    sim = [[0.0] * (4 * b) for _ in range(4 * b)]
    for i in range(4 * b):
        for j in range(4 * b):
            p, q = (j, i) if is_label[i] and not is_label[j] else (i, j)
            sim[i][j] = loop_max_sim(t[p], lens[p], t[q], lens[q])
    assert got == pytest.approx(loop_supcon(sim, labels.tolist() * 4, 0.07), abs=1e-6)


@pytest.mark.parametrize("head", ["pooled", "labels"])
def test_gradient_on_a_real_batch(tiny_model_dir, quickstart_data, head):
    model, _, batch, obj = _setup(tiny_model_dir, quickstart_data, f"model.head={head}")
    labels = batch["labels"]
    assert all((labels == c).sum() >= 2 for c in labels.unique())  # the class_balanced sampler
    model.train()
    out = obj(model, batch)
    assert set(out) == {"loss", "ce", "sim"} and torch.isfinite(out["loss"])
    out["loss"].backward()
    assert model.encoder.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    w = model.classifier.out_proj.weight
    if head == "labels":
        assert w.grad is None  # the labels head is set from the label texts, never trained
    else:
        assert w.grad.abs().sum() > 0


def test_labels_head_is_the_label_embeddings_over_tau(tiny_model_dir, quickstart_data):
    model, tok, batch, _ = _setup(tiny_model_dir, quickstart_data, "model.head=labels", "objective.tau=0.2")
    model.train()
    with torch.no_grad():
        model.classifier.out_proj.weight.zero_()
    model.eval()  # re-encodes the label texts into the head
    with torch.no_grad():
        z = torch.cat([model({k: v for k, v in tok(n, return_tensors="pt").items()}).embeddings
                       for n in ("negative", "positive")])
        want = F.normalize(z, dim=-1) / 0.2
        assert torch.allclose(model.classifier.out_proj.weight, want, atol=1e-5)
        x = model(batch["features"][0])
        cos = F.normalize(x.embeddings, dim=-1) @ F.normalize(z, dim=-1).T
        assert torch.allclose(x.logits, cos / 0.2, atol=1e-4)


# ---- the recipe ------------------------------------------------------------------------------------

def test_recipe_refusals(tiny_model_dir, quickstart_data):
    from finetune_cli.pipelines.recipes import load_plan
    from finetune_cli.recipe import RecipeError

    with pytest.raises(RecipeError, match=r"`data.label_descriptions.postive` .* did you mean `positive`"):
        load_plan("fewshot/fastfit", ["data.label_names=[negative, positive]",
                                      "data.label_descriptions={postive: good}"])
    with pytest.raises(RecipeError, match="`model.head: labels` .* objective `ce` never encodes"):
        load_plan("fewshot/ce", ["model.head=labels", "train.refit_head=false"])
    with pytest.raises(RecipeError, match="`data.label_descriptions` .* objective `ce` does not"):
        load_plan("fewshot/ce", ["data.label_descriptions={a: b}"])
    with pytest.raises(RecipeError, match="refit_head"):
        load_plan("fewshot/fastfit", ["train.refit_head=true"])


def test_unknown_label_in_descriptions_is_one_line_at_train(tiny_recipe, tmp_path):
    res = invoke("train", "-r", "fewshot/fastfit", *tiny_recipe("~data.dataset", "~data.train_split",
                                                                "~data.eval_split", "~data.few_shot",
                                                                "data.label_descriptions={neutral: so-so}"),
                 "--device", "cpu", "-q")
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert "`data.label_descriptions.neutral`" in lines[0] and "negative" in lines[0]
    assert not (tmp_path / "runs" / "tiny" / "final").exists()


def test_cli_train_eval_predict_agree(tiny_recipe, tmp_path, quickstart_data):
    """A few steps of the shipped recipe on the tiny model: the saved labels head is the saved
    encoder's label embeddings / τ; eval reproduces training's best metric; predict's labels give
    eval's accuracy on the same file, and so does the exported ONNX folder."""
    over = tiny_recipe("~data.dataset", "~data.train_split", "~data.eval_split", "~data.few_shot",
                       "train.min_steps=4", "train.max_steps=4", "train.min_evals=1", "objective.views=2",
                       "data.label_descriptions={negative: bad review, positive: good review}")
    res = invoke("train", "-r", "fewshot/fastfit", *over, "--device", "cpu", "--json", "-q")
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    run = tmp_path / "runs" / "tiny"
    from finetune_cli.models import load_text_model

    model, tok, _ = load_text_model(str(run / "best"))
    assert model.spec.head == "labels" and model.spec.temperature == 0.07
    model.eval()
    with torch.no_grad():
        z = torch.cat([model({k: v for k, v in tok(t, return_tensors="pt").items()}).embeddings
                       for t in ("bad review", "good review")])
    assert torch.allclose(model.classifier.out_proj.weight, F.normalize(z, dim=-1) / 0.07, atol=1e-4)
    res = invoke("eval", str(run), "--json", "-q", "--device", "cpu")
    assert res.exit_code == 0, res.output
    acc = json.loads(res.stdout)["metrics"]["accuracy"]
    assert acc == pytest.approx(summary["best_metric"])
    out = tmp_path / "p.csv"
    res = invoke("predict", str(run), "-i", quickstart_data["eval"], "-c", "sentence", "-o", str(out),
                 "--device", "cpu", "-q")
    assert res.exit_code == 0, res.output
    with open(out, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert sum(r["pred_label"] == r["label"] for r in rows) / len(rows) == pytest.approx(acc)
    onnx = tmp_path / "onnx"
    res = invoke("export", str(run), "--format", "onnx", "-o", str(onnx), "-q")
    assert res.exit_code == 0, res.output
    res = invoke("eval", str(onnx), f"data.eval={quickstart_data['eval']}", "data.columns.text=sentence", "--json",
                 "-q", "--device", "cpu")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["metrics"]["accuracy"] == pytest.approx(acc)
