"""What a worker process is handed (:class:`WorkerContext`), how many threads it computes with,
and how a failed worker is reported (:class:`WorkerFailed`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from components.config.resources import DEFAULT_TIMEOUTS, WorkerTimeouts
from components.errors import GnnflowError
from components.runtime import watchdog
from components.runtime.rendezvous import joining_hosted_store, rpc_starting

VERBOSE_ENV = "GNNFLOW_VERBOSE"  # set (by --verbose) to log the traceback of every worker error


class WorkerFailed(GnnflowError):
    """A worker raised or died and the step was stopped; `traceback` is the worker's, if any."""

    def __init__(self, rank: int, reason: str, worker_traceback: str | None = None) -> None:
        super().__init__(f"worker rank {rank} failed: {reason}")
        self.rank, self.reason, self.traceback = rank, reason, worker_traceback

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.rank, self.reason, self.traceback)


@dataclass(frozen=True)
class WorkerContext:
    """Where one worker process stands in the job; passed as the worker's first argument."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int  # torch.distributed rendezvous (a TCPStore: the launcher's locally, rank 0's on a cluster)
    rpc_port: int  # GLT's RPC rendezvous, likewise
    stores_hosted: bool = False  # the launcher hosts both stores (see components.runtime.rendezvous)
    timeouts: WorkerTimeouts = DEFAULT_TIMEOUTS  # resources.{rendezvous,progress,rpc}_timeout_s

    def init_process_group(self, backend: str = "gloo") -> None:
        """Joins the process group of all workers (blocks until every rank has joined, at most
        ``timeouts.rendezvous_s``, which is also the collectives' timeout).

        ``backend``: gloo, or for workers on GPUs ``cpu:gloo,cuda:nccl`` (components/gnn/device.py).
        """
        import torch.distributed as dist

        address, timeout = f"tcp://{self.master_addr}:{self.master_port}", timedelta(seconds=self.timeouts.rendezvous_s)
        with joining_hosted_store(self.stores_hosted), watchdog.phase("rendezvous"):
            dist.init_process_group(backend, init_method=address, rank=self.rank, world_size=self.world_size, timeout=timeout)

    def init_rpc(self, num_rpc_threads: int) -> None:
        """Joins GLT's RPC (after ``glt.distributed.init_worker_group``), its calls timing out
        after ``timeouts.rpc_s``."""
        import graphlearn_torch as glt

        with joining_hosted_store(self.stores_hosted), watchdog.phase("rendezvous"), rpc_starting():
            glt.distributed.init_rpc(
                master_addr=self.master_addr, master_port=self.rpc_port, num_rpc_threads=num_rpc_threads, rpc_timeout=self.timeouts.rpc_s
            )


def verbose() -> bool:
    """Whether a worker's expected errors (GnnflowError) are logged with their traceback too."""
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")
