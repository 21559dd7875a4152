"""Starting a step's workers: :func:`launch` (their results by rank) and :func:`launch_staged`
(for workers that write a new generation of a step's output)."""

from __future__ import annotations

import logging
import os
import pickle
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from components.config.resources import DEFAULT_TIMEOUTS, WorkerTimeouts
from components.errors import GnnflowError
from components.runtime.launcher.cluster import ClusterSpec, cluster_from_environment, publishes_here
from components.runtime.launcher.context import WorkerContext
from components.runtime.launcher.supervisor import Supervisor
from components.runtime.rendezvous import host_stores

if TYPE_CHECKING:
    from components.storage import OutputStaging

logger = logging.getLogger("components.runtime.launcher")

R = TypeVar("R")


def launch(
    worker: Callable[..., R],
    args: tuple[Any, ...] = (),
    *,
    world_size: int,
    processes_per_replica: int | None = None,
    environ: Mapping[str, str] = os.environ,
    start_timeout_s: float = 120,
    timeouts: WorkerTimeouts = DEFAULT_TIMEOUTS,
) -> list[R]:
    """Runs `worker(context, *args)` in each worker process of this replica; their results by rank.

    Locally (no cluster environment) this starts `world_size` processes on loopback, even for
    one, so that one worker behaves like many (own GLT/torch.distributed globals, same cleanup).
    On a cluster this replica starts `processes_per_replica` (default `world_size / replicas`)
    and returns their results only. `worker` must be module-level, its arguments and result
    picklable. Raises `WorkerFailed` for the first worker that raises, dies, or is not started
    after `start_timeout_s`, or makes no progress (see components.runtime.watchdog) for
    `timeouts.progress_s` (`timeouts.rendezvous_s` while it waits for its peers to join).
    """
    if world_size < 1:
        raise GnnflowError(f"world_size must be at least 1, got {world_size}")
    cluster = cluster_from_environment(environ)
    stores = []  # referenced until the workers are done: the launcher hosts them locally
    if cluster is None:
        stores = host_stores(2, timeout_s=timeouts.rendezvous_s)
        cluster, per_replica = ClusterSpec(1, 0, "127.0.0.1", stores[0].port, stores[1].port), world_size
    else:
        per_replica = processes_per_replica or world_size // cluster.num_replicas
        if per_replica < 1 or per_replica * cluster.num_replicas != world_size:
            per = processes_per_replica or "world_size / replicas"
            raise GnnflowError(f"world_size {world_size} does not match {cluster.num_replicas} replicas x {per} processes per replica")
    addresses = (cluster.master_addr, cluster.master_port, cluster.rpc_port)
    first = cluster.replica_rank * per_replica
    contexts = [
        WorkerContext(first + local, world_size, local, per_replica, *addresses, bool(stores), timeouts) for local in range(per_replica)
    ]
    logger.info("starting ranks %d-%d of %d; rendezvous %s:%d, RPC port %d", first, contexts[-1].rank, world_size, *addresses)
    # Pickled here, so that a worker the child cannot import fails in its error reporting, not its bootstrap.
    try:
        return Supervisor(contexts, pickle.dumps((worker, args)), worker.__module__, start_timeout_s).run()
    finally:
        stores.clear()  # the servers stop with their last reference (a raised error's traceback keeps this frame)


def launch_staged(
    staging: OutputStaging,
    worker: Callable[..., R],
    args: tuple[Any, ...] = (),
    *,
    world_size: int,
    processes_per_replica: int | None = None,
    timeouts: WorkerTimeouts = DEFAULT_TIMEOUTS,
) -> R | None:
    """:func:`launch` for workers that write into ``staging``, a new generation of a step's output.

    Returns rank 0's result on the replica that publishes (every local run; replica 0 on a
    cluster) and None on the others. If any worker fails, or returns an exception (a way to end
    the step that is not a failure of the workers), that replica deletes what was staged before
    raising it, so the output published before stays as it was.
    """
    publishes = publishes_here()
    try:
        results = launch(worker, args, world_size=world_size, processes_per_replica=processes_per_replica, timeouts=timeouts)
        if stopped := [result for result in results if isinstance(result, BaseException)]:
            raise stopped[0]  # the workers agreed to end the step without an output (train on SIGTERM)
    except BaseException:
        if publishes:
            staging.abort()
        raise
    return results[0] if publishes else None
