"""Model-free edits: word deletion and word swap, seeded per row so any chunking gives the same output.

These are the simple baselines the SimCSE paper compares against ("delete one word") and EDA's
random deletion / random swap. Words are whitespace-separated tokens; the edited sentence is joined
with single spaces.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class EditSpec:
    """Which edits to apply, in this order: delete one word, delete words, swap words."""

    delete_one: bool = False
    delete_prob: float = 0.0
    swap_prob: float = 0.0

    def active(self) -> bool:
        return self.delete_one or self.delete_prob > 0 or self.swap_prob > 0


def delete_one_word(words: list[str], rng: random.Random) -> list[str]:
    """Drop one uniformly chosen word (a one-word sentence is left as it is)."""
    if len(words) < 2:
        return list(words)
    i = rng.randrange(len(words))
    return words[:i] + words[i + 1:]


def delete_words(words: list[str], p: float, rng: random.Random) -> list[str]:
    """Drop each word with probability ``p``; if every word would go, keep one at random."""
    if not words or p <= 0:
        return list(words)
    kept = [w for w in words if rng.random() >= p]
    return kept if kept else [words[rng.randrange(len(words))]]


def swap_words(words: list[str], p: float, rng: random.Random) -> list[str]:
    """For each position, with probability ``p``, swap its word with one at another random position."""
    out = list(words)
    if len(out) < 2 or p <= 0:
        return out
    for i in range(len(out)):
        if rng.random() < p:
            j = rng.randrange(len(out) - 1)
            j = j + 1 if j >= i else j  # any position but i
            out[i], out[j] = out[j], out[i]
    return out


def row_rng(seed: int, row: int, variant: int, column: int) -> random.Random:
    """An RNG that depends only on (seed, row, variant, column), not on batching or resume."""
    return random.Random(f"{seed}:{row}:{variant}:{column}")


def edit_text(text: str, spec: EditSpec, rng: random.Random) -> str:
    words = text.split()
    if spec.delete_one:
        words = delete_one_word(words, rng)
    if spec.delete_prob > 0:
        words = delete_words(words, spec.delete_prob, rng)
    if spec.swap_prob > 0:
        words = swap_words(words, spec.swap_prob, rng)
    return " ".join(words)
