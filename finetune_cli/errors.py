"""Errors that end a command with a one-line message (rendered by ``ui``) and a non-zero exit.

Exit codes (also in the README and ``finetune --help``):

====  ==========================================================================================
0     success
1     an unexpected internal error (a bug): one line, and ``--debug`` / ``FINETUNE_DEBUG=1`` for
      the traceback
2     bad input: a command-line usage error, a recipe, data, model, device or run-directory problem
3     the run cannot go on (a non-finite loss, a precision this device lacks, out of device
      memory at this batch size)
4     a quality gate (``--expect``) failed: the metric missed its bound
5     an output cannot be written or an input file cannot be read: a path that is a file, a
      read-only folder, a full disk
6     a process of a multi-process run was lost (killed, out of memory, its machine gone); the
      others stopped too: rerun the same command to resume from the last checkpoint
130   interrupted (Ctrl-C / SIGTERM); a checkpoint was saved, rerun to resume
====  ==========================================================================================
"""

import difflib
from collections.abc import Iterable

EXIT_CODES: dict[int, str] = {
    0: "success",
    1: "unexpected internal error (rerun with --debug for the traceback)",
    2: "bad input: usage, recipe, data, model, device or run directory",
    3: "the run cannot go on (non-finite loss, unsupported precision, out of device memory)",
    4: "a quality gate (--expect) failed: the metric missed its bound",
    5: "cannot write an output or read a file (path is a file, read-only, disk full), "
       "or `finetune push` cannot reach the Hub",
    6: "a process of a multi-process run was lost (killed, out of memory); rerun to resume",
    130: "interrupted (Ctrl-C / SIGTERM); rerun the same command to resume",
}


class FinetuneError(Exception):
    """Base for user-facing errors: the message says what went wrong and where, on one line."""

    exit_code = 2


class RecipeError(FinetuneError, ValueError):
    """A recipe could not be read or validated. The message is one line, ready for the user."""


class DataError(FinetuneError):
    """Missing file or column, empty or unlabeled data, unseen labels, undecodable text."""


class ModelError(FinetuneError):
    """A model that cannot be found or loaded."""


class DeviceError(FinetuneError):
    """A ``--device`` this machine does not have, or a malformed one."""


class RunDirError(FinetuneError):
    """An output directory that holds a different run, or a run directory that is damaged."""


class CorruptCheckpointError(RunDirError):
    """A checkpoint file that cannot be read back (missing, truncated or garbage)."""


class TrainingError(FinetuneError):
    """The run cannot go on (a non-finite loss, out of device memory at this batch size)."""

    exit_code = 3


class OutputError(FinetuneError):
    """A file or folder cannot be written (or read) for a reason outside the tool: the path is a
    file or lies under one, the folder is read-only, the disk is full."""

    exit_code = 5


class PeerLostError(FinetuneError):
    """Another process of a multi-process run died (killed, out of memory, its machine gone), so
    this one cannot go on."""

    exit_code = 6


def error_text(err: BaseException | str, limit: int | None = None) -> str:
    """The message of ``err`` (an exception or a text) on one line (whitespace, newlines included,
    collapsed), cut at ``limit`` characters when given (its last one then ``…``): the reason part of
    the one-line errors above, and the error line itself."""
    s = " ".join(str(err).split())
    return s if not limit or len(s) <= limit else s[: limit - 1] + "…"


def did_you_mean(word: str, options: Iterable[str], cutoff: float = 0.6) -> str:
    """``; did you mean `x`?`` for the option closest in spelling to ``word`` (``difflib``, at least
    ``cutoff`` alike), or "" when none is: the hint the error messages append."""
    m = difflib.get_close_matches(word, list(options), n=1, cutoff=cutoff)
    return f"; did you mean `{m[0]}`?" if m else ""
