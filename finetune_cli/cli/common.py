"""Shared CLI plumbing: option types, error handling, JSON output."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Annotated, Any, Optional

import typer

from finetune_cli.errors import FinetuneError
from finetune_cli.ui import UI, is_main_process

RecipeOpt = Annotated[str, typer.Option("--recipe", "-r", help="YAML recipe file, or the name of a packaged recipe.")]
Overrides = Annotated[Optional[list[str]], typer.Argument(
    help="Recipe overrides: key=value (value parsed as YAML) or ~key to drop a key.", show_default=False)]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto | cpu | cuda | cuda:N")]
DataDirOpt = Annotated[Optional[str], typer.Option(
    "--data-dir", help="Local folder of GLUE-format task folders (SST-2/, RTE/ …) used instead of the hub "
                       "for glue:* datasets. Default: $FINETUNE_DATA_DIR.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as one JSON document on stdout.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="Only errors on stderr.")]


def emit_json(obj: Any) -> None:
    if not is_main_process():  # one document, not one per rank
        return
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
    sys.stdout.flush()


def handle_errors(fn: Callable) -> Callable:
    """Turn user-facing errors into one line on stderr and a non-zero exit."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        ui = UI()
        try:
            return fn(*args, **kwargs)
        except FinetuneError as e:
            ui.error(str(e))
            raise typer.Exit(getattr(e, "exit_code", 2)) from None
        except KeyboardInterrupt as e:
            ui.error(str(e) or "interrupted")
            raise typer.Exit(130) from None

    return wrapper
