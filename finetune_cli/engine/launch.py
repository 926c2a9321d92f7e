"""``finetune train --nproc N``: the same command again, under ``torchrun``, so a script needs no
launcher knowledge.

The child is ``python -m finetune_cli.engine.launch --standalone --nproc_per_node N <this program>
<the same arguments without --nproc>`` (this program: ``-m finetune_cli``, or the script that was
run, e.g. the ``finetune`` entry point): torchrun's own agent, run by :func:`agent`, so that a
failure ends as one line, not torchrun's ``ChildFailedError`` traceback. ``--standalone`` picks a
free local rendezvous port, so two such runs on one machine do not collide. This process only
waits: SIGINT/SIGTERM are passed to the agent, which passes them to every rank; the ranks agree on
a step, write one checkpoint and exit 130, and so does this process. The agent runs in its own
session, so a terminal's Ctrl-C reaches it once (through us), not twice; and it is told to receive
SIGTERM should this process die, so it never trains on as an orphan.

Failures: a worker that fails leaves its exit code and error line in the folder named by
``ui.REPORTS_ENV`` (and prints nothing); the agent picks the line that explains the run
(:func:`verdict`), prints it and exits with its code.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from finetune_cli.errors import PeerLostError
from finetune_cli.fsutil import atomic_write_json
from finetune_cli.ui import REPORTS_ENV, UI, launched_rank, launched_world_size

INTERRUPTED = 130


def without_nproc(argv: Sequence[str]) -> list[str]:
    """``argv`` minus ``--nproc N`` / ``--nproc=N`` (the child must not relaunch itself)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            out.append(a)
    return out


def torchrun_command(nproc: int, argv: Sequence[str], program: str) -> list[str]:
    """``program``: ``sys.argv[0]`` of this process."""
    p = Path(program)
    me = ["-m", "finetune_cli"] if (p.name == "__main__.py" and p.parent.name == "finetune_cli") or not p.is_file() \
        else [str(p)]
    return [sys.executable, "-m", "finetune_cli.engine.launch", "--standalone", f"--nproc_per_node={nproc}",
            *me, *without_nproc(argv)]


def should_relaunch(nproc: int) -> bool:
    """``--nproc`` > 1 and not already one of a launcher's processes."""
    return nproc > 1 and launched_world_size() == 1


def relaunch(nproc: int, argv: Sequence[str], program: str) -> int:
    """Run the launcher child, forward stop signals to it, and return the exit code to use (130 if
    a signal stopped the run)."""
    from finetune_cli.engine.distributed import set_parent_death_signal

    child = subprocess.Popen(torchrun_command(nproc, argv, program), start_new_session=True,
                             preexec_fn=set_parent_death_signal)
    got: list[int] = []

    def forward(signum, frame):
        got.append(signum)
        if child.poll() is None:
            child.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        rc = child.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return INTERRUPTED if got else rc


# ---- the launcher child: torchrun's agent, one line on failure ---------------------------------

def write_report(code: int, line: str) -> None:
    """In a worker: leave this process's exit code and error line for the agent (``REPORTS_ENV``)."""
    atomic_write_json(Path(os.environ[REPORTS_ENV]) / f"rank{launched_rank()}.json", {"code": code, "line": line})


def read_reports(folder: Path) -> dict[int, tuple[int, str]]:
    """rank -> (exit code, error line) of every worker that failed through the CLI's error path."""
    out = {}
    for f in folder.glob("rank*.json"):
        d = json.loads(f.read_text())
        out[int(f.stem[4:])] = (int(d["code"]), str(d["line"]))
    return out


def verdict(reports: dict[int, tuple[int, str]], exits: dict[int, int], world: int) -> tuple[int, str]:
    """The exit code and the one line of a failed run, from the workers' ``reports`` and the
    ``exits`` torchrun saw (rank -> exit code, negative: killed by that signal).

    In order: a worker's own error (the lowest rank's), not one caused by the others; then a worker
    that died without a word (killed, e.g. out of memory: a lost process, exit 6; a crash outside
    the CLI's error path keeps its code; one the agent stopped with SIGTERM only when no other died
    so); then a worker's report that a peer was lost; then an interruption."""
    lost = PeerLostError.exit_code
    own = sorted(r for r, (c, _) in reports.items() if c not in (lost, INTERRUPTED))
    if own:
        return reports[own[0]]
    # The agent stops the survivors with SIGTERM, and a rank it stops before its handler writes a
    # report is silent too: a rank dead of anything else is the cause (seen in a CI run: rank 1
    # SIGKILLed, rank 0 SIGTERMed without a report, and the line named rank 0).
    silent = sorted((r for r, c in exits.items() if c != 0 and r not in reports),
                    key=lambda r: (exits[r] == -signal.SIGTERM, r))
    if silent:
        r, c = silent[0], exits[silent[0]]
        how = f"was killed by {signal.Signals(-c).name}" if c < 0 else f"exited with code {c} without an error line"
        return c if c > 0 else lost, (f"process {r} of {world} {how}, so the run stopped; rerun the same "
                                      f"command to resume from the last checkpoint")
    for code in (lost, INTERRUPTED):
        ranks = sorted(r for r, (c, _) in reports.items() if c == code)
        if ranks:
            return reports[ranks[0]]
    return 1, f"the launcher failed with no worker failure (exits: {exits}); rerun with --debug"


EXITS_ENV = "FINETUNE_LAUNCH_EXITS"


def _record_exits(exits: dict[int, int], code: int) -> None:
    """``$FINETUNE_LAUNCH_EXITS``, when set: the failed ranks' exit codes as torchrun saw them
    (negative: killed by that signal) and the run's code, as JSON. What a rank reports from its own
    ``finally`` is lost when it is killed; this record is the launcher's, written either way."""
    path = os.environ.get(EXITS_ENV)
    if path:
        Path(path).write_text(json.dumps({"exits": {str(r): c for r, c in exits.items()}, "code": code}))


def agent(argv: Sequence[str]) -> int:
    """torchrun (``argv``: its arguments) in this process; on a failure or a stop signal, print the
    one line of :func:`verdict` and return its exit code instead of torchrun's traceback."""
    import logging
    import shutil
    import tempfile

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    args = parse_args(list(argv))
    folder = Path(tempfile.mkdtemp(prefix="finetune-reports-"))
    os.environ[REPORTS_ENV] = str(folder)
    logging.disable(logging.ERROR)  # torchrun's own log lines about failed or stopped workers
    exits: dict[int, int] = {}
    try:
        try:
            run(args)
            return 0
        except ChildFailedError as e:
            exits = {r: f.exitcode for r, f in e.failures.items()}
        except SignalException:  # stopped by the parent: the workers were told and have exited
            pass
        code, line = verdict(read_reports(folder), exits, int(args.nproc_per_node))
        _record_exits(exits, code)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    UI().error(line)
    return code


if __name__ == "__main__":
    sys.exit(agent(sys.argv[1:]))
