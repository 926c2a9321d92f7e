"""Few-shot study over tasks: the few-shot recipes against a linear probe and SetFit, on the same draws.

    python experiments/fewshot_study.py                       # the whole study (writes runs/fewshot/results.md)
    python experiments/fewshot_study.py --tasks sst2,mrpc --shots 8 --seeds 1 --objectives ce --anchors probe

Protocol:

* tasks (``--tasks``, from ``../shared/data``): SST-2; the review sets books, dvd, electronics, kitchen,
  airline, yelp, amazon and imdb, each a task of its own; CoLA; the sentence-pair tasks MRPC and
  RTE; and the multi-class tasks emotion (6 classes) and SST-5 (5). The class names of a task whose
  files hold label ids (every task but RTE, whose labels are words) reach the rows that encode the
  label texts (``data.label_descriptions``). A task with a train and a dev file trains from the train file; yelp and amazon (a dev file
  only) and imdb (a train file only) first lose a stratified, seeded ``DEV_POOL`` rows of their one
  file to a dev part, and train from the rest;
* training: N examples per class (``data.few_shot=N``) drawn by the seed from the task's training
  rows; every row of one seed (recipes and anchors alike) trains on the same draw;
* the task's dev part is split once, stratified by label with a fixed seed, into two halves: the
  *selection* half picks each run's best checkpoint and, across the study, the recipes' settings
  (averaged over tasks); the *test* half is touched only by the final evaluation;
* pairs: the recipes encode a pair jointly (``[CLS] a [SEP] b [SEP]``, segment ids 0/1); the probe
  and SetFit read one text per example, so they get ``a [SEP] b`` (the tokenizer's separator token
  between the two sentences), which the same tokenizer turns into the same tokens, segment ids all 0;
* anchors (``experiments/fewshot_anchors.py``): a logistic-regression probe on the frozen
  embeddings and SetFit 1.2 with the same body;
* reported per task and N: test accuracy mean ± sd over seeds, paired differences against SetFit and
  the probe (paired t-test, Wilcoxon signed-rank, wins/ties/losses), the selection-half accuracy and
  the time per run; then averages over the sentiment tasks, the pair tasks, the multi-class tasks and
  all tasks.

A row label can name a variant: ``scl1:scl:views=1:crop=0.5:train.min_steps=100`` is the few-shot SCL
recipe with those overrides, reported as ``scl1``. Rerunning the command reuses finished runs.

Every finished cell (task, N, row, seed) is also appended to a ledger, ``experiments/results/fewshot.jsonl``
by default (``--ledger``), which is kept in the repository: the whole study is many CPU-hours, so it is
run in parts, on different machines and days, and the page is written from the ledger
(``--report-only`` needs no run folder). A cell is keyed by a fingerprint of everything that decides
its result (the resolved recipe or the anchor's settings, and the content of the task's three
splits), so a changed recipe or split is trained anew instead of reusing a stale number.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "experiments"))
import fewshot_anchors as fa  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SPLIT_SEED = 2021
DEV_POOL = 600  # rows held out as the dev part of a task that ships one file


@dataclass(frozen=True)
class Task:
    folder: str  # under the data folder
    train: str | None  # file names in the folder; None: cut from the other file
    dev: str | None
    columns: dict  # logical name (text, text_pair, label) -> column name or 0-based index
    group: str  # sentiment, acceptability, pair, multiclass
    header: str = "yes"
    max_length: int = 64
    classes: tuple[str, ...] | None = None  # class names by label id, for rows that encode the label texts


_REVIEW = {"text": "sentence", "label": "label"}
_POLARITY = ("negative", "positive")  # 0 and 1 in every sentiment file (../shared/data/README.md)
TASKS: dict[str, Task] = {
    "sst2": Task("SST-2", "train.tsv", "dev.tsv", _REVIEW, "sentiment", classes=_POLARITY),
    **{d: Task(f"sentiment-ood/{d}", "train.tsv", "dev.tsv", _REVIEW, "sentiment", classes=_POLARITY)
       for d in ("books", "dvd", "electronics", "kitchen", "airline")},
    "yelp": Task("sentiment-ood/yelp", None, "dev.tsv", _REVIEW, "sentiment", classes=_POLARITY),
    "amazon": Task("sentiment-ood/amazon", None, "dev.tsv", _REVIEW, "sentiment", classes=_POLARITY),
    "imdb": Task("sentiment-ood/imdb", "train.tsv", None, _REVIEW, "sentiment", classes=_POLARITY),
    "cola": Task("CoLA", "train.tsv", "dev.tsv", {"text": 3, "label": 1}, "acceptability", header="no",
                 classes=("unacceptable", "acceptable")),
    "mrpc": Task("MRPC", "train.tsv", "dev.tsv", {"text": "#1 String", "text_pair": "#2 String", "label": "Quality"},
                 "pair", max_length=128, classes=("not a paraphrase", "paraphrase")),
    "rte": Task("RTE", "train.tsv", "dev.tsv", {"text": "sentence1", "text_pair": "sentence2", "label": "label"},
                "pair", max_length=128),
    # multi-class (labels 0..C-1 in the files; names from the folder's labels.txt)
    "emotion": Task("emotion", "train.tsv", "dev.tsv", _REVIEW, "multiclass",
                    classes=("sadness", "joy", "love", "anger", "fear", "surprise")),
    "sst5": Task("SST-5", "train.tsv", "dev.tsv", _REVIEW, "multiclass",
                 classes=("very negative", "negative", "neutral", "positive", "very positive")),
}
LEDGER = REPO / "experiments" / "results" / "fewshot.jsonl"
FULL = {"tasks": ",".join(TASKS), "objectives": "ce,scl", "shots": "8,20,64", "seeds": "1-5",
        "anchors": "probe,setfit"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", default=FULL["tasks"], help=f"comma-separated from {', '.join(TASKS)} "
                                                         "(default: all)")
    p.add_argument("--objectives", default=FULL["objectives"],
                   help="rows: NAME (recipes/fewshot/NAME.yaml), or LABEL:NAME[:key=value...] (default: %(default)s)")
    p.add_argument("--anchors", default=FULL["anchors"], help="comma-separated from: probe, setfit; '' for none "
                                                              "(default: %(default)s)")
    p.add_argument("--shots", default=FULL["shots"], help="examples per class (default: %(default)s)")
    p.add_argument("--seeds", default=FULL["seeds"], help="seeds, e.g. 1,2,3 or 1-5 (default: %(default)s)")
    p.add_argument("--max-steps", type=int, default=None, help="optimizer steps per run (smoke runs)")
    p.add_argument("--max-length", type=int, default=None, help="tokens per input (default: 64, pairs 128)")
    p.add_argument("--model", default="embedded")
    p.add_argument("--data-dir", default=os.environ.get("FINETUNE_SHARED_DATA", str(REPO.parent / "shared" / "data")))
    p.add_argument("--out", default=str(REPO / "runs" / "fewshot"), help="runs and the task splits go here")
    p.add_argument("--results", default=str(REPO / "runs" / "fewshot" / "results.md"), help="Markdown results file")
    p.add_argument("--ledger", default=None, help="the finished cells, one JSON line each, reused and appended "
                                                  f"to (default: {LEDGER.relative_to(REPO)} for the study's protocol; "
                                                  "<out>/ledger.jsonl for a smoke run: --max-steps, --max-length, "
                                                  "--set or another --model)")
    p.add_argument("--no-times", action="store_true", help="leave wall and CPU seconds off the page (cells made "
                                                           "on a shared or loaded machine)")
    p.add_argument("--device", default="auto")
    p.add_argument("--no-figures", action="store_true", help="skip reliability / t-SNE PNGs of each run")
    p.add_argument("--keep", choices=("all", "best", "none"), default="none",
                   help="model folders kept after a run is evaluated (default: none: eval.json and metrics only)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="recipe override for every fine-tuning row (repeatable)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--report-only", action="store_true", help="train nothing: report the runs already finished")
    p.add_argument("--quiet", action="store_true", help="no per-run training output")
    return p.parse_args(argv)


# ---- task data ------------------------------------------------------------------------------------

def read_rows(path: Path, task: Task) -> list[dict]:
    """The task's rows as ``{"text", ["text_pair",] "label"}`` with string labels, read by the tool's table reader."""
    from finetune_cli.data.sources import read_file

    t = read_file(str(path), task.columns, header=task.header)
    keys = list(task.columns)
    return [{k: str(t.columns[k][i]) for k in keys} for i in range(len(t.columns["label"]))]


def stratified_halves(rows: list[dict], n_first: int | None = None, seed: int = SPLIT_SEED) -> tuple[list, list]:
    """Seeded, stratified cut of ``rows`` (order kept within each part): ``n_first`` rows (default: half,
    floor(n/2) of each label) go to the first part. Labels are shuffled separately, so each keeps its share."""
    labels = [r["label"] for r in rows]
    rng = np.random.default_rng(seed)
    first: list[int] = []
    for lab in sorted(set(labels)):
        idx = [i for i, x in enumerate(labels) if x == lab]
        perm = rng.permutation(len(idx))
        k = len(idx) // 2 if n_first is None else round(n_first * len(idx) / len(rows))
        first += [idx[j] for j in perm[:k]]
    chosen = set(first)
    return [rows[i] for i in sorted(chosen)], [r for i, r in enumerate(rows) if i not in chosen]


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    if not path.is_file() or path.read_text(encoding="utf-8") != text:  # same content: same file, reruns resume
        path.write_text(text, encoding="utf-8")


def prepare_task(name: str, data_dir: Path, out: Path) -> dict[str, Path]:
    """``train``, ``select`` and ``test`` JSONL files of task ``name`` under ``out/<name>/data``."""
    task = TASKS[name]
    folder = data_dir / task.folder
    train = read_rows(folder / task.train, task) if task.train else None
    dev = read_rows(folder / task.dev, task) if task.dev else None
    if train is None or dev is None:
        dev, train = stratified_halves(train or dev, n_first=DEV_POOL)
    select, test = stratified_halves(dev)
    d = out / name / "data"
    d.mkdir(parents=True, exist_ok=True)
    paths = {k: d / f"{k}.jsonl" for k in ("train", "select", "test")}
    for k, rows in (("train", train), ("select", select), ("test", test)):
        _write_jsonl(paths[k], rows)
    return paths


def missing_tasks(names: list[str], data_dir: Path) -> list[str]:
    return [n for n in names if not all((data_dir / TASKS[n].folder / f).is_file()
                                        for f in (TASKS[n].train, TASKS[n].dev) if f)]


# ---- rows ------------------------------------------------------------------------------------------

def parse_objectives(spec: str) -> list[tuple[str, str, list[str]]]:
    """``ce,scl1:scl:views=1`` -> [(label, recipe name, [overrides])]; a key=value is an objective
    parameter unless it names another recipe section (``train.min_steps=100``)."""
    out = []
    for item in [s.strip() for s in spec.split(",") if s.strip()]:
        parts = item.split(":")
        label, name = (parts[0], parts[0]) if len(parts) == 1 else (parts[0], parts[1])
        out.append((label, name, [kv if kv.split("=", 1)[0].startswith(("model.", "data.", "train."))
                                  else f"objective.{kv}" for kv in parts[2:]]))
    return out


def recipe_name(name: str) -> str:
    """``fewshot/<name>`` when it ships, else the full-data recipe of that objective (with the same schedule)."""
    from finetune_cli.recipe import PACKAGED_RECIPES

    return f"fewshot/{name}" if (PACKAGED_RECIPES / "fewshot" / f"{name}.yaml").is_file() else name


def study_overrides(args, name: str, extra: list[str], task: str, shots: int, files: dict[str, Path],
                    label: str) -> list[str]:
    """The row's recipe pointed at the task's files, at N examples a class, written under the task."""
    pair = "text_pair" in TASKS[task].columns
    names = class_names_override(name, extra, TASKS[task])
    sched = [f"train.max_steps={args.max_steps}", "~train.min_steps"] if args.max_steps else []
    return [
        f"model.name={args.model}", f"model.max_length={args.max_length or TASKS[task].max_length}",
        "~data.dataset", "~data.max_train_samples", "~data.max_eval_samples", "~data.seed", "~data.label_names",
        f"data.train={files['train']}", f"data.eval={files['select']}", "data.columns.text=text",
        f"data.columns.text_pair={'text_pair' if pair else 'null'}", "data.columns.label=label",
        f"data.few_shot={shots}", *names, *extra, *sched, "train.metric=accuracy", "~train.greater_is_better",
        "train.keep_checkpoints=1", f"output.dir={Path(args.out) / task / f'n{shots}'}", f"output.name={label}",
        *args.overrides,
    ]


def class_names_override(name: str, extra: list[str], task: Task) -> list[str]:
    """``data.label_descriptions`` naming the task's classes, for a row whose objective encodes the label
    texts (the files hold label ids); nothing for the others, which would refuse the key."""
    from finetune_cli.objectives import registry
    from finetune_cli.recipe import parse_recipe

    if task.classes is None or not registry.get(parse_recipe(recipe_name(name), extra).objective.name).label_texts:
        return []
    return ["data.label_descriptions=" + json.dumps({str(i): c for i, c in enumerate(task.classes)})]


def schedule_text(t) -> str:
    steps = f"{t.max_steps} steps" if t.max_steps else (f"{t.epochs:g} epochs"
                                                          + (f", at least {t.min_steps} steps" if t.min_steps else ""))
    return (f"{steps}, batch {t.batch_size}, lr {t.lr:g} (heads {t.head_lr or t.lr:g}), warm-up {t.warmup_ratio:g}"
            + (", encoder frozen" if t.freeze_encoder else "") + (f", ~{t.min_evals} evaluations" if t.min_evals else "")
            + (f", early stop after {t.early_stopping_patience} without gain" if t.early_stopping_patience else "")
            + (", head refitted before each evaluation" if t.refit_head else ""))


def prune(run_dir: Path, keep: str) -> None:
    """Drop model folders of an evaluated run (a finished run is never retrained: summary.json stays)."""
    import shutil

    if keep == "all":
        return
    for d in [*run_dir.glob("checkpoint-*"), run_dir / "final"] + ([run_dir / "best"] if keep == "none" else []):
        if d.is_dir():
            shutil.rmtree(d)


def rel(p) -> str:
    try:
        return str(Path(p).resolve().relative_to(REPO))
    except ValueError:
        return str(p)


def cpu_seconds() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


# ---- the ledger ------------------------------------------------------------------------------------

class Ledger:
    """The study's finished cells, one JSON line each: ``{task, n, row, seed, fp, record, ...provenance}``.

    Appending is one ``write`` on a file opened with ``O_APPEND``, so two study processes (say, on
    different tasks) can share one ledger. A line that does not parse stops the study with its path and
    line number: a silently skipped cell would be a number quietly missing from the page."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.cells: dict[tuple, dict] = {}
        if self.path.is_file():
            for i, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    c = json.loads(line)
                    self.cells[(c["task"], c["n"], c["row"], c["seed"], c["fp"])] = c["record"]
                except (ValueError, KeyError, TypeError) as e:
                    raise SystemExit(f"error: {self.path}:{i}: not a ledger line ({type(e).__name__}: {e})") from None

    def get(self, task: str, n: int, row: str, seed: int, fp: str) -> dict | None:
        return self.cells.get((task, n, row, seed, fp))

    def add(self, task: str, n: int, row: str, seed: int, fp: str, record: dict) -> None:
        if (task, n, row, seed, fp) in self.cells:
            return
        import torch

        line = {"task": task, "n": n, "row": row, "seed": seed, "fp": fp, "record": record,
                "made": time.strftime("%Y-%m-%d", time.gmtime()), "commit": _commit(),
                "threads": torch.get_num_threads(), "load1": round(os.getloadavg()[0], 2)}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(line, sort_keys=True) + "\n").encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        self.cells[(task, n, row, seed, fp)] = record


