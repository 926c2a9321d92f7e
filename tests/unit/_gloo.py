"""Two-process CPU (gloo) harness for the distributed objective tests.

The process group meets through a ``FileStore`` in the test's temporary directory rather than a
``tcp://`` store on a free port. A TCP store makes rank 0 host a libuv server thread; a CI run
once lost rank 0 to SIGABRT at teardown ("terminate called without an active exception"), which
points at that thread (it did not reproduce locally, so this is the likely cause, not a proven
one). A free port picked in the parent can also be taken by another process before rank 0 binds
it. A file store has neither a server thread nor a port. The abort still came back with the file
store (~1 run in 10 of test_distributed_simcse.py here), at interpreter shutdown: workers now end
with ``os._exit(0)`` once their work and teardown are done (see ``_run_and_exit``); 30 runs in a row
passed after that, against 3 failures in 28 before.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2


@contextmanager
def process_group(rank: int, store: str):
    """The gloo group of one worker. On success it waits at a barrier before tearing down, so
    neither process destroys gloo while the other still talks to it; on an error it tears down at
    once (a barrier would wait forever for a process that is gone)."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        yield
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _run_and_exit(rank: int, fn, *args) -> None:
    """Run one worker, then leave with ``os._exit(0)``: the worker has saved its result and torn its
    group down, and skipping the interpreter's shutdown skips the C++ static destructors, where a
    still-joinable gloo thread aborted ~1 in 10 runs ("terminate called without an active
    exception"). A worker that raises still exits through the exception, as before."""
    import os

    fn(rank, *args)
    os._exit(0)


def spawn(fn, tmp_path: Path, *args, timeout: float = 120.0) -> list:
    """Run ``fn(rank, store, out, *args)`` on WORLD processes and return what each saved with
    :func:`save` into ``out``, in rank order. Raises if a process fails, or ``TimeoutError`` (after
    killing them) if they have not finished within ``timeout`` seconds: a hung collective must fail
    the test, not hang the suite."""
    store = tmp_path / "gloo.store"
    store.unlink(missing_ok=True)
    ctx = mp.start_processes(_run_and_exit, args=(fn, str(store), str(tmp_path), *args), nprocs=WORLD,
                             join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=max(0.0, deadline - time.monotonic())):
        if time.monotonic() >= deadline:
            for p in ctx.processes:
                p.kill()
            raise TimeoutError(f"{fn.__name__}: {WORLD} gloo processes still running after {timeout:.0f} s")
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]


def save(rank: int, out: str, result: dict) -> None:
    """What a worker hands back to :func:`spawn` (tensors; the process exits right after)."""
    torch.save(result, f"{out}/rank{rank}.pt")
