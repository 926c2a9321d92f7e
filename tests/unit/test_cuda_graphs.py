"""The step the graph path captures (``engine/step.py``), checked on the CPU.

A CPU cannot capture CUDA graphs; what a capture needs can still be checked here: the objectives
marked capturable trace to one graph (``torch.compile(fullgraph=True)``, the proxy for "no host read,
no shape from data"), nothing inside a step reads a value on the host, padding a batch up to its
bucket width leaves every row's logits and the loss as they were, the tensor learning rate follows
the schedule to the bit, and the static-buffer step (``GraphedStep(capture=False)``: what a graph
replays) trains exactly as the eager step does, through the CLI too, with an exact resume. The GPU
tier (``tests/gpu``) replays the real graphs."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from finetune_cli.engine import step as step_mod
from finetune_cli.engine.device import GRAPH_MULTIPLE
from finetune_cli.engine.step import EagerStep, GraphedStep
from finetune_cli.errors import TrainingError
from finetune_cli.objectives import build, registry
from finetune_cli.pipelines.recipes import load_plan
from finetune_cli.pipelines.train import run_train
from finetune_cli.ui import UI
from tests.unit._objective_batch import model_and_batch

REQUIRED = {"ce", "scl", "focal", "dice", "r3f", "r4f"}  # the objectives the graph path must serve


def _capturable() -> list[str]:
    return [n for n in registry.names() if build(n, {}).capture_refusal() is None]


def test_the_objectives_that_must_be_capturable_are():
    assert REQUIRED <= set(_capturable())
    assert build("scl", {"crop": 0.5}).capture_refusal() is not None  # a random span: a shape from data
    assert "fastfit" not in _capturable()


def _batch_for(name, tiny_model_dir, quickstart_data, tmp_path):
    if name == "simcse_unsup":
        return model_and_batch(tiny_model_dir, quickstart_data, name, "data.columns.label=null", batch_size=4)
    if name == "simcse_sup":
        rows = [ln.split("\t")[0] for ln in open(quickstart_data["train"], encoding="utf-8").read().splitlines()[1:21]]
        f = tmp_path / "triplets.tsv"
        f.write_text("sentence\tpos\tneg\n" + "".join(f"{a}\t{a.lower()}\t{rows[(i + 7) % len(rows)]}\n"
                                                      for i, a in enumerate(rows)))
        return model_and_batch(tiny_model_dir, quickstart_data, name, "data.columns.label=null",
                               "data.columns.text_pair=pos", "data.columns.hard_neg=neg", train_file=str(f),
                               batch_size=4)
    return model_and_batch(tiny_model_dir, quickstart_data, name, batch_size=4)


@pytest.mark.parametrize("name", _capturable())
def test_a_capturable_objective_traces_to_one_graph(name, tiny_model_dir, quickstart_data, tmp_path):
    """``fullgraph=True`` fails on any graph break: a ``.item()``, a Python branch on a tensor, a
    shape made from data. The eager backend only traces (no code generation), so this stays cheap."""
    torch._dynamo.reset()
    model, _, batch, obj = _batch_for(name, tiny_model_dir, quickstart_data, tmp_path)
    model.train()
    eager = obj(model, batch)["loss"]  # also installs transformers' output hooks, once, outside the trace
    traced = torch.compile(lambda b: obj(model, b)["loss"], fullgraph=True, backend="eager")(batch)
    assert torch.isfinite(traced) and torch.isfinite(eager)


def test_bucket_padding_leaves_logits_and_loss_unchanged(tiny_model_dir, quickstart_data):
    from finetune_cli.data.encode import collate
    from finetune_cli.models import load_text_model
    from finetune_cli.pipelines.common import encode, load_data

    plan = load_plan(None, [f"model.name={tiny_model_dir}", "model.max_length=64",
                            f"data.train={quickstart_data['train']}", "data.columns.text=sentence"])
    data = load_data(plan, None)
    model, tok, _ = load_text_model(str(tiny_model_dir), plan.head_spec(2, 0.1))
    model.eval()
    enc = encode(plan, data.train, tok)
    idx = list(range(12))
    tight = collate(enc, idx, tok.pad_token_id)
    bucket = collate(enc, idx, tok.pad_token_id, GRAPH_MULTIPLE, 64)
    wt, wb = tight["features"][0]["input_ids"].shape[1], bucket["features"][0]["input_ids"].shape[1]
    assert wb % GRAPH_MULTIPLE == 0 and wb > wt  # the check pads for real
    with torch.no_grad():
        a, b = model(tight["features"][0]).logits, model(bucket["features"][0]).logits
    assert torch.allclose(a, b, atol=1e-6, rtol=0)
    la, lb = F.cross_entropy(a, tight["labels"]), F.cross_entropy(b, bucket["labels"])
    assert abs(la.item() - lb.item()) < 1e-6


def test_the_tensor_learning_rate_is_the_schedule_to_the_bit():
    """The graph path's AdamW takes its learning rate as a tensor the scheduler writes in place: the
    logged rates are get_scheduler's floats, and the weights those of the float-lr optimizer."""
    from finetune_cli.engine.setup import build_optimizer, build_scheduler
    from finetune_cli.recipe import TrainConfig

    cfg = TrainConfig(lr=1e-3, warmup_steps=3, head_lr=2e-3)
    torch.manual_seed(0)
    a = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    b = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    b.load_state_dict(a.state_dict())
    oa, ob = build_optimizer(a, cfg, torch.device("cpu"), graphs=True), build_optimizer(b, cfg, torch.device("cpu"))
    assert all(isinstance(g["lr"], torch.Tensor) for g in oa.param_groups)
    sa, sb = build_scheduler(oa, cfg, 10), build_scheduler(ob, cfg, 10)
    for _ in range(8):
        x = torch.randn(5, 4)
        for m, o, s in ((a, oa, sa), (b, ob, sb)):
            m(x).pow(2).mean().backward()
            o.step()
            s.step()
            o.zero_grad()
        assert [float(v) for v in sa.get_last_lr()] == sb.get_last_lr()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


