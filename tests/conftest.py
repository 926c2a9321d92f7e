"""Shared fixtures: a tiny random BERT (built offline once per session), temp run dirs, data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("FINETUNE_SHARED_DATA", REPO.parent / "shared" / "data"))
QUICKSTART = REPO / "finetune_cli" / "resources" / "quickstart"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A 2-layer, 32-wide random BERT with the embedded model's (real) WordPiece tokenizer."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from finetune_cli.models.loading import embedded_model_path

    out = tmp_path_factory.mktemp("tiny-bert")
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=128)
    BertModel(cfg).save_pretrained(out)
    AutoTokenizer.from_pretrained(embedded_model_path()).save_pretrained(out)
    return out


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("FINETUNE_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
    # Set, then removed: monkeypatch then puts back the state from before the test even when the
    # code under test exports the variable (--data-dir is exported for the run); a delenv of an
    # unset variable records nothing, and the export leaked into later tests' session fixtures.
    monkeypatch.setenv("FINETUNE_DATA_DIR", "")
    monkeypatch.delenv("FINETUNE_DATA_DIR")


@pytest.fixture
def quickstart_data() -> dict[str, str]:
    return {"train": str(QUICKSTART / "train.tsv"), "eval": str(QUICKSTART / "dev.tsv")}


@pytest.fixture
def tiny_recipe(tmp_path, tiny_model_dir, quickstart_data):
    """Overrides for a seconds-long run of the tiny model on the quickstart data."""

    def make(*extra: str) -> list[str]:
        return [
            f"model.name={tiny_model_dir}", "model.max_length=32",
            f"data.train={quickstart_data['train']}", f"data.eval={quickstart_data['eval']}",
            "data.columns.text=sentence", "data.max_train_samples=64",
            "train.batch_size=8", "train.epochs=1", "train.lr=1e-3", "train.log_every=2",
            f"output.dir={tmp_path / 'runs'}", "output.name=tiny", *extra,
        ]

    return make


def shared_data_or_skip(*parts: str) -> Path:
    p = SHARED_DATA.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"shared data not present: {p}")
    return p
