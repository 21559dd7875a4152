"""Whether this machine's shared memory holds what multiprocess sampling will put there.

With ``training.sampling: multiprocess`` every trainer moves its partition's tensors into shared
memory (``/dev/shm``, a tmpfs) for its GLT sampling subprocesses, and each of its loaders opens
a System V shared-memory channel that the subprocesses fill with batches. A container's
``/dev/shm`` is 64 MiB unless the runtime is told otherwise, so a step there would die deep in
GLT with a bus error or ``shmget failed``; checking when the worker starts names the remedy.
"""

from __future__ import annotations

import os

from components.errors import GnnflowError

CHANNEL_BYTES = 256 * 2**20  # one loader's sampling channel (GLT's default size)
_MiB = 2**20


def check_sampling_memory(
    partition_bytes: int, loaders: int, local_world_size: int, shm_path: str = "/dev/shm", sysv_table: str = "/proc/sys/kernel"
) -> None:
    """Refuses to start multiprocess sampling that this machine's shared memory cannot hold.

    Args:
        partition_bytes: bytes of this worker's partition tensors (shared with its subprocesses);
            the workers of one machine hold partitions of about the same size.
        loaders: GLT loaders this worker keeps open at once (one channel each).
        local_world_size: worker processes on this machine, all sharing ``shm_path``.
    """
    needed = partition_bytes * local_world_size
    if os.path.isdir(shm_path):
        stats = os.statvfs(shm_path)
        free = stats.f_bavail * stats.f_frsize
        if needed > free:
            size_gb = max(1, -(-int(needed * 1.5) // 2**30))  # room for batches in flight, rounded up to GiB
            raise GnnflowError(
                f"{shm_path} has {free / _MiB:.0f} MiB free, but {local_world_size} worker(s) on this machine share about "
                f"{needed / _MiB:.0f} MiB of partition tensors with their sampling subprocesses (training.sampling: multiprocess): "
                f"give the container a larger {shm_path} (docker/podman run --shm-size={size_gb}g; on Kubernetes an emptyDir "
                f"with medium: Memory mounted at {shm_path}), or set training.sampling: collocated"
            )
    channels = CHANNEL_BYTES * loaders * local_world_size
    limit = _sysv_limit(sysv_table)
    if limit is not None and channels > limit:
        raise GnnflowError(
            f"System V shared memory (kernel.shmall) allows {limit / _MiB:.0f} MiB, but {local_world_size} worker(s) x "
            f"{loaders} loader(s) open {CHANNEL_BYTES // _MiB} MiB sampling channels each ({channels / _MiB:.0f} MiB): raise "
            "kernel.shmall (sysctl, or docker/podman run --sysctl kernel.shmall=...), or set training.sampling: collocated"
        )


def _sysv_limit(table: str) -> int | None:
    """Bytes of System V shared memory this IPC namespace allows in all, or None if unknown."""
    try:
        with open(os.path.join(table, "shmall")) as file:
            pages = int(file.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")
