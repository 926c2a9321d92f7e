"""``finetune push``."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from finetune_cli.cli.common import JsonOpt, QuietOpt, View, command
from finetune_cli.ui import UI


@command
def push_cmd(
    ui: UI,
    model: Annotated[str, typer.Argument(help="Run directory (its best/, else final/) or saved model folder.")],
    repo_id: Annotated[str, typer.Argument(help="Hub repository, `user/name` (created when missing).")],
    private: Annotated[bool, typer.Option("--private", help="Create the repository private.")] = False,
    revision: Annotated[Optional[str], typer.Option("--revision", help="Branch to push to (created when "
                                                                        "missing); default: main.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check the folder, card and repo id, list the "
                                                             "files that would go up, upload nothing.")] = False,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Upload a model folder (card, weights, tokenizer) to the Hugging Face Hub with
    huggingface_hub's upload_folder; log in first (`hf auth login` or HF_TOKEN)."""
    from finetune_cli.pipelines.push import run_push

    res = run_push(model, repo_id, private=private, revision=revision, dry_run=dry_run)

    def render(ui: UI) -> None:
        if dry_run:
            ui.print(f"would push {res.folder} to {res.repo_id} ({len(res.files)} files):\n  " + "\n  ".join(res.files))
        else:
            ui.print(f"pushed {res.folder} to {res.repo_id}: {res.url}")

    return View(res.to_dict(), render)
