"""``finetune recipes list|show|validate``."""

from __future__ import annotations

import re
from typing import Annotated

import typer

from finetune_cli.cli.common import JsonOpt, Overrides, View, command
from finetune_cli.cli.literal_help import LiteralHelpCommand, LiteralHelpGroup
from finetune_cli.pipelines.recipes import load_any
from finetune_cli.recipe import PACKAGED_RECIPES, resolve_recipe_path
from finetune_cli.ui import UI

app = typer.Typer(cls=LiteralHelpGroup, help="List, show and validate recipes.", no_args_is_help=True)


_SENTENCE_END = re.compile(r"[.!?](?=\s+[A-Z]|\s*$)")  # not "e.g. 20", "et al., NeurIPS"


def description(header: str) -> str:
    """A recipe's one-sentence description: the first sentence of its header comment, which may run
    over several lines. The sentence ends at a ``.``, ``!`` or ``?`` followed by a capital letter or
    the end of the text, or where the header's prose ends (an indented line: a command to run; a line that
    is not a comment)."""
    prose: list[str] = []
    for line in header.splitlines():
        if not line.startswith("#"):
            break
        text = line[1:]
        if text.startswith("  ") or not text.strip():  # "#   finetune train …": a usage line
            break
        prose.append(text.strip())
    joined = " ".join(prose)
    m = _SENTENCE_END.search(joined)
    return joined[: m.end()] if m else joined


@app.command("list", cls=LiteralHelpCommand)
@command
def list_cmd(json_out: JsonOpt = False) -> View:
    """List the packaged recipes."""
    rows = []
    for p in sorted(PACKAGED_RECIPES.rglob("*.yaml")):
        r = load_any(p)
        rows.append({"name": str(p.relative_to(PACKAGED_RECIPES).with_suffix("")), "objective": r.objective.name,
                     "description": description(p.read_text())})
    return View(rows, lambda ui: _render_list(rows, ui))


def _render_list(rows: list, ui: UI) -> None:
    from rich.table import Table

    t = Table(title="packaged recipes")
    for c in ("name", "objective", "description"):
        t.add_column(c)
    for row in rows:
        t.add_row(row["name"], row["objective"], row["description"])
    ui.print(t)


@app.command("show", cls=LiteralHelpCommand)
@command
def show_cmd(name: Annotated[str, typer.Argument(help="Recipe name or file.")]) -> None:
    """Print a recipe file as written."""
    typer.echo(resolve_recipe_path(name).read_text(), nl=False)


@app.command("validate", cls=LiteralHelpCommand)
@command
def validate_cmd(file: Annotated[str, typer.Argument(help="Recipe name or file.")], overrides: Overrides = None,
                 json_out: JsonOpt = False) -> View:
    """Validate a recipe (with overrides) without loading any model; print the resolved recipe."""
    r = load_any(file, overrides or [])

    def render(ui: UI) -> None:
        typer.echo(r.to_yaml(), nl=False)
        ui.log(f"ok: {file} is a valid recipe (objective {r.objective.name})")

    return View(r.to_dict(), render)
