"""Where this replica stands in a multi-replica job, from the cluster environment (Vertex AI's
``CLUSTER_SPEC``, or torch's ``MASTER_ADDR`` / ``MASTER_PORT`` / ``WORLD_SIZE`` / ``RANK``)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from components.errors import GnnflowError


@dataclass(frozen=True)
class ClusterSpec:
    """This replica's place in a multi-replica job, as the cluster environment describes it."""

    num_replicas: int
    replica_rank: int
    master_addr: str
    master_port: int
    rpc_port: int


def cluster_from_environment(environ: Mapping[str, str] = os.environ) -> ClusterSpec | None:
    """The job this replica belongs to, or None for a local run.

    Vertex AI's `CLUSTER_SPEC` (replicas: the worker pools concatenated in pool order; master:
    workerpool0's first) wins over `MASTER_ADDR`/`MASTER_PORT`/`WORLD_SIZE`/`RANK` (counting
    replicas). GLT's RPC listens on the master port + 1 unless `GNNFLOW_RPC_PORT` says otherwise.
    """
    if environ.get("CLUSTER_SPEC"):
        num_replicas, replica_rank, master_addr, master_port = _parse_cluster_spec(environ["CLUSTER_SPEC"])
    else:
        names = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
        present = [name for name in names if environ.get(name)]
        if not present:
            return None
        if missing := [name for name in names if name not in present]:
            raise GnnflowError(f"cluster environment is incomplete: {', '.join(present)} set but {', '.join(missing)} missing")
        master_addr, master_port = environ["MASTER_ADDR"], _integer(environ["MASTER_PORT"], "MASTER_PORT", 1, 65535)
        num_replicas = _integer(environ["WORLD_SIZE"], "WORLD_SIZE", 1)
        replica_rank = _integer(environ["RANK"], "RANK", 0, num_replicas - 1)
    rpc_port = _integer(environ.get("GNNFLOW_RPC_PORT") or str(master_port + 1), "GNNFLOW_RPC_PORT", 1, 65535)
    if rpc_port == master_port:
        raise GnnflowError(f"GNNFLOW_RPC_PORT={rpc_port} must differ from the master port")
    return ClusterSpec(num_replicas, replica_rank, master_addr, master_port, rpc_port)


def _parse_cluster_spec(text: str) -> tuple[int, int, str, int]:
    """(num_replicas, replica_rank, master_addr, master_port) from Vertex AI's CLUSTER_SPEC."""
    try:
        spec = json.loads(text)
        pools, task_type, task_index = spec["cluster"], spec["task"]["type"], int(spec["task"]["index"])
        order = sorted(pools, key=lambda name: int(re.fullmatch(r"workerpool(\d+)", name).group(1)))  # type: ignore[union-attr]
        replicas = [(name, index, address) for name in order for index, address in enumerate(pools[name])]
        replica_rank = next(i for i, (name, index, _) in enumerate(replicas) if (name, index) == (task_type, task_index))
        host, _, port = replicas[0][2].rpartition(":")
        return len(replicas), replica_rank, host.strip("[]"), _integer(port, "the master's port", 1, 65535)
    except (ValueError, KeyError, TypeError, AttributeError, IndexError, StopIteration, GnnflowError) as error:
        raise GnnflowError(f"CLUSTER_SPEC is not a valid Vertex AI cluster spec ({type(error).__name__}: {error}): {text[:200]}") from None


def _integer(text: str, name: str, low: int, high: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        raise GnnflowError(f"{name}={text!r} is not an integer") from None
    if value < low or (high is not None and value > high):
        raise GnnflowError(f"{name}={value} is not in [{low}, {'inf' if high is None else high}]")
    return value


def publishes_here(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this process's replica publishes a step's output: every local run; replica 0 of a cluster."""
    cluster = cluster_from_environment(environ)
    return cluster is None or cluster.replica_rank == 0
