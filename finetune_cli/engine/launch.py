"""``finetune train --nproc N``: the same command again, under ``torchrun``, so a script needs no
launcher knowledge.

The child is ``python -m torch.distributed.run --standalone --nproc_per_node N <this program>
<the same arguments without --nproc>`` (this program: ``-m finetune_cli``, or the script that was
run, e.g. the ``finetune`` entry point): ``--standalone`` picks a free local rendezvous port, so two
such runs on one machine do not collide. This process only waits: SIGINT/SIGTERM are passed to
torchrun, which passes them to every rank; the ranks agree on a step, write one checkpoint and
exit 130, and so does this process. torchrun runs in its own session, so a terminal's Ctrl-C
reaches it once (through us), not twice; and it is told to receive SIGTERM should this process die,
so it never trains on as an orphan.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from finetune_cli.ui import launched_world_size


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
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            *me, *without_nproc(argv)]


def should_relaunch(nproc: int) -> bool:
    """``--nproc`` > 1 and not already one of a launcher's processes."""
    return nproc > 1 and launched_world_size() == 1


def relaunch(nproc: int, argv: Sequence[str], program: str) -> int:
    """Run the torchrun child, forward stop signals to it, and return the exit code to use (130 if
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
    return 130 if got else rc
