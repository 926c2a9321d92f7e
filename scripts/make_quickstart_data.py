"""Write the quickstart data set shipped in finetune_cli/resources/quickstart/.

A small, balanced sentiment task (product and service reviews) composed from this project's own
word lists and templates, so the quickstart needs no download. Deterministic: rerunning this
script rewrites the same files.

    python scripts/make_quickstart_data.py
"""

from __future__ import annotations

import random
from pathlib import Path

SUBJECTS = ["the coffee grinder", "this backpack", "the hotel room", "our waiter", "the delivery", "the new update",
            "this phone case", "the rental car", "the customer service", "the headphones", "the pizza",
            "the yoga class", "the train ride", "this novel", "the kitchen knife", "the campsite", "the printer",
            "the museum tour", "the running shoes", "the hair salon", "this board game", "the laptop charger",
            "the bakery", "the plumber", "the concert", "the app", "the mattress", "the tent", "the bike shop",
            "the dentist"]
POS = ["works perfectly", "exceeded every expectation", "was a real delight", "is worth every penny",
       "made my week", "felt sturdy and well made", "arrived early and intact", "was friendly and quick",
       "is simply wonderful", "did exactly what it promised", "was spotless", "kept us smiling all evening",
       "is the best purchase I made this year", "was comfortable from day one", "runs smooth and quiet"]
NEG = ["broke after two days", "was a complete waste of money", "arrived late and damaged", "is painfully slow",
       "was rude and dismissive", "smelled awful", "stopped working within a week", "was overpriced and bland",
       "fell apart immediately", "never did what it promised", "was filthy", "left us angry and tired",
       "is the worst purchase I made this year", "hurt my back every night", "makes a horrible grinding noise"]
OPENERS = ["", "Honestly, ", "To be fair, ", "After a month, ", "I have to say ", "Well, ", "Frankly, ",
           "In short, ", "Overall, ", "Surprisingly, "]
CLOSERS_POS = ["", " I would buy it again.", " Highly recommended.", " Five stars.", " We will be back.",
               " Thank you!", " Love it."]
CLOSERS_NEG = ["", " I want a refund.", " Avoid it.", " One star.", " Never again.", " So disappointing.",
               " Do not bother."]


def make(rng: random.Random, n_per_class: int, subjects: list[str]) -> list[tuple[str, int]]:
    rows = set()
    while len(rows) < 2 * n_per_class:
        label = len(rows) % 2
        subj = rng.choice(subjects)
        pred = rng.choice(POS if label else NEG)
        closer = rng.choice(CLOSERS_POS if label else CLOSERS_NEG)
        opener = rng.choice(OPENERS)
        s = f"{opener}{subj} {pred}.{closer}"
        rows.add((s[0].upper() + s[1:], label))
    out = sorted(rows)
    rng.shuffle(out)
    return out


def main() -> None:
    rng = random.Random(20261122)
    subjects = SUBJECTS[:]
    rng.shuffle(subjects)
    # Dev subjects are held out from training so dev measures more than memorised phrases.
    train = make(rng, 150, subjects[:24])
    dev = make(rng, 50, subjects[24:])
    out = Path(__file__).resolve().parent.parent / "finetune_cli" / "resources" / "quickstart"
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train.tsv", train), ("dev.tsv", dev)):
        with (out / name).open("w", encoding="utf-8") as f:
            f.write("sentence\tlabel\n")
            for s, y in rows:
                f.write(f"{s}\t{'positive' if y else 'negative'}\n")
        print(f"wrote {len(rows)} rows to {out / name}")


if __name__ == "__main__":
    main()
