"""Training throughput of `finetune train` against the Hugging Face Trainer and a bare loop, measured fairly.

Runners (each in its own fresh process, so no runner inherits another's caches or thread pools):

- ``finetune``    `finetune train` through its pipeline (length-grouped batches, its defaults).
- ``hf_grouped``  the Trainer with ``train_sampling_strategy="group_by_length"``: the main peer.
- ``hf_default``  the Trainer as it comes (random batches).
- ``bare``        a plain PyTorch loop (random batches, dynamic padding, fused AdamW).
- ``finetune_bf16`` / ``hf_grouped_bf16``: the two above with bf16 autocast (``train.precision=bf16``;
  the Trainer's ``bf16=True``), for CPUs with native bf16 (AVX512-BF16/AMX) and GPUs. Not in the
  default set: each side in the same precision is the like-for-like comparison.
- ``finetune_graphs``: ``finetune_bf16`` with ``train.cuda_graphs=on`` (the step captured per
  padded width and replayed; GPU only); its capture time is reported.
- ``hf_compile_bf16``: ``hf_grouped_bf16`` with ``torch_compile=True``, the setting a Trainer user
  tries for speed; its compile time is inside its clock, as the capture is inside finetune's.

Same model (the embedded all-MiniLM-L6-v2 + a 2-way head), same SST-2 sentences (from
--data-dir / $FINETUNE_DATA_DIR; synthetic sentences when absent), batch 32, max length 64, one
epoch, AdamW at lr 5e-5, weight decay 0.01, clipping at 1.0, no warm-up, no evaluation or saving
during training.

Fairness:
- One clock for everyone, in the worker: ``time.perf_counter`` around the same work, from sentences
  in memory to a trained model in memory (model loading, tokenisation, building the runner,
  training; what each tool does at the end of training, e.g. finetune's final save, counts too).
  The parent also reports each worker's whole-process wall clock (imports and warm-up included).
- A second clock, "ms/step": from the end of optimizer step ``--skip`` to the end of the last step,
  read by a per-step callback in every runner (steady state, start-up excluded).
- Warm-up: before the timed run each worker runs its own runner once on a few batches whose widths
  span the lengths it will see (kernel/primitive selection, allocator, lazy imports), on a fresh model.
- Interleaved order: repeat r runs the runners rotated by r; medians, min-max spread and ratios
  are printed.
- Dev accuracy of every runner's final model with one shared function (outside the clocks), and
  an equal-accuracy check against ``hf_grouped`` (±0.01).

On a GPU (``--device cuda``; the Trainer then runs on it too, and the ``bare`` loop): the bf16
pair is the comparison users make (``--runners finetune_bf16,hf_grouped_bf16``); ``--base`` swaps
the model for a randomly initialised BERT-base-size encoder (12 layers, 768 wide: bert-base's
arithmetic, whose weights cannot be downloaded here) with the embedded model's tokenizer;
``--max-length 128`` is the GPU setting. On CUDA the ms/step clock synchronises the device at its
two readings (step ``--skip`` and the last step), so queued kernels are counted. ``--profile``
profiles each runner's first warm-up run (made long enough) with ``torch.profiler`` over 20 steady
steps, outside the timed run: GPU kernel time per step against wall time per step (the rest is
launch and host work), and where the host time goes (self time per op or CUDA runtime call, and
how often the host waits for the device). Each worker also reports what its warm-up run left in
device memory once it returned (a run must free its model and optimizer state).

``--proxy``: the CPU proxy: a tiny random BERT (2 layers, width 32, the real
tokenizer), where compute is negligible and the per-step overhead of each loop shows; every runner
uses fused AdamW; headline is ms/step.

    python bench/train_throughput.py --data-dir ../shared/data [--n 4000] [--repeats 2]
    python bench/train_throughput.py --data-dir ../shared/data --proxy [--n 8192]
    python bench/train_throughput.py ... --runners finetune --ft train.compile=true   # one variant
    python bench/train_throughput.py ... --runners finetune@../old,finetune      # before/after, interleaved
    python bench/train_throughput.py --data-dir ../shared/data --device cuda --max-length 128 \
        --runners finetune_bf16,hf_grouped_bf16 [--base] [--n 12000] [--profile]        # the GPU bench

``finetune@DIR`` runs the finetune runner from another checkout DIR (e.g. ``git worktree add ../old
COMMIT``) in the same interleaved run, so each engine change is measured against its parent under
the same machine load.

Targets: CPU train >= 1.5x hf_grouped at equal dev accuracy and >= 2.0x hf_default;
proxy ms/step <= 0.7x hf_grouped.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402

BATCH, MAXLEN, LR, WD = 32, 64, 5e-5, 0.01
RUNNERS = ("finetune", "hf_grouped", "hf_default", "bare")
BF16_RUNNERS = ("finetune_bf16", "hf_grouped_bf16", "finetune_graphs", "hf_compile_bf16")
GRAPHS: dict = {}  # the last finetune run's summary["cuda_graphs"] (widths, capture seconds)
REF = "hf_grouped"


# ---- data (parent) ------------------------------------------------------------------------------

def load_sentences(data_dir: str | None, n: int, seed: int = 0):
    if data_dir and (Path(data_dir) / "SST-2" / "train.tsv").is_file():
        rows = [ln.rstrip("\n").split("\t") for ln in open(Path(data_dir) / "SST-2" / "train.tsv", encoding="utf-8")][1:]
        random.Random(seed).shuffle(rows)
        rows = rows[:n]
        dev = [ln.rstrip("\n").split("\t") for ln in open(Path(data_dir) / "SST-2" / "dev.tsv", encoding="utf-8")][1:]
        return [r[0] for r in rows], [int(r[1]) for r in rows], [r[0] for r in dev], [int(r[1]) for r in dev], "SST-2"
    rng = random.Random(seed)
    words = "the a film movie good bad great awful plot acting was is not very quite truly boring fun".split()
    sents = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 40))) for _ in range(n)]
    labels = [int("good" in s or "great" in s) for s in sents]
    return sents, labels, sents[:500], labels[:500], "synthetic"


def warm_subset(sents: list[str], labels: list[int], tok, batches: int = 6) -> tuple[list[str], list[int]]:
    """``batches`` batches of sentences taken at evenly spaced length quantiles: the warm-up run
    sees widths across the whole range the timed run will see (short to max_length)."""
    lens = np.array([len(x) for x in tok(sents, truncation=True, max_length=MAXLEN)["input_ids"]])
    order = np.argsort(lens, kind="stable")
    picks: list[int] = []
    for q in np.linspace(0, 1, batches):
        c = int(q * (len(order) - BATCH))
        picks.extend(order[c:c + BATCH].tolist())
    return [sents[i] for i in picks], [labels[i] for i in picks]


def write_tsv(path: Path, sents: list[str], labels: list[int]) -> None:
    path.write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in zip(sents, labels, strict=True)))


def read_tsv(path: Path) -> tuple[list[str], list[int]]:
    rows = [ln.split("\t") for ln in path.read_text().splitlines()[1:]]
    return [r[0] for r in rows], [int(r[1]) for r in rows]


def build_random_bert(out: Path, base: bool = False) -> Path:
    """The tests' tiny random BERT (2 layers, width 32) with the embedded model's tokenizer;
    ``base``: a random encoder of bert-base's size (12 layers, 768 wide, 3072 inner, 12 heads)."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    from finetune_cli.models.loading import embedded_model_path

    torch.manual_seed(0)
    size = (dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                 max_position_embeddings=512) if base else
            dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                 max_position_embeddings=128))
    BertModel(BertConfig(vocab_size=30522, **size)).save_pretrained(out)
    AutoTokenizer.from_pretrained(embedded_model_path()).save_pretrained(out)
    return out


