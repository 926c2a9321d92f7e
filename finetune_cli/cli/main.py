"""The ``finetune`` command: assembles one Typer module per subcommand."""

from __future__ import annotations

import sys
from typing import Any

import typer
from typer.core import TyperGroup

from finetune_cli import __version__
from finetune_cli.cli import probe, recipes
from finetune_cli.cli.augment import augment
from finetune_cli.cli.common import one_line, set_debug
from finetune_cli.cli.embed import embed_cmd
from finetune_cli.cli.eval import eval_cmd
from finetune_cli.cli.predict import predict_cmd
from finetune_cli.cli.report import report_cmd
from finetune_cli.cli.sweep import sweep_cmd
from finetune_cli.cli.train import train
from finetune_cli.errors import EXIT_CODES

try:  # recent typer vendors click
    from typer._click import exceptions as _cx
except ImportError:  # pragma: no cover - typer that uses click itself
    from click import exceptions as _cx  # type: ignore[no-redef]

_NO_ARGS_IS_HELP = getattr(_cx, "NoArgsIsHelpError", ())

EPILOG = "Exit codes: " + "; ".join(f"{code} {what}" for code, what in EXIT_CODES.items()) + "."


class OneLineErrors(TyperGroup):
    """Usage errors (``--batch-size 0``, an unknown option, a missing argument) as one stderr line,
    like every other error, instead of click's usage block or Typer's boxed panel: scripts and logs
    read the last line. ``--help`` still shows the full usage."""

    def main(self, args: Any = None, prog_name: Any = None, complete_var: Any = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _NO_ARGS_IS_HELP as e:  # type: ignore[misc]
            if not standalone_mode:
                raise
            e.show()
            sys.exit(e.exit_code)
        except _cx.ClickException as e:
            if not standalone_mode:
                raise
            ctx = getattr(e, "ctx", None)
            where = f"{ctx.command_path}: " if ctx is not None else ""
            hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            typer.echo(f"error: {where}{one_line(e.format_message())}{hint}", err=True)
            sys.exit(e.exit_code)
        except _cx.Abort:
            if not standalone_mode:
                raise
            typer.echo("error: aborted", err=True)
            sys.exit(130)
        if not standalone_mode:
            return rv
        # typer returns the exit code of a `typer.Exit` in non-standalone mode
        sys.exit(rv if isinstance(rv, int) and not isinstance(rv, bool) else 0)


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
app.command("train")(train)
app.command("eval")(eval_cmd)
app.command("augment")(augment)
app.command("embed")(embed_cmd)
app.command("predict")(predict_cmd)
app.add_typer(recipes.app, name="recipes")
app.add_typer(probe.app, name="probe")
app.command("report")(report_cmd)
app.command("sweep")(sweep_cmd)


def _version(value: bool) -> None:
    if value:
        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                      help="Print the version and exit."),
         debug: bool = typer.Option(False, "--debug", envvar="FINETUNE_DEBUG",
                                    help="On an unexpected error, print the Python traceback "
                                         "(also FINETUNE_DEBUG=1).")) -> None:
    """finetune: fine-tune text encoders (BERT/RoBERTa family) with modern objectives."""
    set_debug(debug)
