"""(anchor, positive, hard negative) triplets from NLI rows, as supervised SimCSE trains on.

For every premise, each entailment hypothesis becomes a positive and is paired with a
contradiction hypothesis of the same premise (taken in turn when there are several); premises
with no entailment or no contradiction are dropped. This is how the SimCSE authors built
``nli_for_simcse.csv`` (sent0 = premise, sent1 = entailment, hard_neg = contradiction).
"""

from __future__ import annotations

from finetune_cli.data.sources import Table
from finetune_cli.errors import DataError

ENTAIL = {"entailment", "0"}
CONTRA = {"contradiction", "2"}


def nli_triplets(t: Table) -> Table:
    """``t`` has ``text`` (premise), ``text_pair`` (hypothesis) and raw ``label`` columns; labels
    are ``entailment``/``contradiction`` (any case) or the hub's ids 0/2. Returns a table with
    ``text``, ``text_pair`` and ``hard_neg``, in the order premises first appear."""
    for c in ("text", "text_pair", "label"):
        if c not in t.columns:
            raise DataError(f"data.nli_triplets needs `{c}` in {t.source} (premise -> text, hypothesis -> "
                            f"text_pair, label -> label)")
    groups: dict[str, tuple[list[str], list[str], int]] = {}
    for i, (p, h, lab) in enumerate(zip(t.columns["text"], t.columns["text_pair"], t.columns["label"], strict=True)):
        key = str(p).strip()
        g = groups.setdefault(key, ([], [], t.row(i)))
        lab = str(lab).strip().lower()
        if lab in ENTAIL:
            g[0].append(str(h).strip())
        elif lab in CONTRA:
            g[1].append(str(h).strip())
    a, pos, neg, rows = [], [], [], []
    for prem, (ent, con, row) in groups.items():
        if not ent or not con:
            continue
        for k, e in enumerate(ent):
            a.append(prem)
            pos.append(e)
            neg.append(con[k % len(con)])
            rows.append(row)
    if not a:
        raise DataError(f"no (premise, entailment, contradiction) triplet could be built from {t.source}: "
                        f"labels must be entailment/contradiction (or 0/2)")
    return Table({"text": a, "text_pair": pos, "hard_neg": neg}, t.source, row_ids=rows)
