"""One thread policy for every step: how a replica's cores are split between its workers' torch
intra-op threads, GLT sampling subprocesses, faiss and pyarrow's readers.

The cores are those this process may run on: its CPU affinity, capped by a cgroup CPU quota
(a Kubernetes CPU limit, a KFP task's ``cpu`` request made a limit), or ``resources.threads.cores``.
Each of the replica's local workers gets an equal share. Within a share:

- **collocated sampling** (the trainer samples its own batches, and serves its peers' requests
  on GLT's RPC thread): the computation takes the share less the core that RPC thread needs,
  from shares of 4 cores up (a smaller share, and a lone trainer without peers: all of it);
- **multiprocess sampling**: GLT's sampling subprocesses (one thread each) take a third of the
  share (at least one), the computation the rest;
- **no sampling beside the computation** (full-graph training, inference, faiss searches, the
  data steps' readers): the whole share.

Every count is overridable under ``resources.threads`` (and ``training.sampling_workers``).
Oversubscribing (more busy threads than cores) is what the policy avoids: on 2 cores, two
trainers with two intra-op threads each ran slower than with one.

Idle OpenMP threads sleep instead of spinning (``OMP_WAIT_POLICY=PASSIVE``, see
:func:`openmp_wait_policy`) unless the environment says otherwise: on a 2-core machine shared
with other work, a worker's two intra-op threads spun out their time slices between operations
and every parallel operation then waited milliseconds for the preempted one (a 213k-element
ReLU: 0.02 ms on one thread, 7-12 ms on two spinning, 0.03-0.04 ms on two sleeping; a full-graph
CiteSeer epoch of GCNII 2.7 s against 0.15 s, benchmarks/full_graph_epoch.py).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # the policy itself needs no config (benchmarks/thread_policy.py runs it bare)
    from components.config.resources import ThreadsSpec

log = logging.getLogger("gnnflow.runtime")

Work = Literal["collocated", "multiprocess", "compute"]
# Shares of at least this many cores keep one for GLT's RPC thread (collocated sampling with
# peers): on 16 vCPUs 15 threads computed 0.94x as fast as 16, but 1 thread 0.62x as fast as 2
# (benchmarks/thread_policy.py, RESULTS); the mostly idle RPC thread shares a small one.
RPC_CORE_FROM_SHARE = 4
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
OPENMP_WAIT_POLICY = "PASSIVE"  # the module docstring says why


def openmp_wait_policy(environ: MutableMapping[str, str] = os.environ) -> str:
    """Sets ``OMP_WAIT_POLICY`` for the worker processes about to start, unless it is set already;
    returns the policy they get. OpenMP reads it once, when torch loads it: this must run before
    the process that imports torch for the workers (the launcher's fork server) starts."""
    return environ.setdefault("OMP_WAIT_POLICY", OPENMP_WAIT_POLICY)


def replica_cores(cgroup_cpu_max: Path = CGROUP_CPU_MAX) -> int:
    """Cores this process may use: its CPU affinity, capped by a cgroup v2 quota (rounded up)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = cgroup_cpu_max.read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass  # no cgroup v2 quota here
    return max(1, cores)


@dataclass(frozen=True)
class ThreadPlan:
    """Threads of one worker."""

    cores: int  # the replica's
    local_workers: int
    compute: int  # torch intra-op threads
    sampling_workers: int  # GLT sampling subprocesses (multiprocess sampling; 0 otherwise)
    faiss: int  # faiss's OpenMP threads (retrieval)
    readers: int  # pyarrow's CPU pool (reading and decoding tables)

    def describe(self) -> str:
        sampling = f", {self.sampling_workers} sampling subprocess(es)" if self.sampling_workers else ""
        return (
            f"{self.cores} core(s) for {self.local_workers} local worker(s): {self.compute} compute thread(s){sampling}, "
            f"{self.faiss} faiss, {self.readers} reader thread(s) each"
        )


def plan_threads(
    cores: int,
    local_workers: int,
    work: Work,
    *,
    compute: int | None = None,
    sampling_workers: int | None = None,
    faiss: int | None = None,
    readers: int | None = None,
) -> ThreadPlan:
    """The policy (module docstring); a given count wins over the derived one."""
    share = max(1, cores // max(1, local_workers))
    if work == "multiprocess":
        samplers = sampling_workers or max(1, share // 3)
        derived_compute = max(1, share - samplers)
    else:
        samplers = 0
        derived_compute = share - 1 if work == "collocated" and share >= RPC_CORE_FROM_SHARE else share
    return ThreadPlan(
        cores=cores,
        local_workers=local_workers,
        compute=compute or derived_compute,
        sampling_workers=samplers,
        faiss=faiss or share,
        readers=readers or share,
    )


def use_worker_threads(threads: ThreadsSpec, local_workers: int, rank: int, work: Work, sampling_workers: int | None = None) -> ThreadPlan:
    """Plans this worker's threads from ``resources.threads`` and applies them; rank 0 logs the plan."""
    plan = plan_threads(
        threads.cores or replica_cores(),
        local_workers,
        work,
        compute=threads.compute,
        sampling_workers=sampling_workers,
        faiss=threads.faiss,
        readers=threads.readers,
    )
    apply_threads(plan)
    if rank == 0:
        log.info("threads: %s; idle OpenMP threads: %s", plan.describe(), os.environ.get("OMP_WAIT_POLICY", "OpenMP's default wait"))
    return plan


def apply_threads(plan: ThreadPlan) -> None:
    """Sets torch's intra-op threads and pyarrow's CPU pool (faiss's are set where it searches;
    sampling subprocesses are started with the plan's count)."""
    import pyarrow as pa
    import torch

    torch.set_num_threads(plan.compute)
    pa.set_cpu_count(plan.readers)
