"""Two-process CPU (gloo) harness for the distributed objective tests.

The process group meets through a ``FileStore`` in the test's temporary directory rather than a
``tcp://`` store on a free port. A TCP store makes rank 0 host a libuv server thread; a CI run
once lost rank 0 to SIGABRT at teardown ("terminate called without an active exception"), which
points at that thread (it did not reproduce locally, so this is the likely cause, not a proven
one). A free port picked in the parent can also be taken by another process before rank 0 binds
it. A file store has neither a server thread nor a port.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

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


def spawn(fn, tmp_path: Path, *args) -> None:
    """Run ``fn(rank, store, *args)`` on WORLD processes; raises if any of them fails."""
    store = tmp_path / "gloo.store"
    store.unlink(missing_ok=True)
    mp.start_processes(fn, args=(str(store), *args), nprocs=WORLD, join=True, start_method="spawn")
