"""Ad-hoc step-time check of scl and core_tuning against ce (same model, same batch, one run).

PYTHONPATH=$PWD HF_HUB_OFFLINE=1 python notes/issue-4-contrastive-overhead.py
"""

import statistics
import time

import torch

from finetune_cli.data.sources import read_file
from finetune_cli.models import HeadSpec
from finetune_cli.models.loading import embedded_model_path, load_text_model
from finetune_cli.objectives import build

torch.manual_seed(0)
torch.set_num_threads(2)
t = read_file("finetune_cli/resources/quickstart/train.tsv", {"text": "sentence", "label": "label"}, "tsv", "auto")
model, tok, _ = load_text_model(str(embedded_model_path()), HeadSpec(num_labels=2, projection=True))
B = 32
feats = dict(tok(t.columns["text"][:B], padding=True, truncation=True, max_length=64, return_tensors="pt"))
labels = torch.tensor([0 if v == "negative" else 1 for v in t.columns["label"][:B]])
batch = {"features": [feats], "labels": labels}
objs = {"ce": build("ce", {}), "scl": build("scl", {}), "core_tuning": build("core_tuning", {})}
opt = torch.optim.AdamW(model.parameters(), lr=1e-6)


def step(o):
    out = o(model, batch)
    out["loss"].backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


for o in objs.values():
    for _ in range(2):
        step(o)
times = {k: [] for k in objs}
for _ in range(6):  # interleaved rounds: machine drift hits every objective alike
    for k, o in objs.items():
        t0 = time.perf_counter()
        step(o)
        times[k].append(time.perf_counter() - t0)
med = {k: statistics.median(v) for k, v in times.items()}
for k in objs:
    print(f"{k:12s} {med[k] * 1000:8.1f} ms/step  {med[k] / med['ce']:.3f}x CE")
