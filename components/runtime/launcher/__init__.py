"""Runs one function in N worker processes (Linux), here or across the replicas of a cluster job.

Each worker gets a `WorkerContext`: its rank and the rendezvous addresses for torch.distributed
(gloo; plus nccl for workers on GPUs) and GLT's RPC. The first worker that raises or dies ends the step within seconds (its peers
are usually blocked in a collective), everything the workers started dies with them, and the caller
gets a `WorkerFailed` naming rank and cause.
"""

from components.runtime.launcher.cluster import ClusterSpec, cluster_from_environment, publishes_here
from components.runtime.launcher.context import VERBOSE_ENV, WorkerContext, WorkerFailed, verbose
from components.runtime.launcher.launch import launch, launch_staged
from components.runtime.launcher.supervisor import WORKER_MALLOC_ARENAS

__all__ = [
    "VERBOSE_ENV",
    "WORKER_MALLOC_ARENAS",
    "ClusterSpec",
    "WorkerContext",
    "WorkerFailed",
    "cluster_from_environment",
    "launch",
    "launch_staged",
    "publishes_here",
    "verbose",
]
