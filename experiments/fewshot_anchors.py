"""Anchors of the few-shot study: a linear probe and SetFit on the very draws the recipes train on.

Both anchors take the N examples per class from the same function the training runs use
(``pipelines.common.load_data`` with the run's seed), so the comparison is paired by seed.

* ``probe``: scikit-learn ``LogisticRegression()`` (its defaults) on the frozen encoder's
  mean-pooled embeddings of the training sample; predicts the test half.
* ``setfit``: SetFit 1.2 (Tunstall et al. 2022, arXiv 2209.11055) with the same body
  (``embedded`` = all-MiniLM-L6-v2): contrastive pair fine-tuning of the body, then a logistic
  regression head. Optional (``pip install -e .[bench]``); the row is skipped with a note without it.

Both read one text per example: a sentence pair ``(a, b)`` becomes ``a [SEP] b`` (the body's
separator token between them; :func:`join_pair`), which the body's tokenizer encodes as the tokens of
the joint pair the recipes train on, with segment ids all 0.

Every anchor run writes ``<out>/seed-<k>/result.json`` (metrics on the test and selection halves,
wall and CPU seconds) and is reused when the study is rerun.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ANCHORS = ("probe", "setfit")
# SetFit's settings in the study (its defaults for a few-shot run), part of each SetFit cell's key in the ledger
SETFIT_SETTINGS = {"num_iterations": 20, "batch_size": 16, "epochs": 1}


def classification_result(logits_or_proba: np.ndarray, labels: np.ndarray, proba: bool = False) -> dict[str, float]:
    """Accuracy, macro-F1, ECE and the share of predictions that are class 0 (a collapse shows)."""
    from finetune_cli.metrics.calibration import calibration_metrics
    from finetune_cli.metrics.classification import classification_metrics

    scores = np.log(np.clip(logits_or_proba, 1e-12, 1.0)) if proba else logits_or_proba
    pred = scores.argmax(-1)
    out = dict(classification_metrics(labels, pred))
    out["ece"] = float(calibration_metrics(scores, labels)["ece"])
    out["pred_neg_share"] = float((pred == 0).mean())
    return out


def seed_data(recipe, seed: int, data_dir: Path | None = None):
    """The training sample of ``seed`` exactly as ``finetune train --seeds`` draws it."""
    from finetune_cli.pipelines.common import load_data
    from finetune_cli.pipelines.multiseed import seed_plan
    from finetune_cli.pipelines.recipes import plan_for

    return load_data(seed_plan(plan_for(recipe), seed), data_dir, need_train=True)


def join_pair(texts, pairs, sep: str) -> list[str]:
    """One text per example: ``a {sep} b`` for a pair, the text itself without one."""
    return list(texts) if pairs is None else [f"{a} {sep} {b}" for a, b in zip(texts, pairs, strict=True)]


def read_labelled(path: Path, label_names: list[str], sep: str) -> tuple[list[str], np.ndarray]:
    """A study split (JSONL: text, optional text_pair, label) as single texts and label ids."""
    rows = [json.loads(ln) for ln in Path(path).read_text(encoding="utf-8").splitlines() if ln.strip()]
    ids = {n: i for i, n in enumerate(label_names)}
    pairs = [r["text_pair"] for r in rows] if rows and "text_pair" in rows[0] else None
    return join_pair([r["text"] for r in rows], pairs, sep), np.array([ids[str(r["label"])] for r in rows])


class Embedder:
    """The frozen encoder's mean-pooled embeddings (the body every row starts from), cached by text set."""

    def __init__(self, model_name: str, max_length: int):
        from finetune_cli.models.loading import load_text_model

        self.model, self.tok, _ = load_text_model(model_name)
        self.model.eval()
        self.max_length = max_length
        self.cache: dict[str, np.ndarray] = {}

    def __call__(self, texts: list[str], key: str | None = None) -> np.ndarray:
        if key is not None and key in self.cache:
            return self.cache[key]
        import torch

        out = []
        with torch.no_grad():
            for i in range(0, len(texts), 64):
                f = self.tok(texts[i:i + 64], truncation=True, max_length=self.max_length, padding=True,
                             return_tensors="pt")
                out.append(self.model({k: v for k, v in f.items()}).embeddings.float().numpy())
        x = np.concatenate(out)
        if key is not None:
            self.cache[key] = x
        return x


