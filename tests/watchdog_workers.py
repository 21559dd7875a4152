"""Worker functions for tests/test_watchdog.py: spawned processes must import them by name."""

from __future__ import annotations

import os
import time

from components.runtime import watchdog
from components.runtime.launcher import WorkerContext
from tests.launcher_workers import _write_facts


def _record_pid(record: str, rank: int) -> None:
    _write_facts(record, rank, {"pid": os.getpid()})


def all_reduce_forever(context: WorkerContext, record: str) -> None:
    """Every rank computes a little, then all-reduces, for ever: progress until a peer stops."""
    import torch
    import torch.distributed as dist

    context.init_process_group()
    _record_pid(record, context.rank)
    while True:
        watchdog.mark("computing")
        time.sleep(0.05)
        value = torch.ones(1)
        with watchdog.phase("all-reduce"):
            dist.all_reduce(value)


def late_peer(context: WorkerContext, record: str) -> None:
    """Rank 1 never reaches the rendezvous (it is stuck before it, marking nothing); the others
    wait there for it."""
    _record_pid(record, context.rank)
    if context.rank == 1:
        time.sleep(3600)
    context.init_process_group()
