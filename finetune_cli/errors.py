"""Errors that end a command with a one-line message (rendered by ``ui``) and a non-zero exit."""


class FinetuneError(Exception):
    """Base for user-facing errors: the message says what went wrong and where, on one line."""

    exit_code = 2


class RecipeError(FinetuneError, ValueError):
    """A recipe could not be read or validated. The message is one line, ready for the user."""


class DataError(FinetuneError):
    """Missing file or column, empty or unlabeled data, unseen labels."""


class ModelError(FinetuneError):
    """A model that cannot be found or loaded."""


class DeviceError(FinetuneError):
    """A ``--device`` this machine does not have, or a malformed one."""


class RunDirError(FinetuneError):
    """An output directory that holds a different run."""


class CorruptCheckpointError(RunDirError):
    """A checkpoint file that cannot be read back (truncated, garbage, or an unsafe legacy pickle)."""


class TrainingError(FinetuneError):
    """Training cannot go on (e.g. a non-finite loss)."""

    exit_code = 3
