"""The generated reference pages (``scripts/docs_reference.py``): every recipe key, objective
hyper-parameter, command and option is documented, from the code alone."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import re
import sys
import typing
from pathlib import Path

import pytest

from finetune_cli import recipe as recipe_mod
from finetune_cli.objectives import registry

REPO = Path(__file__).resolve().parents[2]


def _load_generator():
    spec = importlib.util.spec_from_file_location("docs_reference", REPO / "scripts" / "docs_reference.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("docs_reference", mod)
    spec.loader.exec_module(mod)
    return mod


ref = _load_generator()


@pytest.fixture(scope="module")
def recipe_page() -> str:
    return ref.recipe_reference()


@pytest.fixture(scope="module")
def cli_page() -> str:
    return ref.cli_reference()


def schema_classes() -> list[type]:
    """Every dataclass of the recipe schema: all those defined in finetune_cli/recipe.py."""
    return [obj for obj in vars(recipe_mod).values()
            if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == recipe_mod.__name__]


def test_every_schema_field_has_a_help():
    classes = schema_classes()
    assert {c.__name__ for c in classes} >= {"Recipe", "ModelConfig", "ColumnMap", "DataConfig", "ObjectiveConfig",
                                             "TrainConfig", "OutputConfig", "SplitConfig",
                                             "ProbeTask", "ClassifierConfig", "ProbeSection"}
    missing = [f"{c.__name__}.{f.name}" for c in classes for f in dataclasses.fields(c)
               if not f.metadata.get("internal") and not str(f.metadata.get("help") or "").strip()]
    assert not missing, f"recipe fields without a help= (one line saying what the key does): {missing}"


def _keys(cls: type, prefix: str = "") -> list[str]:
    """Every dotted key under ``cls``, nested sections expanded (walked here, not by the generator)."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal"):
            continue
        key = f"{prefix}.{f.name}" if prefix else f.name
        out.append(key)
        section = next((a for a in (hints[f.name], *typing.get_args(hints[f.name])) if dataclasses.is_dataclass(a)),
                       None)  # a section, or an optional one (`probe`)
        if section is not None:
            out += _keys(section, key)
    return out


