"""The one command seam of the CLI: option types, and :func:`command`, which every subcommand goes
through for its UI, its errors, ``--json`` and ``--expect``."""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import math
import os
import signal
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from finetune_cli.errors import FinetuneError, error_text
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
CudaGraphsOpt = Annotated[str, typer.Option(
    "--cuda-graphs",
    help="off | auto | on: replay the forward passes from CUDA graphs, one per padded batch width (inputs padded to "
         "multiples of 32 tokens); on is refused where it cannot run, auto uses them on a CUDA GPU.")]
StrideOpt = Annotated[Optional[int], typer.Option(
    "--stride", min=0, help="Read a row longer than the length in overlapping windows sharing this many tokens "
                            "and average their logits per row, instead of cutting it (a classifier; single texts "
                            "only).")]
ThresholdOpt = Annotated[Optional[str], typer.Option(
    "--threshold", metavar="NUMBER|tuned",
    help="Multi-label: a label is predicted when its probability is at least this; a number in (0, 1) for every "
         "label, or `tuned` for the per-label thresholds the run tuned on its evaluation data. Default: the tuned "
         "ones when the model has them, else its model.threshold.", show_default=False)]
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


def _emit_json(obj: Any) -> None:
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
            raise _fail(ui, getattr(e, "exit_code", 2), error_text(str(e), ERROR_LINE_CHARS)) from None
        except KeyboardInterrupt as e:
            raise _fail(ui, 130, error_text(str(e)) or "interrupted") from None
        except Exception as e:  # noqa: BLE001 - the last resort: never a bare traceback
            if debug_enabled():
                traceback.print_exc(file=sys.stderr)
            known = output_error(e, None, "access") if is_write_failure(e) else _peer_lost(e)
            if known is not None:
                raise _fail(ui, known.exit_code, error_text(str(known))) from None
            where = ""
            tb = traceback.extract_tb(e.__traceback__)
            if tb:
                where = f" at {Path(tb[-1].filename).name}:{tb[-1].lineno}"
            hint = "" if debug_enabled() else "; rerun with --debug for the traceback"
            raise _fail(ui, 1, error_text(f"unexpected {type(e).__name__}{where}: {e}", 300) + hint) from None

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


# ---- the command seam --------------------------------------------------------------------------

@dataclass
class View:
    """What a command hands back to :func:`command`: ``doc``, the ``--json`` document; ``render(ui)``,
    the human view (on stderr through the UI, tables and lines); ``gated()``, the metrics ``--expect``
    is checked against (None: the command has no quality gate), or ``enforce(gates, ui)`` where the
    check is more than one set of metrics (a run's final evaluation, every seed's)."""

    doc: Any
    render: Callable[[UI], None] = lambda ui: None
    gated: Optional[Callable[[], Mapping[str, float]]] = None
    enforce: Optional[Callable[[Sequence[Any], UI], None]] = None

    def check(self, gates: Sequence[Any], ui: UI) -> None:
        if not gates:
            return
        if self.enforce is not None:
            self.enforce(gates, ui)
        elif self.gated is not None:
            from finetune_cli.metrics.gates import enforce

            enforce(gates, self.gated(), ui)


def command(fn: Callable[..., Optional[View]]) -> Callable[..., None]:
    """The one seam every subcommand goes through. ``fn`` takes the command-line parameters, plus
    ``ui`` (this invocation's :class:`UI`, quiet with ``--quiet``) and ``gates`` (``--expect``
    parsed before any work, so a bad bound fails first) when it names them; those two are hidden
    from the command line. It returns a :class:`View` (or None when it printed what it had to, e.g.
    ``recipes show``): the seam prints its JSON document with ``--json`` and renders it otherwise,
    then enforces ``--expect``. Errors become one line and an exit code (:func:`handle_errors`)."""
    sig = inspect.signature(fn, eval_str=True)
    injected = [n for n in ("ui", "gates") if n in sig.parameters]

    @functools.wraps(fn)
    @handle_errors
    def run(*args: Any, **kwargs: Any) -> None:
        from finetune_cli.metrics.gates import parse_expectations

        ui = UI(quiet=bool(kwargs.get("quiet", False)))
        gates = parse_expectations(kwargs.get("expect") or [])
        extra = {"ui": ui, "gates": gates}
        view = fn(*args, **kwargs, **{k: extra[k] for k in injected})
        if view is None:
            return
        if kwargs.get("json_out"):
            _emit_json(view.doc)
        else:
            view.render(ui)
        view.check(gates, ui)

    run.__signature__ = sig.replace(parameters=[p for n, p in sig.parameters.items() if n not in injected])  # type: ignore[attr-defined]
    run.through_seam = True  # type: ignore[attr-defined]  # what the architecture test looks for
    return run