def ledger_path(args) -> Path:
    """``--ledger``, else the repository's ledger, which holds only cells of the study's protocol: a smoke
    run (fewer steps, another length, an override, another body) keeps its cells beside its runs."""
    if args.ledger:
        return Path(args.ledger)
    smoke = args.max_steps or args.max_length or args.overrides or args.model != "embedded"
    return Path(args.out) / "ledger.jsonl" if smoke else LEDGER


def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _hash(tree) -> str:
    return hashlib.sha256(json.dumps(tree, sort_keys=True, default=str).encode()).hexdigest()[:16]


def data_hash(files: dict[str, Path]) -> str:
    """The content of the task's three splits (their paths differ between machines, their rows must not)."""
    return _hash({k: hashlib.sha256(Path(files[k]).read_bytes()).hexdigest() for k in ("train", "select", "test")})


def recipe_fp(recipe, splits: str) -> str:
    """A fine-tuning row's cell key: the resolved recipe (seeds, file paths and output excluded) and the
    splits' :func:`data_hash`."""
    tree = recipe.fingerprinted(ignore_seeds=True)
    tree["data"].pop("train", None)
    tree["data"].pop("eval", None)
    return _hash({"recipe": tree, "data": splits})


def anchor_fp(anchor: str, recipe, n: int, splits: str) -> str:
    """An anchor's cell key: its settings, the body, the draw's size and the splits' :func:`data_hash`."""
    settings = {"probe": "sklearn LogisticRegression()", "setfit": fa.SETFIT_SETTINGS}[anchor]
    return _hash({"anchor": anchor, "settings": settings, "model": recipe.model.name,
                  "max_length": recipe.model.max_length, "n": n, "data": splits})


