"""The ``finetune`` command: assembles one Typer module per subcommand."""

from __future__ import annotations

import typer

from finetune_cli import __version__
from finetune_cli.cli import probe, recipes
from finetune_cli.cli.augment import augment
from finetune_cli.cli.embed import embed_cmd
from finetune_cli.cli.eval import eval_cmd
from finetune_cli.cli.predict import predict_cmd
from finetune_cli.cli.report import report_cmd
from finetune_cli.cli.train import train

app = typer.Typer(
    name="finetune",
    help="Fine-tune pre-trained text encoders with modern objectives, and measure what they do.",
    no_args_is_help=True,
    add_completion=False,
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


def _version(value: bool) -> None:
    if value:
        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                      help="Print the version and exit.")) -> None:
    """finetune: fine-tune text encoders (BERT/RoBERTa family) with modern objectives."""