# ---- runners (worker) ----------------------------------------------------------------------------

class StepClock:
    """perf_counter at the end of optimizer step ``skip`` and at the end of the last step
    (``total``); on CUDA the device is synchronised at those two readings. ``profile``: steps
    ``skip+1 .. skip+profile`` run under ``torch.profiler`` (see :meth:`profile_summary`)."""

    def __init__(self, skip: int, total: int = 0, cuda: bool = False, profile: int = 0):
        self.skip, self.steps, self.t_skip, self.t_last = skip, 0, None, None
        self.total, self.cuda = total, cuda
        self.profile = max(0, min(profile, total - skip - 1)) if profile else 0
        self.prof, self.prof_wall, self.t_prof = None, None, 0.0

    def tick(self) -> None:
        self.steps += 1
        if self.cuda and self.steps in (self.skip, self.total, self.skip + self.profile):
            torch.cuda.synchronize()
        now = time.perf_counter()
        if self.profile and self.steps == self.skip:
            from torch.profiler import ProfilerActivity, profile

            self.prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            self.prof.__enter__()
            self.t_prof = time.perf_counter()
        elif self.profile and self.steps == self.skip + self.profile and self.prof is not None:
            self.prof_wall = time.perf_counter() - self.t_prof
            self.prof.__exit__(None, None, None)
        if self.steps == self.skip:
            self.t_skip = now
        self.t_last = now

    def close(self) -> None:
        if self.prof is not None and self.prof_wall is None:  # training ended inside the window
            self.prof.__exit__(None, None, None)
            self.prof = None

    def profile_summary(self) -> dict | None:
        """Per profiled step: wall ms, GPU kernel ms (the sum of kernel durations) and their ratio,
        with the five kernels that took longest in all."""
        if self.prof is None or self.prof_wall is None:
            return None
        kernels = [e for e in self.prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        busy = sum(e.device_time for e in kernels) / 1e3  # device_time is in microseconds
        top: dict[str, float] = {}
        for e in kernels:
            top[e.name] = top.get(e.name, 0.0) + e.device_time / 1e3
        wall = self.prof_wall * 1e3
        # The host side: where the step's wall time goes on the CPU (self time of each op or runtime
        # call, ms per step), and how often the host waits for the device.
        host = [(e.self_cpu_time_total / 1e3 / self.profile, e.count / self.profile, e.key)
                for e in self.prof.key_averages() if not e.key.startswith("ProfilerStep")]
        waits = sum(c for _, c, k in host if k in ("cudaStreamSynchronize", "cudaDeviceSynchronize",
                                                   "cudaEventSynchronize", "cudaMemcpy"))
        return {"wall_ms_per_step": wall / self.profile, "kernel_ms_per_step": busy / self.profile,
                "kernel_share": busy / wall, "kernels_per_step": len(kernels) / self.profile,
                "top": sorted(((round(v / self.profile, 3), k[:60]) for k, v in top.items()), reverse=True)[:5],
                "host_top": [(round(ms, 3), round(c, 1), k[:50]) for ms, c, k in sorted(host, reverse=True)[:8]],
                "host_syncs_per_step": waits}

    def ms_per_step(self) -> float | None:
        if self.t_skip is None or self.steps <= self.skip:
            return None
        return (self.t_last - self.t_skip) / (self.steps - self.skip) * 1e3


def accuracy(model, tok, sents, labels, hf: bool) -> float:
    model.eval()
    device = next(model.parameters()).device
    correct = 0
    with torch.inference_mode():
        for i in range(0, len(sents), 128):
            enc = tok(sents[i:i + 128], truncation=True, max_length=MAXLEN, padding=True, return_tensors="pt").to(device)
            logits = (model(**enc).logits if hf else model(dict(enc)).logits).float().cpu()
            correct += (logits.argmax(-1) == torch.tensor(labels[i:i + 128])).sum().item()
    return correct / len(sents)


def run_finetune(work: Path, name: str, train_file: Path, model: str, clock: StepClock | None, extra: list[str],
                 device: str = "cpu"):
    try:  # this release; a `finetune@DIR` checkout of an older one takes a recipe
        from finetune_cli.pipelines.recipes import load_plan as load_recipe
    except ImportError:  # pragma: no cover
        from finetune_cli.pipelines.recipes import load_recipe
    from finetune_cli.models.loading import load_text_model
    from finetune_cli.pipelines.train import run_train
    from finetune_cli.ui import UI

    ov = [f"model.name={model}", f"model.max_length={MAXLEN}", f"data.train={train_file}",
          "data.columns.text=sentence", f"train.batch_size={BATCH}", "train.epochs=1", f"train.lr={LR}",
          f"train.weight_decay={WD}", "train.warmup_ratio=0.0", "train.max_grad_norm=1.0", "train.seed=0",
          f"output.dir={work}", f"output.name={name}", *extra]
    cbs = [lambda trainer, state: clock.tick()] if clock else []
    out = run_train(load_recipe(None, ov), UI(quiet=True), device=device, overwrite=True, callbacks=cbs)
    GRAPHS.update(out.summary.get("cuda_graphs") or {})
    m, tok, _ = load_text_model(str(out.run_dir / "final"))
    return m.to(device), tok, False


def run_hf(work: Path, sents, labels, model_path: str, clock: StepClock | None, grouped: bool,
           bf16: bool = False, device: str = "cpu", compile: bool = False):
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    tok = AutoTokenizer.from_pretrained(model_path)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(model_path, num_labels=2)
    # A plain list of tokenised rows: what `datasets.map(tokenize)` gives, without needing `datasets`.
    enc = tok(sents, truncation=True, max_length=MAXLEN)
    ds = [{**{k: enc[k][i] for k in enc}, "labels": y} for i, y in enumerate(labels)]
    args = TrainingArguments(
        output_dir=str(work / "hf"), per_device_train_batch_size=BATCH, num_train_epochs=1, learning_rate=LR,
        weight_decay=WD, report_to="none", save_strategy="no", logging_strategy="no", eval_strategy="no",
        use_cpu=device == "cpu", max_grad_norm=1.0, seed=0, disable_tqdm=True, optim="adamw_torch_fused",
        train_sampling_strategy="group_by_length" if grouped else "random", bf16=bf16, torch_compile=compile)

    class Tick(TrainerCallback):
        def on_step_end(self, *a, **k):
            if clock:
                clock.tick()

    Trainer(model=model, args=args, train_dataset=ds, data_collator=DataCollatorWithPadding(tok),
            callbacks=[Tick()]).train()
    return model, tok, True


def run_bare(sents, labels, model_path: str, clock: StepClock | None, device: str = "cpu"):
    """A plain loop: random batches, dynamic padding, fused AdamW, clipping."""
    from finetune_cli.models import HeadSpec, load_text_model

    torch.manual_seed(0)
    model, tok, _ = load_text_model(model_path, HeadSpec(pooling="mean", num_labels=2))
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD, fused=True)
    enc = tok(sents, truncation=True, max_length=MAXLEN)
    order = np.random.default_rng(0).permutation(len(sents))
    for i in range(0, len(order), BATCH):
        idx = order[i:i + BATCH].tolist()
        feats = tok.pad({k: [enc[k][j] for j in idx] for k in ("input_ids", "token_type_ids", "attention_mask")},
                        return_tensors="pt").to(device)
        y = torch.tensor([labels[j] for j in idx], device=device)
        loss = torch.nn.functional.cross_entropy(model(dict(feats)).logits.float(), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if clock:
            clock.tick()
    return model, tok, False


def worker(a) -> None:
    global MAXLEN
    MAXLEN = a.max_length
    work = Path(a.work)
    sents, labels = read_tsv(work / "train.tsv")
    wsents, wlabels = read_tsv(work / "warm.tsv")
    warm_file = work / "warm.tsv"
    if a.profile_steps:  # the warm-up run is profiled: long enough for the window after --skip steps
        keep = (a.skip + a.profile_steps + 2) * BATCH
        wsents, wlabels = wsents + sents[:keep], wlabels + labels[:keep]
        warm_file = work / f"warm-profile-{a.worker}.tsv"
        write_tsv(warm_file, wsents, wlabels)
    dev, dev_labels = read_tsv(work / "dev.tsv")
    model_path = a.model
    ft_model = model_path if model_path != "embedded" else "embedded"
    if model_path == "embedded":
        from finetune_cli.models.loading import embedded_model_path

        model_path = str(embedded_model_path())
    tmp = Path(tempfile.mkdtemp(dir=work, prefix=f"{a.worker}-"))
    os.environ["FINETUNE_CACHE"] = str(tmp / "cache")  # a fresh token cache: finetune tokenises like the others

    def once(ss, ys, file, clock, name):
        if a.worker in ("finetune", "finetune_bf16", "finetune_graphs"):
            extra = {"finetune": [], "finetune_bf16": ["train.precision=bf16"],
                     "finetune_graphs": ["train.precision=bf16", "train.cuda_graphs=on"]}[a.worker]
            return run_finetune(tmp, name, file, ft_model, clock, [*a.ft, *extra], a.device)
        if a.worker in ("hf_grouped", "hf_default", "hf_grouped_bf16", "hf_compile_bf16"):
            return run_hf(tmp / name, ss, ys, model_path, clock, a.worker != "hf_default",
                          bf16=a.worker.endswith("_bf16"), device=a.device, compile=a.worker == "hf_compile_bf16")
        return run_bare(ss, ys, model_path, clock, a.device)

    cuda = a.device.startswith("cuda")
    # The warm-up run (and, with --profile, the profile: outside the timed run, on the same runner).
    warm_clock = (StepClock(a.skip, total=-(-len(wsents) // BATCH), cuda=cuda, profile=a.profile_steps)
                  if a.profile_steps else None)
    t0 = time.perf_counter()
    once(wsents, wlabels, warm_file, warm_clock, "warm")
    warm_s = time.perf_counter() - t0
    if warm_clock is not None:
        warm_clock.close()
    # What the warm-up run left in device memory once it returned (its model and optimizer state
    # should be gone: the timed run trains beside whatever is left).
    left_gb = torch.cuda.memory_allocated() / 2**30 if cuda else None
    clock = StepClock(a.skip, total=-(-len(sents) // BATCH), cuda=cuda)
    t0 = time.perf_counter()
    model, tok, hf = once(sents, labels, work / "train.tsv", clock, "timed")
    train_s = time.perf_counter() - t0
    clock.close()
    acc = accuracy(model, tok, dev, dev_labels, hf) if a.accuracy else None
    mem = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    where = f"{a.device} {torch.cuda.get_device_name()}" if cuda else f"cpu, torch threads {torch.get_num_threads()}"
    print(json.dumps({"train_s": train_s, "warm_s": warm_s, "steps": clock.steps, "ms_per_step": clock.ms_per_step(),
                      "accuracy": acc, "threads": torch.get_num_threads(), "device": where, "peak_gb": mem,
                      "left_after_warm_gb": left_gb,
                      "capture_s": GRAPHS.get("capture_seconds"), "widths": GRAPHS.get("widths"),
                      "profile": warm_clock.profile_summary() if warm_clock is not None else None}))


# ---- parent ------------------------------------------------------------------------------------------

def spread(xs: list[float], fmt: str = "{:.1f}") -> str:
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def main() -> None:
    global MAXLEN
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default=os.environ.get("FINETUNE_DATA_DIR"))
    ap.add_argument("--n", type=int, default=None, help="training sentences, one epoch (default 4000; proxy 8192)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--runners", default=",".join(RUNNERS), help=f"comma list of {', '.join(RUNNERS + BF16_RUNNERS)}")
    ap.add_argument("--proxy", action="store_true", help="tiny random BERT, ms/step (per-step overhead)")
    ap.add_argument("--ft", action="append", default=[], metavar="KEY=VALUE",
                    help="extra recipe override for the finetune runner (repeatable)")
    ap.add_argument("--skip", type=int, default=10, help="steps before the ms/step clock starts")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N] (every runner on it)")
    ap.add_argument("--max-length", type=int, default=MAXLEN, help=f"tokens per sentence at most (default {MAXLEN})")
    ap.add_argument("--base", action="store_true", help="a random BERT-base-size encoder instead of MiniLM")
    ap.add_argument("--profile", action="store_true",
                    help="profile each runner's first warm-up run (20 steps after --skip) with torch.profiler")
    ap.add_argument("--profile-steps", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--worker", choices=RUNNERS + BF16_RUNNERS, help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="embedded", help=argparse.SUPPRESS)
    ap.add_argument("--accuracy", type=int, default=1, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a)

    MAXLEN = a.max_length
    runners = [r.strip() for r in a.runners.split(",") if r.strip()]
    label = {r: (f"finetune@{Path(r.partition('@')[2]).resolve().name}" if "@" in r else r) for r in runners}
    n = a.n or (8192 if a.proxy else 4000)
    sents, labels, dev, dev_labels, source = load_sentences(a.data_dir, n)
    with tempfile.TemporaryDirectory() as t:
        work = Path(t)
        model = (str(build_random_bert(work / "tiny")) if a.proxy else
                 str(build_random_bert(work / "base", base=True)) if a.base else "embedded")
        from transformers import AutoTokenizer

        from finetune_cli.models.loading import embedded_model_path

        tok = AutoTokenizer.from_pretrained(embedded_model_path())
        write_tsv(work / "train.tsv", sents, labels)
        write_tsv(work / "warm.tsv", *warm_subset(sents, labels, tok))
        write_tsv(work / "dev.tsv", dev, dev_labels)
        results: dict[str, list[dict]] = {label[r]: [] for r in runners}
        profiles: dict[str, dict] = {}
        failed: set[str] = set()

        def run_worker(r: str, profile_steps: int = 0) -> dict | None:
            name, _, root = r.partition("@")
            env = dict(os.environ, PYTHONPATH=str(Path(root).resolve())) if root else None
            cmd = [sys.executable, __file__, "--worker", name, "--work", str(work), "--model", model,
                   "--skip", str(a.skip), "--accuracy", "0" if a.proxy else "1", "--device",
                   a.device, "--max-length", str(a.max_length), "--profile-steps", str(profile_steps),
                   *[x for o in a.ft for x in ("--ft", o)]]
            t0 = time.perf_counter()
            p = subprocess.run(cmd, capture_output=True, text=True, env=env)
            wall = time.perf_counter() - t0
            if p.returncode != 0:  # the others still run: one broken runner must not cost the rest
                print(f"runner {r} failed (exit {p.returncode}); left out from here on:\n{p.stderr[-4000:]}",
                      file=sys.stderr, flush=True)
                failed.add(r)
                return None
            res = json.loads(p.stdout.strip().splitlines()[-1])
            res["process_s"] = wall
            return res

        for rep in range(a.repeats):
            order = runners[rep % len(runners):] + runners[:rep % len(runners)]
            for r in order:
                # --profile: each runner's first worker profiles its warm-up run (outside its clocks)
                res = run_worker(r, profile_steps=20 if a.profile and rep == 0 else 0) if r not in failed else None
                if res is None:
                    continue
                results[label[r]].append(res)
                if res.get("profile"):
                    profiles[label[r]] = res["profile"]
                acc = f"{res['accuracy']:.3f}" if res["accuracy"] is not None else "-"
                mem = (f"  peak {res['peak_gb']:.2f} GiB (warm-up left {res['left_after_warm_gb']:.2f})"
                       if res.get("peak_gb") is not None else "")
                print(f"  repeat {rep + 1} {label[r]:<20} train {res['train_s']:7.2f}s  {res['ms_per_step'] or 0:8.2f} ms/step"
                      f"  process {res['process_s']:6.1f}s  dev acc {acc}{mem}", file=sys.stderr, flush=True)
        results = {r: rs for r, rs in results.items() if rs}
        if not results:
            sys.exit("every runner failed")

    med = {r: {"sent_per_s": statistics.median(n / x["train_s"] for x in rs),
               "ms_per_step": statistics.median(x["ms_per_step"] for x in rs),
               "accuracy": statistics.median(x["accuracy"] for x in rs) if rs[0]["accuracy"] is not None else None}
           for r, rs in results.items()}
    first = next(iter(results.values()))[0]
    what = "tiny random BERT (proxy)" if a.proxy else "random BERT-base-size encoder" if a.base else "embedded MiniLM"
    print(f"\ndata: {source}, {n} sentences, batch {BATCH}, max_length {MAXLEN}, {what}, "
          f"{first.get('device') or 'cpu, torch threads ' + str(first['threads'])}, {a.repeats} interleaved repeats; "
          f"{time.strftime('%Y-%m-%d')}; median (min-max)", file=sys.stderr)
    if a.ft:
        print(f"finetune overrides: {' '.join(a.ft)}", file=sys.stderr)
    gpu = first.get("peak_gb") is not None
    print(f"{'runner':<22}{'sent/s (end to end)':>24}{'ms/step (steady)':>24}{'process s':>20}{'dev acc':>9}"
          + (f"{'peak GiB':>10}" if gpu else ""), file=sys.stderr)
    for r, rs in results.items():
        acc = f"{med[r]['accuracy']:.3f}" if med[r]["accuracy"] is not None else "-"
        print(f"{r:<22}{spread([n / x['train_s'] for x in rs]):>24}{spread([x['ms_per_step'] for x in rs], '{:.2f}'):>24}"
              f"{spread([x['process_s'] for x in rs]):>20}{acc:>9}"
              + (f"{statistics.median(x['peak_gb'] for x in rs):>10.2f}" if gpu else ""), file=sys.stderr)
    for r, pr in profiles.items():
        if pr:
            print(f"profile {r:<20}: {pr['wall_ms_per_step']:.2f} ms/step wall, {pr['kernel_ms_per_step']:.2f} ms of "
                  f"GPU kernels ({pr['kernel_share']:.0%} busy), {pr['kernels_per_step']:.0f} kernels/step; top: "
                  + "; ".join(f"{k} {v:.2f}" for v, k in pr["top"][:3]), file=sys.stderr)
            print(f"  host {r:<17}: {pr['host_syncs_per_step']:.1f} waits for the device/step; self ms/step (calls): "
                  + "; ".join(f"{k} {ms:.2f} ({c:g})" for ms, c, k in pr["host_top"][:6]), file=sys.stderr)
    ratios = {}
    if "finetune" in med:
        for peer in ("hf_grouped", "hf_default", "bare", *[x for x in med if x.startswith("finetune@")]):
            if peer in med:
                ratios[f"sent_per_s_vs_{peer}"] = med["finetune"]["sent_per_s"] / med[peer]["sent_per_s"]
                ratios[f"ms_per_step_vs_{peer}"] = med["finetune"]["ms_per_step"] / med[peer]["ms_per_step"]
                print(f"finetune vs {peer:<20}: {ratios[f'sent_per_s_vs_{peer}']:.2f}x sent/s, "
                      f"{ratios[f'ms_per_step_vs_{peer}']:.2f}x ms/step", file=sys.stderr)
        if "hf_grouped" in med and med["finetune"]["accuracy"] is not None:
            d = med["finetune"]["accuracy"] - med["hf_grouped"]["accuracy"]
            print(f"equal dev accuracy (±0.01 of hf_grouped): {'yes' if abs(d) <= 0.01 else 'NO'} ({d:+.3f})",
                  file=sys.stderr)
    if "finetune_bf16" in med and "hf_grouped_bf16" in med:  # also when only the bf16 pair runs
        for key in ("sent_per_s", "ms_per_step"):
            ratios[f"bf16_{key}_vs_hf_grouped_bf16"] = med["finetune_bf16"][key] / med["hf_grouped_bf16"][key]
        print(f"finetune_bf16 vs hf_grouped_bf16: {ratios['bf16_sent_per_s_vs_hf_grouped_bf16']:.2f}x sent/s, "
              f"{ratios['bf16_ms_per_step_vs_hf_grouped_bf16']:.2f}x ms/step", file=sys.stderr)
    for r in ("finetune_graphs", "finetune_bf16"):
        for peer in ("hf_grouped_bf16", "hf_compile_bf16", "finetune_bf16"):
            if r in med and peer in med and r != peer and (r, peer) != ("finetune_bf16", "hf_grouped_bf16"):
                for key in ("sent_per_s", "ms_per_step"):
                    ratios[f"{r}_{key}_vs_{peer}"] = med[r][key] / med[peer][key]
                print(f"{r} vs {peer}: {ratios[f'{r}_sent_per_s_vs_{peer}']:.2f}x sent/s, "
                      f"{ratios[f'{r}_ms_per_step_vs_{peer}']:.2f}x ms/step", file=sys.stderr)
    for r, rs in results.items():
        if rs and rs[0].get("capture_s") is not None:
            print(f"{r}: widths {rs[0]['widths']}, capture {spread([x['capture_s'] for x in rs], '{:.2f}')} s",
                  file=sys.stderr)
    if a.json:
        print(json.dumps({"source": source, "n": n, "proxy": a.proxy, "ft_overrides": a.ft, "results": results,
                          "medians": med, "ratios": ratios, "profiles": profiles}))


if __name__ == "__main__":
    main()
