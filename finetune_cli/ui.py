"""All terminal output: one rich Console on stderr, progress, log lines and errors.

Human output goes to stderr so that ``--json`` output on stdout stays machine-readable. When
stderr is not a terminal, or ``CI`` is set, progress becomes plain log lines.

Under a launcher (``torchrun``, ``accelerate launch``) only the main process (``RANK`` 0) writes:
the other ranks run the same code with a silent UI, so every line appears once.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

# ---- which process is this ------------------------------------------------------------------
# The one source of a process's rank for every layer (the UI, ``--json`` output, the engine's
# ``Processes`` and so its trainer). It lives here, the lowest layer that needs it, because the UI
# must know it before (and without) the engine joining a process group.


# Set by ``finetune train --nproc``'s launcher (``engine/launch.py``) for its workers: a folder where a
# failing worker leaves its exit code and error line instead of printing it; the launcher prints
# the one line that explains the run's failure.
REPORTS_ENV = "FINETUNE_REPORTS"


def launched_world_size() -> int:
    """Processes a launcher started (1 without one)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def launched_rank() -> int:
    """This process's rank: ``RANK`` as the launcher set it; 0 without a launcher (or with a launcher
    of one process).

    Why the environment and not the process group: ``torchrun`` and ``accelerate launch`` set
    ``RANK``/``WORLD_SIZE`` before the process starts, so the rank is known before any process group
    exists (the UI is built and errors are rendered before the engine joins one, and some commands
    never do); and the group joined later (``env://``, through accelerate's ``PartialState``) takes
    its rank from the same variable, so the engine's ``Processes.rank`` and accelerate's
    ``process_index`` are this number (``engine.distributed.init_distributed`` checks that they
    agree)."""
    return int(os.environ.get("RANK", "0")) if launched_world_size() > 1 else 0


def is_main_process(rank: Optional[int] = None) -> bool:
    """Whether ``rank`` (default: this process's, :func:`launched_rank`) is the main process, the one
    that prints and writes: rank 0 of a launched run, or a process no launcher started. The one
    answer everyone asks (``UI``, ``--json`` output, ``Processes.is_main``, the trainer)."""
    return (launched_rank() if rank is None else rank) == 0


def _plain() -> bool:
    return bool(os.environ.get("CI")) or not sys.stderr.isatty()


class UI:
    """The one place that writes to the terminal. Pipelines receive an instance."""

    def __init__(self, quiet: bool = False, console: Optional[Console] = None):
        # Not a terminal (a pipe, a CI log): no 80-column limit, so tables are never cut ("quick…").
        width = None if not _plain() else int(os.environ.get("COLUMNS", "0") or 0) or 200
        self.console = console or Console(stderr=True, highlight=False, soft_wrap=True, width=width,
                                          force_terminal=None if not _plain() else False)
        self.main = is_main_process()
        self.quiet = quiet or not self.main
        self.plain = _plain()

    def log(self, msg: str) -> None:
        if not self.quiet:
            self.console.print(msg, markup=False)

    def rule(self, title: str) -> None:
        if not self.quiet:
            self.console.rule(title) if not self.plain else self.console.print(f"== {title} ==", markup=False)

    def print(self, obj: Any) -> None:
        """A result (a table, a summary line): like every line but errors and warnings, not with -q."""
        if not self.quiet:
            self.console.print(obj)

    def error(self, msg: str) -> None:
        if self.main:  # other ranks fail alike (or are stopped by the launcher): one line, not N
            self.console.print(f"error: {msg}", markup=False, style="bold red" if not self.plain else None)

    def warn(self, msg: str) -> None:
        if self.main:
            self.console.print(f"warning: {msg}", markup=False, style="yellow" if not self.plain else None)

    def progress(self, total: int, description: str, transient: bool = False) -> ProgressHandle:
        return ProgressHandle(self, total, description, transient)


class ProgressHandle:
    """A progress bar (TTY) or periodic plain lines (CI / pipes); same calls either way."""

    def __init__(self, ui: UI, total: int, description: str, transient: bool):
        self.ui, self.total, self.description = ui, total, description
        self._bar: Optional[Progress] = None
        self._task = None
        self.transient = transient

    def __enter__(self) -> ProgressHandle:
        if not self.ui.quiet and not self.ui.plain:
            self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeRemainingColumn(),
                                 console=self.ui.console, transient=self.transient)
            self._bar.__enter__()
            self._task = self._bar.add_task(self.description, total=self.total, info="")
        return self

    def update(self, completed: int, info: str = "", force_line: bool = False) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=completed, info=info)
        elif not self.ui.quiet and force_line:
            self.ui.log(f"{self.description} {completed}/{self.total} {info}".rstrip())

    def log(self, msg: str) -> None:
        if self._bar is not None:
            self._bar.console.print(msg, markup=False)
        else:
            self.ui.log(msg)

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)

