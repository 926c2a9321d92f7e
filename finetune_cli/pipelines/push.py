"""``finetune push``: a run's model folder (card, weights, tokenizer) to the Hugging Face Hub with
``huggingface_hub``'s ``upload_folder``. Everything before the upload (which folder, which files,
whether the card is one the Hub reads, whether the repo id is valid) is checked offline first."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

from finetune_cli.errors import FinetuneError, ModelError, OutputError, error_text
from finetune_cli.models.card import hub_base_model
from finetune_cli.rundir import RunDir, holds_model


@dataclass(frozen=True)
class PushResult:
    repo_id: str
    folder: str
    files: list[str]
    private: bool
    revision: Optional[str]
    dry_run: bool
    url: Optional[str] = None  # the commit's, once uploaded

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def model_folder(model: str) -> Path:
    """The folder that goes up: a run's model (``best/``, else ``final/``, else its newest
    checkpoint's) or a model folder, which must hold a card (``README.md``) and ``config.json``."""
    p = Path(model).expanduser()
    if not p.is_dir():
        raise ModelError(f"{model} is not a run directory or a model folder")
    folder = RunDir(p).model_dir() if RunDir(p).is_run() else p
    if folder is None or not holds_model(folder):
        raise ModelError(f"{model} holds no saved model (no best/, final/ or checkpoint-*/ with a config.json)")
    if not (folder / "README.md").is_file():
        raise ModelError(f"{folder} has no model card (README.md); it was not written by finetune train")
    return folder


def check_card(folder: Path) -> None:
    """The card parses as the Hub's metadata (``huggingface_hub.ModelCard``, model-index included)
    and names no local path as its ``base_model`` (cards of finetune 0.2.0 could)."""
    from huggingface_hub import ModelCard

    try:
        data = ModelCard.load(folder / "README.md").data
    except Exception as e:  # noqa: BLE001 - yaml and huggingface_hub raise their own types
        raise ModelError(f"{folder}/README.md is not a valid model card: {error_text(e, 160)}") from None
    bases = data.base_model if isinstance(data.base_model, list) else [data.base_model]
    bad = [b for b in bases if b is not None and hub_base_model(str(b)) != b]
    if bad:
        raise ModelError(f"{folder}/README.md names the local path {bad[0]} as base_model, which the Hub cannot "
                         f"link; remove it from the card's metadata (or retrain with this version)")


def folder_files(folder: Path) -> list[str]:
    """The folder's files, relative to it, after refusing anything in it that is not a regular file
    or a folder: ``upload_folder`` follows a symbolic link and uploads what it points to, which may
    lie outside the folder (a token file, a home directory)."""
    files = []
    for root, dirs, names in os.walk(folder):
        for name in sorted([*dirs, *names]):
            p = Path(root) / name
            if p.is_symlink():
                raise ModelError(f"{p} is a symbolic link (to {os.readlink(p)}); push uploads regular files only, "
                                 f"and a link could upload what lies outside {folder}: replace it with a copy "
                                 f"of the file, or remove it")
            if name in names and not p.is_file():
                raise ModelError(f"{p} is not a regular file; remove it before pushing {folder}")
            if name in names:
                files.append(str(p.relative_to(folder)))
    return sorted(files)


def check_repo_id(repo_id: str) -> None:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise FinetuneError(f"repo id {repo_id!r} is not valid: {error_text(e, 160)}") from None
    if repo_id.count("/") != 1:
        raise FinetuneError(f"repo id {repo_id!r} must be `user/name` or `organisation/name`")


def _upload(folder: Path, repo_id: str, private: bool, revision: Optional[str], message: str) -> str:
    from huggingface_hub import HfApi

    api = HfApi()
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        if revision:
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        info = api.upload_folder(folder_path=str(folder), repo_id=repo_id, revision=revision, commit_message=message)
    except Exception as e:  # noqa: BLE001 - offline, no token, no rights, network: one line
        raise OutputError(f"cannot push to {repo_id} on the Hugging Face Hub: {type(e).__name__}: "
                          f"{error_text(e, 200)}") from None
    return str(getattr(info, "commit_url", info))


def run_push(model: str, repo_id: str, *, private: bool = False, revision: Optional[str] = None,
             dry_run: bool = False) -> PushResult:
    """Check, then upload ``model``'s folder to ``repo_id`` (created when missing, ``private`` then;
    ``revision``: a branch, created when missing). ``dry_run``: the checks and the file list only."""
    check_repo_id(repo_id)
    folder = model_folder(model)
    check_card(folder)
    files = folder_files(folder)
    res = PushResult(repo_id, str(folder), files, private, revision, dry_run)
    if dry_run:
        return res
    url = _upload(folder, repo_id, private, revision, f"finetune push {folder.parent.name}/{folder.name}")
    return PushResult(repo_id, str(folder), files, private, revision, False, url)