def test_every_recipe_key_is_in_the_reference_with_its_default(recipe_page):
    task = "probe.tasks.<name>"
    keys = set(_keys(recipe_mod.Recipe)) | set(_keys(recipe_mod.ProbeTask, task))
    keys = {k for k in keys if k != "objective.params" and not k.startswith(f"{task}.data.")}
    for key in ("data.columns.hard_neg", "train.refit_head", "probe.classifier.C",
                f"{task}.split.eval_fraction", f"{task}.data", "objective.name"):
        assert key in keys
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([^`]+)` \|.*$", recipe_page, re.M)}
    sections = {k for k in keys if "." not in k}  # model, data, …: a heading each, not a row
    assert sections == {"model", "data", "objective", "train", "output", "probe"}
    assert not sorted(k for k in keys - sections if k not in rows), "keys missing from the reference"
    for section in sections:
        assert f"### `{section}` {{#{section}}}" in recipe_page
    assert "| `train.lr` | float | `2e-05` | > 0 |" in rows["train.lr"]
    assert "| `model.pooling` | str | `mean` | `cls`, `mean`, `pooler` |" in rows["model.pooling"]
    assert "`null`" in rows["data.seed"] and "2^63 − 1" in rows["data.seed"]


def _objective_section(page: str, name: str) -> str:
    start = page.index(f"{{#objective-{name}}}")
    nxt = re.search(r"^#{1,4} ", page[start:], re.M)
    return page[start:start + nxt.start()] if nxt else page[start:]


@pytest.mark.parametrize("name", registry.names())
def test_every_objective_hyperparameter_is_in_the_reference_with_its_default(recipe_page, name):
    assert f"[`{name}`](#objective-{name})" in recipe_page  # listed among objective.name's values
    section = _objective_section(recipe_page, name)
    for key, p in registry.hyperparameters(registry.get(name)).items():
        row = re.search(rf"^\| `objective\.{key}` \| [^|]*(\\\|[^|]*)* \| ([^|]*) \| (.*) \|$", section, re.M)
        assert row, f"objective `{name}`: no row for `{key}`"
        assert row.group(2) == f"`{ref.yaml_value(p.default)}`", f"objective `{name}`: default of `{key}`"
        assert row.group(3).strip(), f"objective `{name}`: `{key}` has no description"


@pytest.mark.parametrize("name", registry.names())
def test_objective_docstring_args_match_the_constructor(name):
    """The Args section documents exactly the constructor's parameters (docstrings drift otherwise)."""
    cls = registry.get(name)
    args = ref.parse_args_section(inspect.getdoc(cls) or "")
    assert list(args) == list(registry.hyperparameters(cls)), f"{cls.__name__}: Args vs __init__"
    assert all(v.strip() for v in args.values())


def test_args_parser_joins_continuations_and_stops_at_the_next_section():
    doc = "Summary.\n\nArgs:\n    tau: temperature.\n        Default 0.3.\n    lam (float): weight.\n\nInputs: text."
    assert ref.parse_args_section(doc) == {"tau": "temperature. Default 0.3.", "lam": "weight."}


def _commands():
    import typer.main

    from finetune_cli.cli.main import app

    def walk(cmd, ctx):
        yield ctx.command_path, cmd, ctx
        for name in getattr(cmd, "commands", {}):
            sub = cmd.commands[name]
            yield from walk(sub, sub.context_class(sub, info_name=name, parent=ctx))

    root = typer.main.get_command(app)
    return list(walk(root, root.context_class(root, info_name="finetune")))


def test_every_command_and_option_is_in_the_cli_reference(cli_page):
    commands = _commands()
    assert {"finetune train", "finetune recipes validate", "finetune probe retention"} <= {p for p, _, _ in commands}
    for path, cmd, ctx in commands:
        start = cli_page.index(f"`{path}` {{#{path.replace(' ', '-')}}}")
        nxt = re.search(r"^#{2,4} ", cli_page[start:], re.M)
        section = cli_page[start:start + nxt.start()] if nxt else cli_page[start:]
        for p in cmd.get_params(ctx):
            if p.name == "help":
                continue
            names = p.opts + p.secondary_opts if p.param_type_name == "option" else [p.name.upper()]
            for n in names:
                assert f"`{n}" in section, f"{path}: {n} missing"
            if getattr(p, "help", None):
                assert ref.md_text(p.help, cell=True) in section, f"{path}: help of {names[0]}"


def test_cli_reference_shows_defaults_and_requirements(cli_page):
    assert "| `--recipe`, `-r` | str | required |" in cli_page
    assert "| `--nproc` | int, ≥ 1 | `1` |" in cli_page
    assert "| `--prune` / `--no-prune` | flag | `--prune` |" in cli_page
    assert "finetune eval [OPTIONS] MODEL [OVERRIDES...]" in cli_page
    assert "(environment: `FINETUNE_DEBUG`)" in cli_page


def test_markdown_escaping():
    assert ref.md_text("a ``x|y`` <b> * c|d", cell=True) == r"a `x|y` &lt;b&gt; \* c\|d"
    assert ref.md_text(":func:`hardness` and ``code``") == "`hardness` and `code`"


def test_hook_adds_the_pages_and_refuses_a_committed_copy(tmp_path):
    pytest.importorskip("mkdocs")
    from mkdocs.config.defaults import MkDocsConfig
    from mkdocs.exceptions import PluginError
    from mkdocs.structure.files import File, Files

    cfg = MkDocsConfig()
    cfg.load_dict({"site_name": "t", "docs_dir": str(tmp_path / "docs"), "site_dir": str(tmp_path / "site")})
    (tmp_path / "docs").mkdir()
    assert cfg.validate() == ([], [])
    cfg.plugins._current_plugin = None  # set by MkDocs while it runs a hook; File.generated reads it
    files = ref.on_files(Files([]), cfg)
    assert sorted(f.src_uri for f in files) == ["reference/cli.md", "reference/recipe.md"]
    committed = Files([File("reference/cli.md", str(tmp_path / "docs"), str(tmp_path / "site"), False)])
    with pytest.raises(PluginError, match="generated"):
        ref.on_files(committed, cfg)


def test_broken_links_in_the_built_site(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "index.html").write_text("x")
    (tmp_path / "img.png").write_text("x")
    (tmp_path / "page.html").write_text(
        '<a href="a/">ok</a><a href="a/index.html#x">ok</a><img src="img.png"><a href="https://x.org/">ext</a>'
        '<a href="#top">ok</a><a href="notes/old.html">broken</a><script src="js/gone.js"></script>')
    assert ref.broken_links(tmp_path) == ["page.html: notes/old.html", "page.html: js/gone.js"]
