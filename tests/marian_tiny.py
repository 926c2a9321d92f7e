"""A tiny random Marian translation model with a real (tiny) SentencePiece tokenizer, built offline.

Used by the augment tests and ``bench/augment_throughput.py``. The SentencePiece model is trained
on the packaged quickstart sentences, so the tokenizer segments English the way a real Marian one
does; the weights are random, so "translations" are random token strings, which is all the
mechanics under test (batching, sampling, seeding, resume) need.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
QUICKSTART = REPO / "finetune_cli" / "resources" / "quickstart"


def corpus_sentences() -> list[str]:
    lines = []
    for name in ("train.tsv", "dev.tsv"):
        rows = (QUICKSTART / name).read_text(encoding="utf-8").splitlines()[1:]
        lines += [r.split("\t")[0] for r in rows if r.strip()]
    return lines


def build_tiny_marian(out: Path, seed: int = 0, d_model: int = 32, layers: int = 1, vocab_size: int = 250,
                      init_std: float = 1.0, eos_bias: float = 3.0) -> Path:
    """Write a Hugging Face Marian folder (config, weights, source/target .spm, vocab.json) to ``out``."""
    import sentencepiece as spm
    import torch
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    text = out / "corpus.txt"
    text.write_text("\n".join(corpus_sentences()) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(out / "sp"), vocab_size=vocab_size, model_type="unigram",
        character_coverage=1.0, bos_id=-1, eos_id=-1, unk_id=0, pad_id=-1, minloglevel=2,
        num_threads=1, hard_vocab_limit=False,
    )
    text.unlink()
    sp = spm.SentencePieceProcessor(model_file=str(out / "sp.model"))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if sp.id_to_piece(i) != "<unk>"]
    # Marian's layout: </s> and <unk> first, <pad> last.
    vocab = {"</s>": 0, "<unk>": 1}
    for p in pieces:
        vocab.setdefault(p, len(vocab))
    vocab["<pad>"] = len(vocab)
    tok_dir = out / "_tok"
    tok_dir.mkdir(exist_ok=True)
    for name in ("source.spm", "target.spm"):
        (tok_dir / name).write_bytes((out / "sp.model").read_bytes())
    (tok_dir / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    for f in ("sp.model", "sp.vocab"):
        (out / f).unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Recommended: pip install sacremoses"
        tok = MarianTokenizer(str(tok_dir / "source.spm"), str(tok_dir / "target.spm"), str(tok_dir / "vocab.json"))
    pad = vocab["<pad>"]
    cfg = MarianConfig(
        vocab_size=len(vocab), d_model=d_model, encoder_layers=layers, decoder_layers=layers,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=2 * d_model,
        decoder_ffn_dim=2 * d_model, max_position_embeddings=256, pad_token_id=pad, eos_token_id=0,
        decoder_start_token_id=pad, forced_eos_token_id=0, share_encoder_decoder_embeddings=True, init_std=init_std,
    )
    torch.manual_seed(seed)
    model = MarianMTModel(cfg)
    # A random model rarely emits </s>; a bias on it makes outputs end at varied lengths, like real ones.
    with torch.no_grad():
        model.final_logits_bias[0, 0] = eos_bias
    model.generation_config.bad_words_ids = [[pad]]
    model.save_pretrained(out)
    tok.save_pretrained(out)
    for f in tok_dir.iterdir():
        f.unlink()
    tok_dir.rmdir()
    return out