class _Replay:
    """A stand-in for a captured CUDA graph on the CPU: replaying runs the captured function."""

    def __init__(self, fn):
        self.fn = fn

    def replay(self):
        self.fn()

    def pool(self):
        return ("pool",)


def _fake_capture(monkeypatch):
    """``capture_graph`` as a GPU does it, minus the GPU: the warm-ups run (and change what they
    change), ``settle`` undoes that, and the capture itself records without running (replays run);
    the CUDA RNG calls use the CPU generator."""
    calls = []

    def capture(fn, device, pool=None, *, warmups=1, settle=None):
        for _ in range(warmups):
            fn()
        if settle is not None:
            settle()
        calls.append(warmups)
        return _Replay(fn), None

    monkeypatch.setattr(step_mod, "capture_graph", capture)
    monkeypatch.setattr(step_mod, "on_side_stream", lambda fn, device: fn())
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device=None: torch.get_rng_state())
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device=None: torch.set_rng_state(state))
    return calls


@pytest.mark.parametrize("accum", [1, 2])
def test_the_static_buffer_step_is_the_eager_step(tiny_model_dir, quickstart_data, accum, monkeypatch):
    """What a graph replays (static input buffers, gradients accumulated in place and zeroed in the
    update, parts summed on the device, the tensor learning rate) gives the eager step's weights and
    losses bit for bit, dropout included (same RNG draws in the same order). ``captured``: the same
    with the capture's warm-up and its undoing (``settle``) run as on a GPU; with two micro-batches
    the second has a width of its own, so a capture happens mid-step, over non-zero gradients."""
    import copy

    from accelerate import Accelerator

    from finetune_cli.engine.setup import build_optimizer, build_scheduler
    from finetune_cli.recipe import TrainConfig

    model, tok, batch, obj = model_and_batch(tiny_model_dir, quickstart_data, "scl", batch_size=4)
    narrow = {**batch, "features": [{k: v[:, :-2] for k, v in f.items()} for f in batch["features"]]}
    cfg = TrainConfig(lr=1e-3)
    acc = Accelerator(cpu=True)
    captures = _fake_capture(monkeypatch)
    models, steppers = [], []
    for kind in ("eager", "static", "captured"):
        m = copy.deepcopy(model).train()
        opt = build_optimizer(m, cfg, torch.device("cpu"), graphs=True)
        sched = build_scheduler(opt, cfg, 20)
        st = (EagerStep(acc, m, obj, opt, sched, 1.0, 1) if kind == "eager"
              else GraphedStep(acc, m, obj, opt, sched, 1.0, capture=kind == "captured"))
        models.append(m)
        steppers.append(st)
    micro = [list(range(i * 4, i * 4 + 4)) for i in range(accum)]  # (their sizes count the examples)
    outs = []
    for st in steppers:
        torch.manual_seed(123)
        res = []
        for _ in range(3):
            # the sampler's batch (model_and_batch), once per micro-step; the second one narrower
            stream = iter([dict(batch) if j == 0 else dict(narrow) for j in range(len(micro))])
            res.append(st(stream, micro, accum))
        outs.append(res)
    assert captures == [1] * accum + [0]  # a micro-batch graph per width, then the update (no warm-up)
    for other in outs[1:]:
        for (na, ka, pa), (nb, kb, pb) in zip(outs[0], other, strict=True):
            assert na == nb and ka == kb and torch.equal(pa, pb)
    for m in models[1:]:
        for p, q in zip(models[0].parameters(), m.parameters(), strict=True):
            assert torch.equal(p, q)


