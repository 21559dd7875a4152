"""Whether a machine's ``/dev/shm`` holds what the workers of a step will place there.

``/dev/shm`` is a tmpfs: 64 MiB in a podman/docker container and on a Kubernetes pod unless
something larger is mounted there. A worker that outgrows it does not get an error it could
report: torch's or GLT's write into a shared-memory mapping past the end of the tmpfs kills the
process with SIGBUS (a "bus error"), or ``No space left on device`` from deep inside a queue.
The multi-worker steps therefore add up, before loading anything, what their workers will place
there (:class:`ShmNeed`), and refuse to start with one line that names the size needed, the
size free and how to get more. The arithmetic is pure; :func:`free_bytes` is the one look at
the machine.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from components.errors import GnnflowError

SHM_PATH = "/dev/shm"
MiB = 2**20
GiB = 2**30
# Asked for beyond the estimate: NCCL/gloo, torch's own queues and a batch in flight also use
# /dev/shm, and a size with room spares a second failed start.
HEADROOM = 1.25
# Per worker, beside its tensors: the POSIX semaphores of its multiprocessing queues and events
# (a 4 KiB page each) and torch's small shared buffers; measured below 100 KiB a worker.
WORKER_OVERHEAD = 1 * 2**20


@dataclass(frozen=True)
class ShmItem:
    """One kind of tensor the workers of this machine place in shared memory, all workers together."""

    what: str
    bytes: int


@dataclass(frozen=True)
class ShmNeed:
    """What the ``workers`` workers of one machine will place in ``/dev/shm`` at most."""

    step: str
    workers: int
    items: tuple[ShmItem, ...]
    remedies: tuple[str, ...] = ()  # step-specific ways to need less (config keys)

    @property
    def total(self) -> int:
        return sum(item.bytes for item in self.items)

    def summary(self) -> str:
        """'whole feature tables 80 MiB, adjacency 3 MiB' (largest first, empty items left out)."""
        items = sorted((i for i in self.items if i.bytes), key=lambda i: -i.bytes)
        return ", ".join(f"{i.what} {_mib(i.bytes)}" for i in items)


def overhead(workers: int) -> ShmItem:
    """What ``workers`` workers place in ``/dev/shm`` besides their tensors (:data:`WORKER_OVERHEAD`)."""
    return ShmItem("queues and semaphores", workers * WORKER_OVERHEAD)


def shm_size_flag(needed: int) -> str:
    """The ``--shm-size`` value to ask for: the need with headroom, rounded up to 256 MiB below
    1 GiB and to whole GiB above."""
    wanted = needed * HEADROOM
    if wanted <= GiB:
        return f"{max(256, 256 * math.ceil(wanted / (256 * MiB)))}m"
    return f"{math.ceil(wanted / GiB)}g"


def refusal(need: ShmNeed, free: int, path: str = SHM_PATH, mounted: str | None = None) -> str | None:
    """The one-line error when ``need`` does not fit in ``free`` bytes of ``path``, else None.

    ``mounted``: the size the compiled KFP pipeline mounts there (``resources.shm_size``), named
    so that a user on KFP knows which key to raise.
    """
    if need.total <= free:
        return None
    size = shm_size_flag(need.total)
    kfp = (
        f"the compiled KFP pipeline mounts resources.shm_size ({mounted}) there: raise it" if mounted else "on KFP raise resources.shm_size"
    )
    ways = [
        f"give the container a larger {path} (podman/docker run --shm-size={size}; {kfp}; on Kubernetes an emptyDir "
        f"with medium: Memory at {path})",
        "run fewer workers per machine (resources.processes_per_replica, more replicas) or a machine with more memory",
        *need.remedies,
    ]
    return (
        f"{need.step}: the {need.workers} worker(s) on this machine need {_mib(need.total)} of shared memory in {path} "
        f"({need.summary()}), but it has {_mib(free)} free: " + "; or ".join(ways)
    )


def free_bytes(path: str = SHM_PATH) -> int | None:
    """Bytes an unprivileged process may still write to ``path``; None where it does not exist."""
    if not os.path.isdir(path):
        return None
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


def check_room(need: ShmNeed, path: str = SHM_PATH, mounted: str | None = None) -> None:
    """Raises the :func:`refusal` of ``need`` against the free space of ``path`` now (no check
    where ``path`` does not exist: torch then shares memory some other way)."""
    free = free_bytes(path)
    if free is not None and (message := refusal(need, free, path, mounted)):
        raise GnnflowError(message)


def _mib(size: int) -> str:
    return f"{size / MiB:,.0f} MiB" if size >= MiB else f"{size / MiB:.2f} MiB"
