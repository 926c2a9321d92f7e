"""The layers import only downward (DESIGN.md): cli -> pipelines -> engine/augment -> objectives ->
models -> data/metrics/viz -> rundir -> recipe -> ui -> fsutil -> errors.

Read from the source with ``ast`` (imports inside functions count too), so a late import cannot hide
an upward arrow."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "finetune_cli"

# Lower number = lower layer. A module may import its own top-level package, or a strictly lower layer.
LAYERS = {
    "errors": 0, "fsutil": 1, "ui": 2, "recipe": 3, "rundir": 4, "checkpoint": 4.5, "inputs": 4.7,
    "data": 5, "metrics": 5, "viz": 5,
    "models": 6, "objectives": 7, "engine": 8, "augment": 8,
    "pipelines": 9, "cli": 10, "__main__": 11,
}


def _top(module: str) -> str:
    """``finetune_cli.data.tasks`` -> ``data``; ``finetune_cli`` itself -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path, root: Path) -> list[tuple[int, str]]:
    """``(line, imported finetune_cli module)`` for every import in the file, relative ones resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    me = _module_name(path, root)
    pkg = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == root.name]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] == root.name:
                # `from finetune_cli import rundir` imports the submodule
                if mod == root.name:
                    out += [(node.lineno, f"{mod}.{a.name}" if (root / a.name).is_dir()
                             or (root / f"{a.name}.py").is_file() else mod) for a in node.names]
                else:
                    out.append((node.lineno, mod))
    return out


def violations(root: Path, layers: dict[str, int] = LAYERS) -> list[str]:
    bad = []
    for path in sorted(root.rglob("*.py")):
        me = _module_name(path, root)
        src = _top(me)
        if src == "__init__":
            continue
        if src not in layers:
            bad.append(f"{path}: package `{src}` has no layer in LAYERS")
            continue
        for line, mod in imports_of(path, root):
            dst = _top(mod)
            if dst == src or dst == "__init__":
                continue
            if dst not in layers:
                bad.append(f"{path}:{line}: imports `{mod}`, which has no layer")
            elif layers[dst] >= layers[src]:
                bad.append(f"{path}:{line}: `{src}` (layer {layers[src]}) imports `{mod}` "
                           f"(layer {layers[dst]}): imports must point down")
    return bad


def test_layers_import_only_downward():
    assert violations(PKG) == []


def test_every_package_has_a_layer():
    tops = {p.stem if p.is_file() else p.name for p in PKG.iterdir()
            if (p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists())) and p.stem != "__init__"}
    assert tops <= set(LAYERS), tops - set(LAYERS)


def _fake_package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "finetune_cli"
    for name, text in files.items():
        f = root / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    for d in [root, *[p for p in root.rglob("*") if p.is_dir()]]:
        (d / "__init__.py").touch()
    return root


@pytest.mark.parametrize("files, culprit", [
    # the circle this architecture cut: the recipe reaching up into objectives (late import, too)
    ({"recipe.py": "def f():\n    from finetune_cli.objectives import registry\n", "objectives/registry.py": ""},
     "recipe.py:2"),
    ({"recipe.py": "from finetune_cli.pipelines.probe import build\n", "pipelines/probe.py": ""}, "recipe.py:1"),
    ({"engine/trainer.py": "from ..pipelines import train\n", "pipelines/train.py": ""}, "trainer.py:1"),
    ({"data/tasks.py": "from finetune_cli import metrics\n", "metrics/x.py": ""}, "tasks.py:1"),
])
def test_an_upward_import_is_caught(tmp_path, files, culprit):
    bad = violations(_fake_package(tmp_path, files))
    assert len(bad) == 1 and culprit in bad[0], bad


def test_downward_imports_pass(tmp_path):
    root = _fake_package(tmp_path, {"cli/train.py": "from finetune_cli.pipelines import train\n",
                                    "pipelines/train.py": "from ..engine.trainer import Trainer\n",
                                    "engine/trainer.py": "from finetune_cli import rundir\n", "rundir.py": ""})
    assert violations(root) == []


def test_pipelines_stay_thin():
    """A pipeline composes and returns a result; parsing, fitting and formatting live below or in cli."""
    def lines(paths):
        return sum(len(p.read_text().splitlines()) for p in paths)

    pipes = sorted((PKG / "pipelines").glob("*.py"))
    total = lines(PKG.rglob("*.py"))
    assert lines(pipes) <= 0.20 * total, f"pipelines: {lines(pipes)} of {total} lines"
    fat = {p.name: lines([p]) for p in pipes if lines([p]) > 200}
    assert not fat, fat


# ---- no circle, also between two modules of one package ---------------------------------------

def import_graph(root: Path) -> dict[str, set[str]]:
    """``module -> modules of the package it imports`` (late imports too). ``from pkg import sub``
    counts as importing ``pkg.sub``; importing a package counts as importing its ``__init__``."""
    mods = {_module_name(p, root) for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        me = _module_name(path, root)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        out = set()
        for _line, mod in imports_of(path, root):
            out.add(mod)
        for node in ast.walk(tree):  # `from finetune_cli.engine import rng`: the submodule
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == root.name:
                out |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in mods}
        graph[me] = {m for m in out if m in mods and m != me}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _without_package_inits(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """A package's ``__init__`` re-exports its modules, and those import their siblings through the
    package: that is not a design circle, so ``__init__`` modules are left out."""
    inits = {m for m in graph if (PKG.parent / m.replace(".", "/") / "__init__.py").is_file()}
    return {k: v - inits for k, v in graph.items() if k not in inits}


def test_no_import_circle_anywhere():
    assert cycles(_without_package_inits(import_graph(PKG))) == []


def test_a_circle_inside_a_package_is_caught(tmp_path):
    root = _fake_package(tmp_path, {"engine/trainer.py": "from finetune_cli.engine.distributed import x\n",
                                    "engine/distributed.py": "def f():\n    from finetune_cli.engine import trainer\n"})
    assert violations(root) == []  # the layer rule alone cannot see it
    assert cycles(import_graph(root)) == [["finetune_cli.engine.distributed", "finetune_cli.engine.trainer"]]


# ---- a recipe is resolved once ------------------------------------------------------------------

def test_objectives_are_looked_up_by_name_only_where_the_plan_is_made():
    """Below the pipelines nobody re-derives the objective from its name: ``objective_class(`` and
    ``registry.get(`` appear only in ``objectives/`` and ``pipelines/recipes.py``."""
    allowed = {PKG / "pipelines" / "recipes.py"}
    bad = [f"{p.relative_to(PKG)}:{i}" for p in sorted(PKG.rglob("*.py"))
           if p not in allowed and "objectives" not in p.relative_to(PKG).parts
           for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
           if "objective_class(" in line or "registry.get(" in line]
    assert bad == []


# ---- short functions ----------------------------------------------------------------------------

MAX_FUNCTION_LINES = 60


def long_functions(root: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """Functions longer than ``limit`` lines (``def`` to last line) without a ``# long:`` comment
    giving the reason in their first lines."""
    out = []
    for path in sorted(root.rglob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                head = lines[node.lineno - 1: node.body[0].lineno + 2]
                if n > limit and not any("# long:" in ln for ln in head):
                    out.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({n} lines)")
    return out


def test_no_function_over_60_lines_without_a_reason():
    assert long_functions(PKG) == []


def test_a_long_function_is_caught_unless_it_says_why(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(70))
    root = _fake_package(tmp_path, {"a.py": f"def f():\n{body}", "b.py": f"def g():  # long: a table\n{body}"})
    assert [x.split()[1] for x in long_functions(root)] == ["f"]


# ---- one home each: checkpoints, the metrics log, JSON output; the trainer keeps the loop --------

def _code_lines(path: Path) -> list[tuple[int, str]]:
    """``(line number, text)`` of the lines that are code: comments and docstrings say what a file
    holds elsewhere, so only string literals and names in code count."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                docs |= set(range(first.lineno, first.end_lineno + 1))
    return [(i, ln.split("#", 1)[0]) for i, ln in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if i not in docs]


# what only the Checkpointer may name, and what only the metrics log may name
HOMES = {
    "checkpoint.py": ('"checkpoint-', "checkpoint-{", "trainer_state.json", '"rng-'),
    "rundir.py": ('"metrics.jsonl"',),
}


def stray_names(root: Path) -> list[str]:
    bad = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for home, names in HOMES.items():
            if rel == home:
                continue
            bad += [f"{rel}:{i}: {n}" for i, code in _code_lines(path) for n in names if n in code]
    return bad


def test_checkpoints_and_the_metrics_log_have_one_home_each():
    """The checkpoint folders' names and files appear in ``checkpoint.py`` only (the Checkpointer),
    ``metrics.jsonl`` in ``rundir.py`` only (``RunDir.metrics``); every other module goes through them."""
    assert stray_names(PKG) == []


def test_a_stray_checkpoint_or_metrics_name_is_caught(tmp_path):
    root = _fake_package(tmp_path, {
        "checkpoint.py": 'P = "checkpoint-"\n',
        "engine/trainer.py": '"""Writes checkpoint-<step>/."""\nck = run / f"checkpoint-{step}"  # a copy\n',
        "viz/curves.py": 'log = run / "metrics.jsonl"\n'})
    assert stray_names(root) == ['engine/trainer.py:2: "checkpoint-', 'engine/trainer.py:2: checkpoint-{',
                                 'viz/curves.py:1: "metrics.jsonl"']


def test_json_output_only_through_the_command_seam():
    """No command prints its own JSON: ``_emit_json`` is called in ``cli/common.py`` only."""
    bad = [f"{p.relative_to(PKG)}:{i}" for p in sorted(PKG.rglob("*.py")) if p != PKG / "cli" / "common.py"
           for i, code in _code_lines(p) if "emit_json(" in code or "json.dumps(" in code and "cli" in p.parts]
    assert bad == []


def test_every_command_goes_through_the_seam():
    """Each function registered as a command is wrapped by ``cli.common.command``."""
    from finetune_cli.cli.main import app

    def commands(t):
        for info in t.registered_commands:
            yield info.name or info.callback.__name__, info.callback
        for g in t.registered_groups:
            yield from commands(g.typer_instance)

    found = dict(commands(app))
    assert len(found) >= 13, sorted(found)
    bare = [name for name, cb in found.items() if not getattr(cb, "through_seam", False)]
    assert bare == [], bare


MAX_TRAINER_LINES = 500


def test_the_trainer_keeps_the_loop_only():
    """``engine/trainer.py`` holds the loop; what it is built from, its state and its records live in
    ``engine/setup.py``, ``engine/state.py``, the Checkpointer and the metrics log."""
    n = len((PKG / "engine" / "trainer.py").read_text(encoding="utf-8").splitlines())
    assert n <= MAX_TRAINER_LINES, f"engine/trainer.py: {n} lines"


def test_one_recipe_type_for_training_and_probes():
    """A probe recipe is a :class:`Recipe` with a ``probe`` section: no second recipe class whose
    sections and rules could drift from the training recipe's."""
    import dataclasses

    from finetune_cli import recipe as recipe_mod
    from finetune_cli.pipelines.recipes import load_probe_recipe

    recipes = [c for c in vars(recipe_mod).values() if isinstance(c, type) and dataclasses.is_dataclass(c)
               and {"model", "objective", "train"} <= {f.name for f in dataclasses.fields(c)}]
    assert recipes == [recipe_mod.Recipe]
    r = load_probe_recipe("probe_sequential")
    assert type(r) is recipe_mod.Recipe and r.probe is not None and "data" not in r.to_dict()
    assert "probe" not in recipe_mod.parse_recipe("quickstart").to_dict()  # a training recipe's tree as before
