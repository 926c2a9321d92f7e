"""The GPU tier (``make test-gpu``): the CUDA paths on a real GPU, through the real CLI where the
claim is about the CLI. Every test here is marked ``gpu`` and skipped where torch sees no CUDA
device, so ``make test`` (CI, CPU machines) skips them and never fails on them.

What it checks: train -> eval -> predict -> embed on CUDA with bf16 autocast (``precision: auto``);
the device name and peak GPU memory in the progress line and ``summary.json``; a resume on CUDA
against an uninterrupted run; ``train.compile``; bf16 inference against fp32 (labels on >= 99.5%
of rows); running out of GPU memory as one line naming the batch size (exit 3), not a traceback.

``FINETUNE_GPU_REPORT=FILE`` appends what each test measured (one JSON object a line) to FILE.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "finetune_cli" / "resources" / "quickstart"

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the GPU tier: make test-gpu)"),
]


def report(**kv) -> None:
    path = os.environ.get("FINETUNE_GPU_REPORT")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(kv) + "\n")


def cli(*args: str, prelude: str = "") -> subprocess.CompletedProcess:
    """``finetune ARGS`` in a fresh process (``prelude``: Python run before the CLI starts)."""
    code = f"{prelude}\nfrom finetune_cli.cli.main import app\napp(prog_name='finetune')"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                          timeout=600)


def ok(p: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert p.returncode == 0, p.stderr[-3000:]
    return p


def error_lines(p: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]


def rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.fixture(scope="module")
def texts(tmp_path_factory) -> Path:
    """The quickstart's 400 reviews (train + dev), one table: what predict and embed read."""
    out = tmp_path_factory.mktemp("gpu-data") / "texts.tsv"
    lines = (QUICKSTART / "train.tsv").read_text().splitlines()
    lines += (QUICKSTART / "dev.tsv").read_text().splitlines()[1:]
    out.write_text("\n".join(lines) + "\n")
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The quickstart recipe (embedded MiniLM, 3 epochs) trained on cuda through the CLI."""
    runs = tmp_path_factory.mktemp("gpu-runs")
    p = ok(cli("train", "-r", "quickstart", "--device", "cuda", f"output.dir={runs}"))
    return runs / "quickstart", p


def test_train_on_cuda_in_bf16_shows_the_device_and_its_memory(trained):
    run, p = trained
    name = torch.cuda.get_device_name(0)
    assert f"cuda:0 {name}" in p.stderr + p.stdout  # the progress line names the GPU
    s = json.loads((run / "summary.json").read_text())
    assert s["device"].startswith("cuda") and s["device_name"] == f"cuda:0 {name}"
    assert s["precision"] == ("bf16" if torch.cuda.is_bf16_supported() else "no")
    assert 0.05 < s["gpu_mem_peak_gb"] < torch.cuda.get_device_properties(0).total_memory / 2**30
    mem = [r["gpu_mem_peak_gb"] for r in rows(run / "metrics.jsonl") if "gpu_mem_peak_gb" in r]
    assert mem and all(m > 0 for m in mem)
    report(test="train", device=s["device_name"], precision=s["precision"], peak_gb=s["gpu_mem_peak_gb"],
           final_eval=s.get("final_eval"), samples_per_s=s.get("samples_per_s"))


def test_eval_predict_and_embed_on_cuda_agree_with_fp32(trained, texts, tmp_path):
    run, _ = trained
    res = json.loads(ok(cli("eval", str(run), "--device", "cuda", "--json", "-q")).stdout)
    acc = res["metrics"]["accuracy"]
    assert acc >= 0.75  # the quickstart's 100 dev reviews; it reaches ~0.85-0.9 on CPU
    res32 = json.loads(ok(cli("eval", str(run), "--device", "cuda", "--precision", "fp32", "--json", "-q")).stdout)
    acc32 = res32["metrics"]["accuracy"]
    assert abs(acc - acc32) <= 0.02

    out = {}
    for prec in ("bf16", "fp32"):
        dest = tmp_path / f"pred-{prec}.jsonl"
        ok(cli("predict", str(run), "-i", str(texts), "-o", str(dest), "-c", "sentence", "--device", "cuda",
               "--precision", prec, "-q"))
        out[prec] = [r["pred_label"] for r in rows(dest)]
    n = len(out["fp32"])
    assert n == 400
    agree = sum(a == b for a, b in zip(out["bf16"], out["fp32"], strict=True)) / n
    assert agree >= 0.995, agree

    emb = {}
    for prec in ("bf16", "fp32"):
        dest = tmp_path / f"emb-{prec}.npy"
        ok(cli("embed", "embedded", str(texts), "-o", str(dest), "-c", "sentence", "--device", "cuda",
               "--precision", prec, "-q"))
        emb[prec] = np.load(dest)
    a, b = emb["bf16"], emb["fp32"]
    assert a.shape == b.shape == (400, 384)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cos.min() >= 0.99, cos.min()
    report(test="eval_predict_embed", eval_accuracy_bf16=acc, eval_accuracy_fp32=acc32, label_agreement=agree,
           embed_cos_min=float(cos.min()), embed_cos_median=float(np.median(cos)))


def _max_diff(a: Path, b: Path) -> float:
    from safetensors.torch import load_file

    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys()
    return max((wa[k].float() - wb[k].float()).abs().max().item() for k in wa)


def test_resume_on_cuda_matches_an_uninterrupted_run(tmp_path):
    """A crash at step 7 and a rerun (resume from checkpoint-6) against an uninterrupted run. The
    GPU's own run-to-run spread is measured too (a second uninterrupted run): bf16 attention and
    embedding backward kernels use atomics, so two uninterrupted runs may already differ in the
    last bits. The resumed run must be bit-identical where two plain runs are, and otherwise no
    further from the reference than the plain rerun is (x10, the chaotic growth of last-bit noise)."""
    from finetune_cli.pipelines.recipes import load_plan
    from finetune_cli.pipelines.train import run_train
    from finetune_cli.ui import UI

    base = ["model.name=embedded", "model.max_length=64", f"data.train={QUICKSTART / 'train.tsv'}",
            f"data.eval={QUICKSTART / 'dev.tsv'}", "data.columns.text=sentence", "train.batch_size=16",
            "train.max_steps=14", "train.save_every=3", "train.eval_every=7", "train.grad_accum=2",
            "train.lr=5e-5", "output.name=r"]

    def train(d, callbacks=()):
        return run_train(load_plan(None, [*base, f"output.dir={tmp_path / d}"]), UI(quiet=True), device="cuda",
                         callbacks=callbacks)

    ref, again = train("ref"), train("again")

    def crash(trainer, state):
        if state.step == 7:
            raise RuntimeError("simulated crash")

    with pytest.raises(RuntimeError):
        train("cut", callbacks=[crash])
    resumed = train("cut")
    assert resumed.resumed_from is not None and resumed.resumed_from.name == "checkpoint-6"
    assert resumed.summary["steps"] == ref.summary["steps"] == 14
    noise = _max_diff(ref.run_dir / "final", again.run_dir / "final")
    cut = _max_diff(ref.run_dir / "final", resumed.run_dir / "final")
    report(test="resume", max_abs_diff_rerun=noise, max_abs_diff_resumed=cut,
           eval_ref=ref.summary["final_eval"], eval_resumed=resumed.summary["final_eval"])
    if noise == 0.0:
        assert cut == 0.0
    else:
        assert cut <= 10 * noise, (cut, noise)
        acc = ref.summary["final_eval"]["accuracy"], resumed.summary["final_eval"]["accuracy"]
        assert abs(acc[0] - acc[1]) <= 0.03, acc


def _long_reviews(path: Path, n: int) -> Path:
    words = "the film was good bad long slow warm funny dull great awful plot acting music cast".split()
    rng = np.random.default_rng(0)
    lines = ["sentence\tlabel"] + [" ".join(rng.choice(words, 300)) + f"\t{i % 2}" for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


LIMIT = "import torch; torch.cuda.set_per_process_memory_fraction({:.4f})"  # ~2 GiB of the card


def _fraction(gib: float) -> float:
    return gib * 2**30 / torch.cuda.get_device_properties(0).total_memory


@pytest.mark.parametrize("graphs", ["off", "on"])
def test_out_of_memory_in_training_is_one_line_naming_the_batch_size(tmp_path, graphs):
    """Also with the step captured (``train.cuda_graphs=on``): the memory runs out in the capture's
    warm-up or the capture itself, and the line is the same."""
    data = _long_reviews(tmp_path / "long.tsv", 2048)
    p = cli("train", "-r", "quickstart", "--device", "cuda", "-q", f"data.train={data}", "data.eval=null",
            "train.batch_size=2048", "model.max_length=256", "train.epochs=1", f"output.dir={tmp_path / 'runs'}",
            f"train.cuda_graphs={graphs}", prelude=LIMIT.format(_fraction(2.0)))
    assert p.returncode == 3, p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    errs = error_lines(p)
    assert len(errs) == 1 and "out of memory" in errs[0] and "train.batch_size=2048" in errs[0], p.stderr[-2000:]
    report(test=f"oom_train_graphs_{graphs}", rc=p.returncode, line=errs[0])


def test_out_of_memory_in_predict_is_one_line_naming_the_batch_size(trained, tmp_path):
    run, _ = trained
    data = _long_reviews(tmp_path / "long.tsv", 4096)
    p = cli("predict", str(run), "-i", str(data), "-o", str(tmp_path / "p.jsonl"), "-c", "sentence", "--device",
            "cuda", "--batch-size", "4096", "--max-length", "256", "-q", prelude=LIMIT.format(_fraction(1.0)))
    assert p.returncode == 3, p.stderr[-3000:]
    assert "Traceback" not in p.stderr and not (tmp_path / "p.jsonl").exists()
    errs = error_lines(p)
    assert len(errs) == 1 and "out of memory" in errs[0] and "--batch-size 4096" in errs[0], p.stderr[-2000:]
    report(test="oom_predict", rc=p.returncode, line=errs[0])


def test_train_compile_on_cuda(tmp_path):
    runs = tmp_path / "runs"
    ok(cli("train", "-r", "quickstart", "--device", "cuda", "-q", "train.compile=true", "model.max_length=32",
           "train.epochs=2", f"output.dir={runs}"))
    s = json.loads((runs / "quickstart" / "summary.json").read_text())
    losses = [r["loss"] for r in rows(runs / "quickstart" / "metrics.jsonl") if "loss" in r]
    assert losses and all(np.isfinite(losses)) and s["final_eval"]["accuracy"] >= 0.7
    report(test="compile", final_eval=s["final_eval"], samples_per_s=s.get("samples_per_s"))


# ---- train.cuda_graphs: the captured step ------------------------------------------------------

GRAPH_BASE = ["model.name=embedded", "model.max_length=128", f"data.train={QUICKSTART / 'train.tsv'}",
              f"data.eval={QUICKSTART / 'dev.tsv'}", "data.columns.text=sentence", "train.batch_size=32",
              "train.max_steps=100", "train.log_every=1", "train.eval_every=50", "train.lr=5e-5",
              "output.name=g"]


def _graph_train(tmp_path, d, *extra, callbacks=()):
    from finetune_cli.pipelines.recipes import load_plan
    from finetune_cli.pipelines.train import run_train
    from finetune_cli.ui import UI

    return run_train(load_plan(None, [*GRAPH_BASE, *extra, f"output.dir={tmp_path / d}"]), UI(quiet=True),
                     device="cuda", callbacks=callbacks)


def test_graph_path_trains_as_the_eager_path_on_the_embedded_model(tmp_path):
    """The embedded MiniLM (real weights), 100 steps in bf16: the graph path's loss curve against the
    eager one's (both padded to the same bucket widths would be bit-comparable; they are not, so
    bf16 tolerance), and dev accuracy within 0.01. Capture time and widths are reported."""
    graphs = _graph_train(tmp_path, "graphs", "train.cuda_graphs=on")
    eager = _graph_train(tmp_path, "eager", "train.cuda_graphs=off")
    g = graphs.summary["cuda_graphs"]
    assert g and g["captured"] and g["widths"] and all(w % 32 == 0 and w <= 128 for w in g["widths"])
    lg = [r["loss"] for r in rows(graphs.run_dir / "metrics.jsonl") if "loss" in r]
    le = [r["loss"] for r in rows(eager.run_dir / "metrics.jsonl") if "loss" in r]
    assert len(lg) == len(le) == 100 and all(np.isfinite(lg))
    # Running means over 10 steps: dropout masks differ (other widths, other draws), the trend must not.
    mg, me = np.convolve(lg, np.ones(10) / 10, "valid"), np.convolve(le, np.ones(10) / 10, "valid")
    acc = graphs.summary["final_eval"]["accuracy"], eager.summary["final_eval"]["accuracy"]
    report(test="cuda_graphs", widths=g["widths"], graphs=g["graphs"], capture_seconds=g["capture_seconds"],
           samples_per_s_graphs=graphs.summary["samples_per_second"],
           samples_per_s_eager=eager.summary["samples_per_second"], accuracy=acc,
           loss_mean_gap=float(np.abs(mg - me).max()))
    assert float(np.abs(mg - me).max()) <= 0.1
    assert abs(acc[0] - acc[1]) <= 0.01, acc


def test_graph_path_resumes_exactly_after_a_crash(tmp_path):
    """A crash at step 37 and a rerun, on the graph path: the resumed run re-captures and replays the
    same RNG stream (the generator's state is in the checkpoint)."""
    extra = ("train.cuda_graphs=on", "train.max_steps=60", "train.save_every=12", "train.grad_accum=2",
             "train.batch_size=16")
    ref = _graph_train(tmp_path, "ref", *extra)
    again = _graph_train(tmp_path, "again", *extra)

    def crash(trainer, state):
        if state.step == 37:
            raise RuntimeError("simulated crash")

    with pytest.raises(RuntimeError):
        _graph_train(tmp_path, "cut", *extra, callbacks=[crash])
    resumed = _graph_train(tmp_path, "cut", *extra)
    assert resumed.resumed_from is not None and resumed.resumed_from.name == "checkpoint-36"
    noise = _max_diff(ref.run_dir / "final", again.run_dir / "final")
    cut = _max_diff(ref.run_dir / "final", resumed.run_dir / "final")
    report(test="cuda_graphs_resume", max_abs_diff_rerun=noise, max_abs_diff_resumed=cut)
    assert cut == 0.0 if noise == 0.0 else cut <= 10 * noise, (cut, noise)


def test_graphs_auto_falls_back_with_one_line_for_an_objective_that_cannot_be_captured(tmp_path):
    runs = tmp_path / "runs"
    p = ok(cli("train", "-r", "quickstart", "--device", "cuda", "train.cuda_graphs=auto", "objective.name=scl",
               "objective.crop=0.5", "train.max_steps=4", "model.max_length=32", f"output.dir={runs}"))
    lines = [ln for ln in p.stderr.splitlines() if "train.cuda_graphs=auto" in ln]
    assert len(lines) == 1 and "crop=0.5" in lines[0], p.stderr[-2000:]
    s = json.loads((runs / "quickstart" / "summary.json").read_text())
    assert s["cuda_graphs"] is None and s["steps"] == 4


def test_inference_graphs_give_the_eager_outputs_and_are_faster(trained, texts, tmp_path):
    """`--cuda-graphs on` for predict and embed (bf16): the same labels and embeddings as eager
    (bf16 tolerance), a handful of graphs (one per padded width), and the time of each."""
    import time

    run, _ = trained
    got, secs = {}, {}
    for mode in ("off", "on"):
        dest = tmp_path / f"pred-{mode}.jsonl"
        t0 = time.perf_counter()
        ok(cli("predict", str(run), "-i", str(texts), "-o", str(dest), "-c", "sentence", "--device", "cuda",
               "--cuda-graphs", mode, "-q"))
        secs[f"predict_{mode}"] = time.perf_counter() - t0
        got[f"pred-{mode}"] = [r["pred_label"] for r in rows(dest)]
        dest = tmp_path / f"emb-{mode}.npy"
        t0 = time.perf_counter()
        ok(cli("embed", "embedded", str(texts), "-o", str(dest), "-c", "sentence", "--device", "cuda",
               "--cuda-graphs", mode, "-q"))
        secs[f"embed_{mode}"] = time.perf_counter() - t0
        got[f"emb-{mode}"] = np.load(dest)
    agree = np.mean([a == b for a, b in zip(got["pred-off"], got["pred-on"], strict=True)])
    assert agree >= 0.995, agree
    a, b = got["emb-off"], got["emb-on"]
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cos.min() >= 0.99, cos.min()
    from finetune_cli.engine.inference import open_session

    sess = open_session("embedded", device="cuda", cuda_graphs="on", embedding=True)
    enc = sess.encode_texts([("word " * n).strip() for n in range(1, 120)])
    eager = open_session("embedded", device="cuda", embedding=True).forward(enc, 32, want=("embeddings",))
    replay = sess.forward(enc, 32, want=("embeddings",))
    (graphs,) = sess._graphs.values()
    assert 1 <= len(graphs.graphs) <= 4  # widths 32, 64, 96, 128
    c = (eager["embeddings"] * replay["embeddings"]).sum(1) / np.linalg.norm(eager["embeddings"], axis=1) / \
        np.linalg.norm(replay["embeddings"], axis=1)
    assert c.min() >= 0.99, c.min()
    report(test="inference_graphs", label_agreement=float(agree), embed_cos_min=float(cos.min()),
           graphs=len(graphs.graphs), capture_s=graphs.capture_s, **{k: round(v, 2) for k, v in secs.items()})
