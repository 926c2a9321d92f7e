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
    "errors": 0, "fsutil": 1, "ui": 2, "recipe": 3, "rundir": 4,
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
    fat = {p.name: lines([p]) for p in pipes if lines([p]) > 250}
    assert not fat, fat
