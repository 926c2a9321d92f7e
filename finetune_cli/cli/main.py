"""The ``finetune`` command: assembles one Typer module per subcommand."""

from __future__ import annotations

import contextlib
import os
import select
import sys
from typing import Any, NoReturn

import typer

from finetune_cli import __version__
from finetune_cli.cli import probe, recipes
from finetune_cli.cli.augment import augment
from finetune_cli.cli.common import set_debug
from finetune_cli.cli.embed import embed_cmd
from finetune_cli.cli.eval import eval_cmd
from finetune_cli.cli.export import export_cmd
from finetune_cli.cli.literal_help import LiteralHelpCommand, LiteralHelpGroup
from finetune_cli.cli.predict import predict_cmd
from finetune_cli.cli.push import push_cmd
from finetune_cli.cli.report import report_cmd
from finetune_cli.cli.sweep import sweep_cmd
from finetune_cli.cli.train import train
from finetune_cli.errors import EXIT_CODES, error_text

EPILOG = "Exit codes: " + "; ".join(f"{code} {what}" for code, what in EXIT_CODES.items()) + "."


class OneLineErrors(LiteralHelpGroup):
    """Usage errors (``--batch-size 0``, an unknown option, a missing argument) as one stderr line,
    like every other error, instead of click's usage block or Typer's boxed panel: scripts and logs
    read the last line. ``--help`` still shows the full usage.

    Only typer's public exceptions are caught: ``typer.TyperException`` is the base of the usage
    errors of the click code typer carries, ``typer.Abort`` an aborted prompt."""

    def main(self, args: Any = None, prog_name: Any = None, complete_var: Any = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.TyperException as e:
            _usage_error(e)
        except typer.Abort:
            typer.echo("error: aborted", err=True)
            sys.exit(130)
        except BrokenPipeError:
            _closed_pipe()
        except SystemExit as e:
            # typer and rich meet a closed pipe with exit(1), raised while handling the BrokenPipeError
            if isinstance(e.__context__, BrokenPipeError):
                _closed_pipe()
            raise
        # typer returns the exit code of a `typer.Exit` in non-standalone mode
        sys.exit(rv if isinstance(rv, int) and not isinstance(rv, bool) else 0)


def _usage_error(e: typer.TyperException) -> NoReturn:
    if type(e).__name__ == "NoArgsIsHelpError":  # `finetune`, `finetune recipes`: the help, shown already
        e.show()  # type: ignore[attr-defined]
        sys.exit(e.exit_code)
    ctx = getattr(e, "ctx", None)
    where = f"{ctx.command_path}: " if ctx is not None else ""
    hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
    recipe = _recipe_given_as_argument(e, ctx)
    if recipe is not None:  # `finetune train quickstart`: the recipe is an option
        hint = f"; did you mean `{ctx.command_path} -r {recipe}`?"
    msg = error_text(e.format_message())
    typer.echo(f"error: {where}{msg.rstrip('.') if recipe else msg}{hint}", err=True)
    sys.exit(e.exit_code)


def _recipe_given_as_argument(e: typer.TyperException, ctx: Any) -> Any:
    """The first positional word, when ``--recipe`` is missing and that word is no override (no
    ``=``, no ``~``): what the user meant as the recipe."""
    param = getattr(e, "param", None)
    if ctx is None or type(e).__name__ != "MissingParameter" or getattr(param, "name", None) != "recipe":
        return None
    words = [w for w in (ctx.params.get("overrides") or []) if "=" not in w and not w.startswith("~")]
    return words[0] if words else None


def _closed_pipe() -> NoReturn:
    """The reader of stdout went away (``finetune train --help | head -1``): stop quietly with 0, as
    ``git log | head`` does; nobody is left to read the rest. stdout is pointed at /dev/null first,
    or Python's final flush would print its own BrokenPipeError (the recipe of Python's signal docs).
    When it is stderr that closed (``2>&1 | head``), the command did not finish what it was asked:
    exit 1 (there is nowhere left to say why)."""
    stderr_closed = _reader_gone(sys.stderr)
    with contextlib.suppress(OSError, ValueError, AttributeError):  # not a real file (a test runner's)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(1 if stderr_closed else 0)


def _reader_gone(stream: Any) -> bool:
    """Whether ``stream`` is a pipe whose reading end is closed (poll reports an error on it)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        poller = select.poll()
        poller.register(stream.fileno(), select.POLLOUT)
        return any(ev & select.POLLERR for _, ev in poller.poll(0))
    return False


# Exit codes, shown by `finetune --help`; scripts (and examples/ci_gate.sh) rely on them.

app = typer.Typer(
    name="finetune",
    cls=OneLineErrors,
    help="Fine-tune pre-trained text encoders with modern objectives, and measure what they do.",
    epilog=EPILOG,
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish, PowerShell
    pretty_exceptions_enable=False,
)
app.command("train", cls=LiteralHelpCommand)(train)
app.command("eval", cls=LiteralHelpCommand)(eval_cmd)
app.command("augment", cls=LiteralHelpCommand)(augment)
app.command("embed", cls=LiteralHelpCommand)(embed_cmd)
app.command("predict", cls=LiteralHelpCommand)(predict_cmd)
app.command("export", cls=LiteralHelpCommand)(export_cmd)
app.command("push", cls=LiteralHelpCommand)(push_cmd)
app.add_typer(recipes.app, name="recipes")
app.add_typer(probe.app, name="probe")
app.command("report", cls=LiteralHelpCommand)(report_cmd)
app.command("sweep", cls=LiteralHelpCommand)(sweep_cmd)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"finetune {__version__}")
        raise typer.Exit()


@app.callback()
def main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                      help="Print the version and exit."),
         debug: bool = typer.Option(False, "--debug", envvar="FINETUNE_DEBUG",
                                    help="On an unexpected error, print the Python traceback "
                                         "(also FINETUNE_DEBUG=1).")) -> None:
    """finetune: fine-tune text encoders (BERT/RoBERTa family) with modern objectives."""
    set_debug(debug)
