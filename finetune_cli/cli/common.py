"""Shared CLI plumbing: option types, error handling, JSON output."""

from __future__ import annotations

import functools
import json
import math
import sys
from collections.abc import Callable
from typing import Annotated, Any, Optional

import typer

from finetune_cli.errors import FinetuneError
from finetune_cli.ui import UI

RecipeOpt = Annotated[str, typer.Option("--recipe", "-r", help="YAML recipe file, or the name of a packaged recipe.")]
Overrides = Annotated[Optional[list[str]], typer.Argument(
    help="Recipe overrides: key=value (value parsed as YAML) or ~key to drop a key.", show_default=False)]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto | cpu | cuda | cuda:N")]
DataDirOpt = Annotated[Optional[str], typer.Option(
    "--data-dir", help="Local folder of GLUE-format task folders (SST-2/, RTE/ …) used instead of the hub "
                       "for glue:* datasets. Default: $FINETUNE_DATA_DIR.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as one JSON document on stdout.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="Only errors on stderr.")]
ExpectOpt = Annotated[Optional[list[str]], typer.Option(
    "--expect", help="Quality gate, e.g. 'accuracy>=0.85' or 'ece<=0.05' (repeatable): exit 4 with one line "
                     "naming the metric, its value and the bound when one fails.", show_default=False)]


def _json_safe(obj: Any) -> Any:
    """NaN and ±inf become null: bare NaN is not JSON, and scripts parse this output."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(_json_safe(obj), indent=2, default=str, allow_nan=False) + "\n")
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
