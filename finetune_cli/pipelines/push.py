"""``finetune push``: a run's model folder (card, weights, tokenizer) to the Hugging Face Hub with
``huggingface_hub``'s ``upload_folder``. Everything before the upload (which folder, which files,
whether the card is one the Hub reads, whether the repo id is valid) is checked offline first."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

from finetune_cli.checkpoint import run_model_dir
from finetune_cli.errors import FinetuneError, ModelError, OutputError, error_text
from finetune_cli.models.card import hub_base_model, rename_card
from finetune_cli.rundir import RunDir, holds_model


def push_after_training(run_dir: Path, output, ui, summary: dict[str, Any]) -> None:
    """``output.push_to_hub``: the finished run's model folder up (private with ``output.hub_private``),
    as ``finetune push`` sends it; the commit's URL goes in ``summary["pushed"]``. A failure (offline,
    no token, no rights) is one line saying the run is complete and kept, and how to push it later."""
    repo_id = output.push_to_hub
    if not repo_id:
        return
    try:
        res = run_push(str(run_dir), repo_id, private=output.hub_private)
    except FinetuneError as e:
        raise OutputError(f"the run {run_dir} is complete and kept, but pushing it failed: {e}; push it later "
                          f"with `finetune push {run_dir} {repo_id}`") from None
    ui.log(f"pushed {res.folder} to {repo_id}: {res.url}")
    summary["pushed"] = str(res.url)


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
    folder = run_model_dir(RunDir(p)) if RunDir(p).is_run() else p
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


def check_adapter(folder: Path) -> None:
    """A LoRA adapter folder names its base by a hub id: a local path (a base trained or stored on
    this machine) cannot be found by whoever downloads the adapter."""
    from finetune_cli.models.lora import is_adapter_folder
    from finetune_cli.models.st_folder import folder_json
    from finetune_cli.rundir import ADAPTER_CONFIG

    if not is_adapter_folder(folder):
        return
    base = folder_json(folder / ADAPTER_CONFIG).get("base_model_name_or_path")
    if not isinstance(base, str) or hub_base_model(base) != base:
        raise ModelError(f"{folder}/{ADAPTER_CONFIG}: the adapter's base model is the local path {base}, which "
                         f"nobody who downloads it can load; push the base model first and train over its hub id, "
                         f"or push a merged folder (finetune export {folder} --merge -o DIR)")


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


def check_repo_id(repo_id: str, where: str = "") -> None:
    """A ``user/name`` repo id the Hub accepts (``where``: what the error line starts with)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise FinetuneError(f"{where}repo id {repo_id!r} is not valid: {error_text(e, 160)}") from None
    if repo_id.count("/") != 1:
        raise FinetuneError(f"{where}repo id {repo_id!r} must be `user/name` or `organisation/name`")


def hub_card(folder: Path, repo_id: str) -> bytes:
    """The card as it goes up: named by the repo id (title, snippets, model-index) instead of the
    folder's name, so its snippets load the model from the Hub as written."""
    return rename_card((folder / "README.md").read_text(encoding="utf-8"), repo_id).encode("utf-8")


def _upload(folder: Path, files: list[str], repo_id: str, private: bool, revision: Optional[str],
            message: str) -> str:
    """One commit of ``files`` (the card renamed for ``repo_id``): ``HfApi.create_commit``, what
    ``upload_folder`` itself calls."""
    from huggingface_hub import CommitOperationAdd, HfApi

    api = HfApi()
    ops = [CommitOperationAdd(path_in_repo=f, path_or_fileobj=hub_card(folder, repo_id) if f == "README.md"
                              else str(folder / f)) for f in files]
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        if revision:
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        info = api.create_commit(repo_id, operations=ops, commit_message=message, revision=revision)
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
    check_adapter(folder)
    files = folder_files(folder)
    res = PushResult(repo_id, str(folder), files, private, revision, dry_run)
    if dry_run:
        return res
    url = _upload(folder, files, repo_id, private, revision, f"finetune push {folder.parent.name}/{folder.name}")
    return PushResult(repo_id, str(folder), files, private, revision, False, url)