def run_probe(train_texts, train_labels, evals: dict[str, tuple[list[str], np.ndarray]], embed: Embedder,
              seed: int) -> dict[str, Any]:
    from sklearn.linear_model import LogisticRegression

    clf = LogisticRegression(random_state=seed).fit(embed(train_texts), train_labels)
    return {name: classification_result(clf.predict_proba(embed(texts, key=name)), y, proba=True)
            for name, (texts, y) in evals.items()}


def setfit_available() -> str | None:
    """None when SetFit can run, else why not."""
    try:
        import setfit  # noqa: F401
    except Exception as e:  # ImportError, or a version clash inside setfit's imports
        return f"setfit not importable ({type(e).__name__}: {e}); install the `bench` extra"
    return None


def run_setfit(train_texts, train_labels, evals, model_path: str, seed: int, max_length: int,
               num_iterations: int = SETFIT_SETTINGS["num_iterations"], batch_size: int = SETFIT_SETTINGS["batch_size"],
               epochs: int = SETFIT_SETTINGS["epochs"]) -> dict[str, Any]:
    import tempfile

    from datasets import Dataset
    from setfit import SetFitModel, Trainer, TrainingArguments

    model = SetFitModel.from_pretrained(model_path)
    model.model_body.max_seq_length = max_length
    with tempfile.TemporaryDirectory() as tmp:  # SetFit's own checkpoints: not kept (save_strategy no)
        args = TrainingArguments(output_dir=tmp, batch_size=batch_size, num_epochs=epochs,
                                 num_iterations=num_iterations, seed=seed, report_to="none",
                                 show_progress_bar=False, save_strategy="no")
        ds = Dataset.from_dict({"text": list(train_texts), "label": [int(v) for v in train_labels]})
        Trainer(model=model, args=args, train_dataset=ds).train()
    return {name: classification_result(np.asarray(model.predict_proba(texts)), y, proba=True)
            for name, (texts, y) in evals.items()}


def run_anchor(name: str, recipe, seeds, test: Path, select: Path, out: Path, embed: Callable[[], Embedder],
               cpu_seconds: Callable[[], float], say) -> list[dict[str, Any]]:
    """Run (or reuse) one anchor for every seed; returns the per-seed result records."""
    from finetune_cli.models.loading import resolve_model

    results = []
    for seed in seeds:
        f = out / f"seed-{seed}" / "result.json"
        if f.is_file():
            results.append(json.loads(f.read_text()))
            continue
        data = seed_data(recipe, seed)
        names, sep = list(data.label_names), embed().tok.sep_token
        evals = {"test": read_labelled(test, names, sep), "select": read_labelled(select, names, sep)}
        texts = join_pair(data.train.columns["text"], data.train.columns.get("text_pair"), sep)
        labels = np.asarray(data.train.columns["label"])
        t0, c0 = time.perf_counter(), cpu_seconds()
        if name == "probe":
            metrics = run_probe(texts, labels, evals, embed(), seed)
        else:
            metrics = run_setfit(texts, labels, evals, resolve_model(recipe.model.name)[0], seed,
                                 recipe.model.max_length)
        rec = {"anchor": name, "seed": seed, "train_examples": len(texts), "metrics": metrics,
               "wall_s": time.perf_counter() - t0, "cpu_s": cpu_seconds() - c0}
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(rec, indent=2))
        say(f"   {name} seed {seed}: test accuracy {metrics['test']['accuracy']:.4f}  ({rec['wall_s']:.0f} s)")
        results.append(rec)
    return results


def paired(a: dict[int, float], b: dict[int, float]) -> dict[str, Any]:
    """Paired statistics over the shared seeds, with wins, ties and losses of ``a``."""
    from finetune_cli.metrics.stats import paired_stats

    seeds = sorted(set(a) & set(b))
    return {**paired_stats([a[s] for s in seeds], [b[s] for s in seeds]), "wins": sum(a[s] > b[s] for s in seeds),
            "ties": sum(a[s] == b[s] for s in seeds), "losses": sum(a[s] < b[s] for s in seeds)}