# ---- running ---------------------------------------------------------------------------------------

def run_row(args, plan, task: str, n: int, label: str, seeds, ui, test: Path, ledger: Ledger,
            fp: str) -> dict[int, dict]:
    """Train (or reuse, from the ledger or a finished run) and test every seed of one fine-tuning row
    (its ledger key ``fp``); the per-seed records."""
    from finetune_cli.pipelines.evaluate import eval_plan, evaluate
    from finetune_cli.pipelines.multiseed import run_seeds
    from finetune_cli.rundir import EVAL as EVAL_FILE

    row_dir = Path(args.out) / task / f"n{n}" / label
    cost_file = row_dir / "cost.json"
    cost = json.loads(cost_file.read_text()) if cost_file.is_file() else {}
    test = str(test)
    recs = {}
    for seed in seeds:
        if (rec := ledger.get(task, n, label, seed, fp)) is not None:
            recs[seed] = rec
            continue
        if args.report_only and not (str(seed) in cost and (row_dir / f"seed-{seed}" / EVAL_FILE).is_file()):
            continue
        t0, c0 = time.perf_counter(), cpu_seconds()
        (o,) = run_seeds(plan, [seed], ui, device=args.device)
        ev_file = o.run_dir / EVAL_FILE
        done = ev_file.is_file() and json.loads(ev_file.read_text()).get("data") == test
        if not done:
            evaluate(str(o.run_dir), eval_plan(str(o.run_dir), None, [f"data.eval={test}"]), ui, device=args.device,
                     figures=not args.no_figures)
        prune(o.run_dir, args.keep)
        if not (o.already_complete and done and str(seed) in cost):
            # a reused run keeps the time measured when it was made
            cost[str(seed)] = {"wall_s": time.perf_counter() - t0, "cpu_s": cpu_seconds() - c0}
            cost_file.write_text(json.dumps(cost, indent=2))
        ev = json.loads(ev_file.read_text())
        summ = json.loads((o.run_dir / "summary.json").read_text())
        recs[seed] = {"test": {**ev["metrics"], "ece": ev["calibration"]["ece"]}, "select": summ.get("best_metric"),
                      "steps": summ.get("steps"), **cost[str(seed)]}
        ledger.add(task, n, label, seed, fp, recs[seed])
    return recs