def _train(overrides, callbacks=()):
    return run_train(load_plan(None, overrides), UI(quiet=True), device="cpu", callbacks=callbacks)


def test_cuda_graphs_on_is_refused_where_no_gpu_can_capture(tiny_recipe):
    with pytest.raises(TrainingError, match=r"train.cuda_graphs=on: this step cannot be captured: training runs "
                                            r"on cpu"):
        _train(tiny_recipe("train.cuda_graphs=on", "train.max_steps=2"))
    out = _train(tiny_recipe("train.cuda_graphs=auto", "train.max_steps=2"))  # auto: eager steps, no word
    assert out.summary["cuda_graphs"] is None


def test_an_objective_that_cannot_be_captured_is_refused_by_name(tiny_recipe, monkeypatch):
    monkeypatch.setattr(step_mod, "device_can_capture", lambda dev: True)
    with pytest.raises(TrainingError, match=r"objective `scl` with crop=0.5 cuts rows at random lengths"):
        _train(tiny_recipe("objective.name=scl", "objective.crop=0.5", "train.cuda_graphs=on", "train.max_steps=2"))


class _StopAt:
    def __init__(self, step):
        self.step = step

    def __call__(self, trainer, state):
        if state.step == self.step:
            raise KeyboardInterrupt


def _records(run_dir):
    return [{k: v for k, v in json.loads(x).items() if k != "samples_per_s"}
            for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_graph_path_through_the_cli_pads_to_buckets_logs_the_schedule_and_resumes_exactly(
        tiny_recipe, tmp_path, monkeypatch):
    """``train.cuda_graphs=on`` where a capture is possible (stood in for here: the static-buffer
    step runs on the CPU): batches padded to multiples of 32 (recorded in summary.json), the logged
    learning rates those of the eager run, and a run stopped mid-way resumes to the same weights and
    log as one that never stopped."""
    monkeypatch.setattr(step_mod, "device_can_capture", lambda dev: True)
    common = ("model.max_length=64", "train.epochs=2", "train.eval_every=3", "train.save_every=1",
              "train.grad_accum=2", "train.batch_size=4", "train.log_every=1", "train.cuda_graphs=on")
    ref = _train(tiny_recipe(*common, f"output.dir={tmp_path / 'ref'}"))
    g = ref.summary["cuda_graphs"]
    assert g is not None and g["widths"] and all(w % GRAPH_MULTIPLE == 0 and w <= 64 for w in g["widths"])
    assert g["captured"] is False  # on the CPU nothing is captured: the static-buffer step ran

    eager = _train(tiny_recipe(*common[:-1], "train.cuda_graphs=off", f"output.dir={tmp_path / 'eager'}"))
    lrs = lambda rs: [r["lr"] for r in rs if "lr" in r]  # noqa: E731
    assert lrs(_records(ref.run_dir)) == lrs(_records(eager.run_dir)) and lrs(_records(ref.run_dir))

    run = tiny_recipe(*common, f"output.dir={tmp_path / 'cut'}")
    with pytest.raises(KeyboardInterrupt):
        _train(run, callbacks=[_StopAt(5)])
    resumed = _train(run)
    assert resumed.resumed_from is not None
    wa = load_file(str(ref.run_dir / "final" / "model.safetensors"))
    wb = load_file(str(resumed.run_dir / "final" / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert _records(resumed.run_dir) == _records(ref.run_dir)


@pytest.mark.parametrize("graphs", ["off", "on"])
def test_no_host_read_inside_a_step(tiny_recipe, monkeypatch, graphs):
    """Between log points a step reads nothing back to the host (on a GPU each read is a sync that
    idles it, and inside a capture it is an error): every Python-level read raises inside a step.

    One read is transformers' own: its SDPA mask builder asks ``padding_mask.all()`` on every
    forward to skip an all-ones mask, unless a CUDA stream is capturing. The graph path runs inside
    a capture (stood in for here), so it has none; the eager path has exactly that one per forward
    (the Trainer's step too), and nothing of ours."""
    import sys

    import transformers.masking_utils as mu

    monkeypatch.setattr(step_mod, "device_can_capture", lambda dev: True)
    inside = {"on": False, "steps": 0, "transformers_reads": 0}
    real_tracing = mu.is_tracing
    if graphs == "on":  # what torch.cuda.is_current_stream_capturing() answers during a capture
        monkeypatch.setattr(mu, "is_tracing", lambda t=None: inside["on"] or real_tracing(t))

    def guard(name):
        real = getattr(torch.Tensor, name)

        def read(self, *a, **k):
            if inside["on"]:
                if graphs == "off" and sys._getframe(1).f_code.co_filename == mu.__file__:
                    inside["transformers_reads"] += 1
                else:
                    raise AssertionError(f"Tensor.{name} inside a training step")
            return real(self, *a, **k)
        monkeypatch.setattr(torch.Tensor, name, read)

    for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__"):
        guard(name)
    for cls in (EagerStep, GraphedStep):
        real_call = cls.__call__

        def call(self, *a, _real=real_call, **k):
            inside["on"], inside["steps"] = True, inside["steps"] + 1
            try:
                return _real(self, *a, **k)
            finally:
                inside["on"] = False
        monkeypatch.setattr(cls, "__call__", call)
    for objective in ("ce", "scl"):
        out = _train(tiny_recipe(f"objective.name={objective}", f"train.cuda_graphs={graphs}", "train.max_steps=6",
                                 "train.log_every=100", "train.eval_every=100", "train.grad_accum=2",
                                 f"output.name={objective}-{graphs}"))
        assert out.summary["steps"] == 6
    assert inside["steps"] == 12
    assert (inside["transformers_reads"] > 0) == (graphs == "off")


def test_capture_graph_warms_up_off_the_graph_then_settles_then_captures(monkeypatch):
    """The one capture both graph paths use, with torch.cuda's stream and graph calls recorded (no
    GPU here): the warm-ups run on the side stream, the main stream waits for them, ``settle`` runs
    after that wait and before the capture, and the capture uses the pool it is given and the same
    side stream; a second capture reuses that stream (cuBLAS keeps a workspace per stream it met)."""
    import contextlib

    from finetune_cli.engine import device as device_mod

    calls, where = [], ["main"]

    class Stream:
        def __init__(self, name):
            self.name = name

        def wait_stream(self, other):
            calls.append(f"{self.name} waits {other.name}")

    @contextlib.contextmanager
    def on(stream):
        where.append(stream.name)
        yield
        where.pop()

    class Graph:
        def pool(self):
            return "pool"

    @contextlib.contextmanager
    def graph(g, pool=None, stream=None):
        calls.append(f"capture into {pool} on {stream.name}")
        where.append("graph")
        yield
        where.pop()

    made = []
    monkeypatch.setattr(torch.cuda, "Stream", lambda dev: made.append(dev) or Stream(f"side{len(made)}"))
    monkeypatch.setattr(device_mod, "_SIDE_STREAMS", {})
    monkeypatch.setattr(torch.cuda, "current_stream", lambda dev: Stream("main"))
    monkeypatch.setattr(torch.cuda, "stream", on)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", graph)

    def fn():
        calls.append(f"fn on {where[-1]}")
        return len(calls)

    g, out = device_mod.capture_graph(fn, torch.device("cuda"), "shared", warmups=2,
                                      settle=lambda: calls.append("settle"))
    assert isinstance(g, Graph) and out == len(calls)
    assert calls == ["side1 waits main", "fn on side1", "fn on side1", "main waits side1", "settle",
                     "capture into shared on side1", "fn on graph"]
    calls.clear()
    device_mod.capture_graph(fn, torch.device("cuda"), "shared")
    assert calls == ["side1 waits main", "fn on side1", "main waits side1", "capture into shared on side1",
                     "fn on graph"]
    assert len(made) == 1


def test_update_kernels_are_warmed_on_a_throwaway_parameter(monkeypatch):
    """Before the update (clipping, AdamW, zeroing) is captured, its kernels run once on a throwaway
    parameter with the run's optimizer settings (a first launch inside a capture may load a module):
    the real weights, gradients, optimizer state and learning rate are left as they were."""
    from types import SimpleNamespace

    from finetune_cli.engine.setup import tensor_lr

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(model.parameters(), lr=tensor_lr(1e-3, torch.device("cpu")), weight_decay=0.01,
                            fused=True)
    step = GraphedStep(SimpleNamespace(device=torch.device("cpu")), model, None, opt, None, max_grad_norm=1.0,
                       capture=False)
    ran = []
    monkeypatch.setattr(step_mod, "on_side_stream", lambda fn, device: ran.append(fn()))
    weights = [p.detach().clone() for p in model.parameters()]
    grads = [p.grad.clone() for p in model.parameters()]
    lr = opt.param_groups[0]["lr"].clone()
    step._warm_update_kernels()
    assert len(ran) == 1
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), weights, strict=True))
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads, strict=True))
    assert not opt.state and torch.equal(opt.param_groups[0]["lr"], lr)
