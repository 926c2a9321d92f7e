"""Shared CLI plumbing: option types, error handling, JSON output."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from finetune_cli.errors import FinetuneError
from finetune_cli.fsutil import is_write_failure, output_error
from finetune_cli.ui import REPORTS_ENV, UI, is_main_process, launched_world_size

RecipeOpt = Annotated[str, typer.Option("--recipe", "-r", help="YAML recipe file, or the name of a packaged recipe.")]
Overrides = Annotated[Optional[list[str]], typer.Argument(
    help="Recipe overrides: key=value (value parsed as YAML) or ~key to drop a key.", show_default=False)]
ModelArg = Annotated[str, typer.Argument(help="Run directory, model folder, `embedded`, or hub id.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto | cpu | cuda | cuda:N")]
PrecisionOpt = Annotated[str, typer.Option(
    "--precision", help="auto | fp32 | bf16 | fp16. auto: bf16 on a GPU that has it, else fp32 (as "
                        "train.precision); fp16 needs a GPU.")]
DataDirOpt = Annotated[Optional[str], typer.Option(
    "--data-dir", help="Local folder of GLUE-format task folders (SST-2/, RTE/ …) used instead of the hub "
                       "for glue:* datasets. Default: $FINETUNE_DATA_DIR.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as one JSON document on stdout.")]
QuietOpt = Annotated[bool, typer.Option(
    "--quiet", "-q", help="Nothing on stderr but errors and warnings (--json output on stdout is unchanged).")]
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
    if not is_main_process():  # one document, not one per rank
        return
    sys.stdout.write(json.dumps(_json_safe(obj), indent=2, default=str, allow_nan=False) + "\n")
    sys.stdout.flush()


DEBUG_ENV = "FINETUNE_DEBUG"
ERROR_LINE_CHARS = 1000  # an error line quotes input (a header, a value): never more than this
_debug_flag = False


def set_debug(on: bool) -> None:
    """``finetune --debug``: show tracebacks (set by the top-level callback on every invocation)."""
    global _debug_flag
    _debug_flag = on


def debug_enabled() -> bool:
    return _debug_flag or os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def one_line(text: str, limit: int = 0) -> str:
    """Whitespace (newlines included) collapsed; cut at ``limit`` characters when given."""
    s = " ".join(str(text).split())
    return s if not limit or len(s) <= limit else s[: limit - 1] + "…"


def handle_errors(fn: Callable) -> Callable:
    """The one error path of every command: a :class:`FinetuneError` becomes one stderr line and
    its exit code; a failed write (full disk, read-only folder) one line and exit 5; another process
    of a multi-process run lost, one line and exit 6; SIGTERM, like Ctrl-C, exit 130; anything else
    is a bug: one line saying so, exit 1, and the traceback with ``--debug`` / ``FINETUNE_DEBUG=1``."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        ui = UI()
        try:
            with _sigterm_interrupts():
                return fn(*args, **kwargs)
        except (typer.Exit, BrokenPipeError):  # a closed pipe is no failure of ours: see cli/main.py
            raise
        except FinetuneError as e:
            if debug_enabled():
                traceback.print_exc(file=sys.stderr)
            raise _fail(ui, getattr(e, "exit_code", 2), one_line(str(e), ERROR_LINE_CHARS)) from None
        except KeyboardInterrupt as e:
            raise _fail(ui, 130, one_line(str(e)) or "interrupted") from None
        except Exception as e:  # noqa: BLE001 - the last resort: never a bare traceback
            if debug_enabled():
                traceback.print_exc(file=sys.stderr)
            known = output_error(e, None, "access") if is_write_failure(e) else _peer_lost(e)
            if known is not None:
                raise _fail(ui, known.exit_code, one_line(str(known))) from None
            where = ""
            tb = traceback.extract_tb(e.__traceback__)
            if tb:
                where = f" at {Path(tb[-1].filename).name}:{tb[-1].lineno}"
            hint = "" if debug_enabled() else "; rerun with --debug for the traceback"
            raise _fail(ui, 1, one_line(f"unexpected {type(e).__name__}{where}: {e}", 300) + hint) from None

    return wrapper


@contextlib.contextmanager
def _sigterm_interrupts():
    """SIGTERM raises ``KeyboardInterrupt`` for the command's duration (Python's default would end the
    process with -15), so a stop request before or after training exits 130 like Ctrl-C; training
    itself turns both into a checkpoint first (``engine.distributed.StopRequests``)."""
    try:
        old = signal.signal(signal.SIGTERM, signal.default_int_handler)
    except ValueError:  # not the main thread: signals stay as they are
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _peer_lost(e: Exception):
    if launched_world_size() == 1:  # no need to import torch for a one-process error
        return None
    from finetune_cli.engine.distributed import peer_lost

    return peer_lost(e)


def _fail(ui: UI, code: int, line: str) -> typer.Exit:
    """Print the error line (main process only), or, in a worker of ``finetune train --nproc``, hand
    it to the launcher, which prints the one line that explains the run's failure."""
    if os.environ.get(REPORTS_ENV):
        from finetune_cli.engine.launch import write_report

        write_report(code, line)
    else:
        ui.error(line)
    return typer.Exit(code)