def run_task(args, task: str, shots, seeds, objectives, anchors, ui, say, hyper, ledger: Ledger) -> dict[int, dict]:
    """Every row of one task at every N: ``{N: {row: {seed: record}}}``."""
    from finetune_cli.pipelines.recipes import load_plan

    files = prepare_task(task, Path(args.data_dir), Path(args.out))
    splits = data_hash(files)
    embedder = {}

    def embed():  # the frozen body, loaded once per task (its max length is the task's)
        if "e" not in embedder:
            embedder["e"] = fa.Embedder(args.model, args.max_length or TASKS[task].max_length)
        return embedder["e"]

    rows: dict[int, dict] = {}
    for n in shots:
        rows[n] = {}
        base = None
        for label, name, extra in objectives:
            plan = load_plan(recipe_name(name), study_overrides(args, name, extra, task, n, files, label))
            base = base or plan.recipe
            t = plan.recipe.train
            hyper[label] = {"recipe": recipe_name(name), "objective": plan.recipe.objective.name,
                            **dict(plan.recipe.objective.params), "schedule": schedule_text(t)}
            say(f"== {task} · N={n} · {label} ==")
            if recs := run_row(args, plan, task, n, label, seeds, ui, files["test"], ledger,
                               recipe_fp(plan.recipe, splits)):
                rows[n][label] = recs
        if base is None:
            base = load_plan(recipe_name("ce"), study_overrides(args, "ce", [], task, n, files, "ce")).recipe
        for anchor in anchors:
            say(f"== {task} · N={n} · {anchor} (anchor) ==")
            adir, fp = Path(args.out) / task / f"n{n}" / anchor, anchor_fp(anchor, base, n, splits)
            known = {k: r for k in seeds if (r := ledger.get(task, n, anchor, k, fp)) is not None}
            todo = [k for k in seeds if k not in known
                    and (not args.report_only or (adir / f"seed-{k}" / "result.json").is_file())]
            for k in todo:  # one seed at a time: each finished cell is in the ledger before the next starts
                (r,) = fa.run_anchor(anchor, base, [k], files["test"], files["select"], adir, embed, cpu_seconds, say)
                known[k] = {"test": r["metrics"]["test"], "select": r["metrics"]["select"]["accuracy"],
                            "wall_s": r["wall_s"], "cpu_s": r["cpu_s"]}
                ledger.add(task, n, anchor, k, fp, known[k])
            if known:
                rows[n][anchor] = {k: known[k] for k in seeds if k in known}
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from finetune_cli.objectives import registry
    from finetune_cli.pipelines.multiseed import parse_seeds
    from finetune_cli.ui import UI

    ui, say = UI(quiet=args.quiet), UI().log
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        print(f"error: unknown task(s) {', '.join(unknown)} (known: {', '.join(TASKS)})", file=sys.stderr)
        return 2
    if gone := missing_tasks(tasks, Path(args.data_dir)):
        print(f"error: no data for {', '.join(gone)} under {args.data_dir} (pass --data-dir)", file=sys.stderr)
        return 2
    objectives, notes = check_rows(parse_objectives(args.objectives), set(registry.names()), say)
    anchors = [a for a in (x.strip() for x in args.anchors.split(",")) if a]
    if bad := [a for a in anchors if a not in fa.ANCHORS]:
        print(f"error: unknown anchor(s) {', '.join(bad)} (known: {', '.join(fa.ANCHORS)})", file=sys.stderr)
        return 2
    # --report-only reads the ledger and runs nothing, so SetFit's cells are reported without SetFit installed.
    if "setfit" in anchors and not args.report_only and (why := fa.setfit_available()):
        notes.append(f"`setfit` skipped: {why}")
        anchors.remove("setfit")
    if not objectives and not anchors:
        print("error: no row to run (none of the objectives is registered, no anchor)", file=sys.stderr)
        return 2
    shots, seeds, hyper = [int(s) for s in args.shots.split(",")], parse_seeds(args.seeds), {}
    args.ledger = ledger_path(args)
    ledger = Ledger(args.ledger)
    t_wall = time.perf_counter()
    results = {task: run_task(args, task, shots, seeds, objectives, anchors, ui, say, hyper, ledger) for task in tasks}
    say(f"this invocation: wall {(time.perf_counter() - t_wall) / 60:.1f} min")
    cmd = "python experiments/fewshot_study.py" + "".join(
        f" {shlex.quote(a)}" for a in (argv if argv is not None else sys.argv[1:]))
    from fewshot_report import write_results

    write_results(Path(args.results), args, cmd, results, hyper, notes, anchors, torch)
    say(f"results: {rel(args.results)}")
    return 0


def check_rows(rows, known: set[str], say) -> tuple[list, list[str]]:
    """The rows whose objective is registered in this build; a note for each one skipped."""
    from finetune_cli.recipe import PACKAGED_RECIPES, read_yaml

    keep, notes = [], []
    for label, name, extra in rows:
        f = PACKAGED_RECIPES / "fewshot" / f"{name}.yaml"
        obj = (read_yaml(f).get("objective") or {}) if f.is_file() else {"name": name}
        obj = obj if isinstance(obj, str) else obj.get("name", "ce")
        if obj in known:
            keep.append((label, name, extra))
        else:
            notes.append(f"`{label}` skipped: objective `{obj}` is not registered in this build")
            say(f"note: {notes[-1]}")
    return keep, notes


if __name__ == "__main__":
    sys.exit(main())
