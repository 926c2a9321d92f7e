"""LoRA against full fine-tuning (training speed, peak memory, trainable parameters), and
onnxruntime against torch for ``finetune predict`` (sentences/s), on the embedded MiniLM, CPU.

Speed: both sides of a comparison run in this one process, interleaved (full, LoRA, full, ...; torch,
ONNX, torch, ...), so they share the clock and the machine's load; medians with min-max over the
repeats. Memory: each training side runs a few steps in a fresh child process, which reports its
peak RSS during those steps (``VmHWM``, reset once the model is built) and its rise over the RSS of
the built model (gradients, optimizer state, activations).

    python bench/lora_export.py [--repeats 5] [--steps 6] [--rows 512] [--threads 2]

Training: CE on quickstart reviews, batch 16, max_length 64, AdamW; LoRA r=8 on query/value with the
native head trained (the ``lora`` recipe). Predict: ``run_predict`` over the same TSV of quickstart
sentences into JSONL, batch 64, from a saved classifier folder and from its ``--format onnx`` export.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from finetune_cli.models.loading import (  # noqa: E402
    build_text_model,
    embedded_model_path,
    load_tokenizer,
    save_text_model,
)
from finetune_cli.models.lora import add_lora  # noqa: E402
from finetune_cli.models.text_model import HeadSpec, parameter_counts  # noqa: E402

QUICKSTART = REPO / "finetune_cli" / "resources" / "quickstart"


def sentences(n: int) -> list[str]:
    rows = [r.split("\t")[0] for r in (QUICKSTART / "train.tsv").read_text().splitlines()[1:]]
    return [rows[i % len(rows)] for i in range(n)]


def build(side: str):
    model, tok = build_text_model("embedded", lambda d: HeadSpec(num_labels=2, classifier_dropout=d))
    if side == "lora":
        add_lora(model, 8, 16.0, 0.1, ["query", "value"], "embedded")
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    batch = dict(tok(sentences(16), padding="max_length", truncation=True, max_length=64, return_tensors="pt"))
    labels = torch.arange(16) % 2
    return model.train(), opt, batch, labels


def step(model, opt, batch, labels) -> None:
    loss = torch.nn.functional.cross_entropy(model(batch).logits, labels)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def train_speed(sides: dict, steps: int) -> dict[str, float]:
    out = {}
    for name, (model, opt, batch, labels) in sides.items():
        step(model, opt, batch, labels)  # warm-up
        t = time.perf_counter()
        for _ in range(steps):
            step(model, opt, batch, labels)
        out[name] = steps * 16 / (time.perf_counter() - t)
    return out


def peak_rss(side: str, steps: int, threads: int) -> tuple[float, float]:
    """(peak RSS MiB, MiB above the built model's RSS) while a fresh process trains ``side``
    (a child process: a fork of this one would inherit its memory and torch's thread pools)."""
    import subprocess

    out = subprocess.run([sys.executable, __file__, "--child", side, "--steps", str(steps), "--threads", str(threads)],
                         capture_output=True, text=True, check=True).stdout.split()
    return float(out[-2]), float(out[-1])


def child(side: str, steps: int) -> None:
    """Prints the peak RSS of the training steps alone (the high-water mark is reset after the model is
    built: loading has its own, equal, peak) and its rise over the RSS of the built model."""
    sides = build(side)
    built = _status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # Linux: reset VmHWM to the current RSS
    for _ in range(steps):
        step(*sides)
    peak = _status("VmHWM")
    print(peak, peak - built)


def _status(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) / 1024
    return 0.0


def predict_speed(folders: dict[str, Path], src: Path, out: Path, rows: int) -> dict[str, float]:
    from finetune_cli.pipelines.predict import run_predict
    from finetune_cli.ui import UI

    res = {}
    for name, folder in folders.items():
        t = time.perf_counter()
        run_predict(str(folder), str(src), str(out), UI(quiet=True), device="cpu", batch_size=64)
        res[name] = rows / (time.perf_counter() - t)
    return res


def summary(name: str, values: list[float], unit: str) -> str:
    return f"{name:<22} median {statistics.median(values):8.1f} {unit}  (min {min(values):.1f}, max {max(values):.1f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--child", choices=("full", "lora"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.child:
        return child(a.child, a.steps)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {a.threads} threads, repeats {a.repeats}")

    sides = {"full": build("full"), "lora": build("lora")}
    for name, (model, *_rest) in sides.items():
        trainable, total = parameter_counts(model)
        print(f"{name:<5} trainable parameters {trainable:>11,} of {total:,} ({100 * trainable / total:.2f}%)")
    speeds: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(a.repeats):
        for k, v in train_speed(sides, a.steps).items():
            speeds[k].append(v)
    for k, v in speeds.items():
        print(summary(f"train {k}", v, "sent/s"))
    print(f"train lora / full: {statistics.median(speeds['lora']) / statistics.median(speeds['full']):.2f}x")
    del sides
    for side in ("full", "lora"):
        peaks = [peak_rss(side, 2, a.threads) for _ in range(max(1, a.repeats // 2))]
        print(summary(f"peak RSS {side}", [p for p, _ in peaks], "MiB") + "; above the built model: "
              + f"{statistics.median([d for _, d in peaks]):.0f} MiB")

    from finetune_cli.pipelines.export import run_export
    from finetune_cli.ui import UI

    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        model = build("full")[0].eval()
        save_text_model(model, load_tokenizer(str(embedded_model_path())), t / "torch",
                        id2label={0: "negative", 1: "positive"}, max_length=64)
        run_export(str(t / "torch"), str(t / "onnx"), UI(quiet=True), fmt="onnx")
        (t / "in.tsv").write_text("text\n" + "".join(s + "\n" for s in sentences(a.rows)))
        folders = {"predict torch": t / "torch", "predict onnxruntime": t / "onnx"}
        pred: dict[str, list[float]] = {k: [] for k in folders}
        predict_speed(folders, t / "in.tsv", t / "out.jsonl", a.rows)  # warm-up (tokenizer caches, ORT arenas)
        for _ in range(a.repeats):
            for k, v in predict_speed(folders, t / "in.tsv", t / "out.jsonl", a.rows).items():
                pred[k].append(v)
        for k, v in pred.items():
            print(summary(k, v, "sent/s"))
        ratio = statistics.median(pred["predict onnxruntime"]) / statistics.median(pred["predict torch"])
        print(f"predict onnxruntime / torch: {ratio:.2f}x")


if __name__ == "__main__":
    main()
