"""Worker functions for tests/test_launcher.py: spawned processes must import them by name.

Run as `python -m tests.launcher_workers` it is a launcher in a process of its own: one
replica of a simulated cluster job, or a launcher for a test to signal (see `main`).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from components.runtime.launcher import WorkerContext, launch


def _write_facts(record: str, rank: int, facts: dict[str, object]) -> None:
    """Writes `record/rank<N>.json` atomically: the test reads it as soon as it appears."""
    partial = Path(record, f".rank{rank}.json.partial")
    partial.write_text(json.dumps(facts))
    partial.rename(Path(record, f"rank{rank}.json"))


def all_reduce_rank(context: WorkerContext) -> dict[str, int]:
    """All-reduces `rank + 1` over gloo; the sum is world_size * (world_size + 1) / 2."""
    import torch
    import torch.distributed as dist

    context.init_process_group()
    value = torch.tensor([context.rank + 1], dtype=torch.int64)
    dist.all_reduce(value)
    return {
        "rank": context.rank,
        "world_size": dist.get_world_size(),
        "sum": int(value.item()),
        "malloc_arenas": os.environ.get("MALLOC_ARENA_MAX"),
    }


def fail_or_wait(context: WorkerContext, failure: str, record: str) -> None:
    """Rank 1 fails as `failure` says ("raise", "exit" or "sigkill"); the others block in a
    barrier that never completes.

    Before that, every rank starts a grandchild, a SysV shared-memory segment (as GLT's queues) and a /dev/shm file
    (torch's file_system sharing), and records their ids in `record` for the test to check
    that the launcher cleaned them up.
    """
    import torch
    import torch.distributed as dist
    import torch.multiprocessing

    context.init_process_group()
    grandchild = subprocess.Popen(["sleep", "300"])
    libc = ctypes.CDLL(None, use_errno=True)
    shmid = libc.shmget(0, 1 << 20, 0o600 | 0o1000)  # IPC_PRIVATE, IPC_CREAT
    libc.shmat.restype = ctypes.c_void_p
    libc.shmat(shmid, None, 0)  # attached until the process dies, as GLT's queue is
    torch.multiprocessing.set_sharing_strategy("file_system")  # a named /dev/shm file, unlike the default
    shared = torch.zeros(1024).share_memory_()
    shm_files = [name for name in os.listdir("/dev/shm") if name.startswith(f"torch_{os.getpid()}_")]
    facts = {"rank": context.rank, "master_port": context.master_port, "rpc_port": context.rpc_port}
    facts |= {"pid": os.getpid(), "grandchild": grandchild.pid, "shmid": shmid, "shm_files": shm_files}
    _write_facts(record, context.rank, facts)
    if context.rank == 1:
        while len(list(Path(record).glob("rank*.json"))) < context.world_size:
            time.sleep(0.05)  # fail only once every rank is set up and waiting
        time.sleep(0.5)
        if failure == "raise":
            raise ValueError("boom at rank 1")
        if failure == "exit":
            os._exit(3)
        if failure == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()
    del shared


def wait_forever(context: WorkerContext, record: str) -> None:
    """Starts a grandchild, records both pids in `record`, then waits (no torch: fast to start)."""
    grandchild = subprocess.Popen(["sleep", "300"])
    facts = {"rank": context.rank, "pid": os.getpid(), "grandchild": grandchild.pid}
    _write_facts(record, context.rank, facts)
    time.sleep(300)


def glt_rpc_round(context: WorkerContext, fail: bool) -> list[int]:
    """Joins GLT's RPC (on `rpc_port`) beside gloo and all-gathers the ranks over RPC.

    With `fail`, rank 1 then raises while rank 0 waits in GLT's RPC barrier.
    """
    import graphlearn_torch as glt

    glt.distributed.init_worker_group(world_size=context.world_size, rank=context.rank, group_name="launcher-test")
    context.init_rpc(num_rpc_threads=2)
    context.init_process_group()
    ranks = sorted(glt.distributed.all_gather(context.rank).values())
    if fail and context.rank == 1:
        raise RuntimeError(f"RPC worker failed at rank 1, having gathered ranks {ranks}")
    glt.distributed.barrier()
    glt.distributed.shutdown_rpc()
    return ranks


def main() -> None:
    """`all_reduce WORLD_SIZE`: one replica of a cluster job described by this process's
    environment; `hang RECORD_DIR`: two local workers that wait until this process is signalled."""
    if sys.argv[1] == "all_reduce":
        print(json.dumps(launch(all_reduce_rank, (), world_size=int(sys.argv[2]))))
    else:
        launch(wait_forever, (sys.argv[2],), world_size=2, environ={})


if __name__ == "__main__":
    main()
