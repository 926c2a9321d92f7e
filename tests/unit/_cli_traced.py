"""The real ``finetune`` CLI, instrumented for the multi-process tests (run by torchrun as a script).

Environment knobs (all optional):

- ``TRACE_DIR``: every rank appends what it writes into the run directory (``os.replace`` targets:
  atomic files and directories; ``shutil.rmtree``; the trainer's sweep of stale temp files, ``clean``) to ``TRACE_DIR/rank<R>.log``, and its exit code
  and last step to ``TRACE_DIR/rank<R>.exit`` (``top.*`` for a process no launcher started); the tests read them to check that only the main
  process writes, once.
- ``KILL_AT=<step>``: at the end of that step the main process SIGKILLs the whole job (launcher,
  other ranks, itself): a power cut at a known step.
- ``SIGNAL_AT=<step>:<who>[:<signal>]``: at the end of that step, the main process sends SIGTERM
  (or ``KILL`` …) to ``who``: ``launcher`` (torchrun), ``rank1``, or ``top`` (the process that
  started torchrun, i.e. a ``finetune train --nproc`` parent).
- ``FAIL_AT=<step>:rank<R>``: at the end of that step rank R alone raises a ``DataError``.
- Every rank appends the batches of each epoch the trainer asks for (``epoch_batches``) to
  ``TRACE_DIR/rank<R>.batches`` as JSON lines ``{"epoch", "batches", "padding"}``.
- ``STEP_SLEEP=<seconds>``: sleep after each step, so a signal lands mid-run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time

RANK = os.environ.get("RANK", "0")
WHO = f"rank{RANK}" if "RANK" in os.environ else "top"  # "top": not started by a launcher
TRACE = os.environ.get("TRACE_DIR")
_last_step = {"step": 0}


def _log(line: str) -> None:
    if TRACE:
        with open(os.path.join(TRACE, f"{WHO}.log"), "a") as f:
            f.write(line + "\n")


def _instrument() -> None:
    real_replace, real_rmtree = os.replace, shutil.rmtree

    def replace(src, dst, *a, **k):
        _log(f"replace {dst}")
        return real_replace(src, dst, *a, **k)

    def rmtree(path, *a, **k):
        _log(f"rmtree {path}")
        return real_rmtree(path, *a, **k)

    os.replace, shutil.rmtree = replace, rmtree

    from finetune_cli.engine import trainer as tr

    init = tr.Trainer.__init__

    def patched(self, *a, **k):
        k["callbacks"] = [*k.get("callbacks", ()), _callback]
        init(self, *a, **k)

    tr.Trainer.__init__ = patched

    clean = tr.clean_stale_temps

    def traced_clean(directory):
        _log(f"clean {directory}")
        return clean(directory)

    tr.clean_stale_temps = traced_clean

    batches = tr.epoch_batches

    def traced_batches(*a, **k):
        out = batches(*a, **k)
        if TRACE:
            with open(os.path.join(TRACE, f"{WHO}.batches"), "a") as f:
                f.write(json.dumps({"epoch": a[5], "batches": [list(map(int, b)) for b in out],
                                    "padding": [isinstance(b, tr.Padding) for b in out]}) + "\n")
        return out

    tr.epoch_batches = traced_batches


def _family() -> list[int]:
    import psutil

    launcher = psutil.Process(os.getppid())
    return [launcher.pid] + [p.pid for p in launcher.children() if p.pid != os.getpid()]


def _callback(trainer, state) -> None:
    _last_step["step"] = state.step
    if os.environ.get("STEP_SLEEP"):
        time.sleep(float(os.environ["STEP_SLEEP"]))
    if os.environ.get("KILL_AT") == str(state.step) and RANK == "0":
        for pid in _family():
            os.kill(pid, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
    fail = os.environ.get("FAIL_AT", "")
    if fail == f"{state.step}:{WHO}":
        from finetune_cli.errors import DataError

        raise DataError(f"injected failure on {WHO} at step {state.step}")
    at = os.environ.get("SIGNAL_AT", "")
    if at.split(":")[0] == str(state.step) and RANK == "0":
        import psutil

        who, sig = (at.split(":") + ["TERM"])[1:3]
        launcher = psutil.Process(os.getppid())
        pid = {"launcher": launcher.pid, "top": launcher.ppid(),
               "rank1": next((p.pid for p in launcher.children() if p.pid != os.getpid()), None)}[who]
        os.kill(pid, getattr(signal, f"SIG{sig}"))


if __name__ == "__main__":
    _instrument()
    from finetune_cli.cli.main import app

    code = 0
    try:
        app(args=sys.argv[1:], prog_name="finetune")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        if TRACE:
            with open(os.path.join(TRACE, f"{WHO}.exit"), "w") as f:
                f.write(f"{code} {_last_step['step']}\n")
    sys.exit(code)
