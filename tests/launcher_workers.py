"""Worker functions for tests/test_launcher.py: spawned processes must import them by name.

Run as `python -m tests.launcher_workers` it is one replica of a simulated cluster job: it
launches `all_reduce_rank` with the cluster environment it was given and prints the
results as JSON.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from components.launcher import WorkerContext, launch


def all_reduce_rank(context: WorkerContext) -> dict[str, int]:
    """All-reduces `rank + 1` over gloo; the sum is world_size * (world_size + 1) / 2."""
    import torch
    import torch.distributed as dist

    context.init_process_group(timeout_s=60)
    value = torch.tensor([context.rank + 1], dtype=torch.int64)
    dist.all_reduce(value)
    return {"rank": context.rank, "world_size": dist.get_world_size(), "sum": int(value.item())}


def fail_or_wait(context: WorkerContext, failure: str, record: str) -> None:
    """Rank 1 fails as `failure` says; the others block in a barrier that never completes.

    Before that, rank 0 holds the RPC port open (as GLT's RPC master would) and every rank
    starts a grandchild and a SysV shared-memory segment (as GLT's samplers would), and
    records their ids in `record` for the test to check that the launcher cleaned them up.
    """
    import torch.distributed as dist

    context.init_process_group(timeout_s=120)
    listener = None
    if context.rank == 0:
        listener = socket.create_server(("127.0.0.1", context.rpc_port))
    grandchild = subprocess.Popen(["sleep", "300"])
    libc = ctypes.CDLL(None, use_errno=True)
    shmid = libc.shmget(0, 1 << 20, 0o600 | 0o1000)  # IPC_PRIVATE, IPC_CREAT
    libc.shmat.restype = ctypes.c_void_p
    libc.shmat(shmid, None, 0)  # attached until the process dies, as GLT's queue is
    facts = {"rank": context.rank, "master_port": context.master_port, "rpc_port": context.rpc_port}
    facts |= {"grandchild": grandchild.pid, "shmid": shmid}
    Path(record, f"rank{context.rank}.json").write_text(json.dumps(facts))
    if context.rank == 1:
        while len(list(Path(record).glob("rank*.json"))) < context.world_size:
            time.sleep(0.05)  # fail only once every rank is set up and waiting
        time.sleep(0.5)
        if failure == "raise":
            raise ValueError("boom at rank 1")
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()
    del listener


def replica_main() -> None:
    """One replica of a simulated cluster job (cluster environment from this process's own)."""
    world_size = int(sys.argv[1])
    results = launch(all_reduce_rank, (), world_size=world_size)
    print(json.dumps(results))


if __name__ == "__main__":
    replica_main()
