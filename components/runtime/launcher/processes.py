"""How worker processes start: forked from multiprocessing's fork server, which has already
imported what the workers need, instead of a fresh interpreter per worker.

A spawned worker spent 6-10 s importing torch, PyG and GLT before its first line of work, on
every launch; a forked one starts in a fraction of a second and shares those pages with its
peers. The fork server is one small, single-threaded process per launcher, started at its
first launch (fork from the launcher itself is not safe: it runs gloo, RPC and OpenMP threads).

A fork server's child inherits the server's environment and standard streams, not the
launcher's at the time of the launch: :class:`LauncherState` carries both over.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import sys
from dataclasses import dataclass, field
from multiprocessing import reduction
from multiprocessing.context import ForkServerContext
from typing import Any

from components.runtime.threads import openmp_wait_policy

# Imported by the fork server where the launcher has them: what every step's worker imports.
_LIBRARIES = ("torch", "torch_geometric", "graphlearn_torch")
_WORKER_MAIN = "components.runtime.launcher.worker"


def worker_processes(worker_module: str) -> ForkServerContext:
    """The multiprocessing context that starts workers; its fork server is running on return.

    The server imports the worker's module and the heavy libraries the launcher has imported,
    once, at its start; a server already running (one per launcher process) keeps its modules.
    """
    context = multiprocessing.get_context("forkserver")
    preload = [_WORKER_MAIN, *(name for name in _LIBRARIES if name in sys.modules)]
    if worker_module != "__main__":  # a script's functions are found through its path instead
        preload.append(worker_module)
    context.set_forkserver_preload(preload)
    openmp_wait_policy()  # before the server imports torch (components/runtime/threads.py says why)
    multiprocessing.forkserver.ensure_running()
    return context


def server_pid() -> int:
    """The fork server's process id: the parent every worker must find it has."""
    pid = multiprocessing.forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]  # noqa: SLF001
    assert pid is not None, "worker_processes() starts the fork server first"
    return int(pid)


class _InheritedFd:
    """A file descriptor of the launcher, duplicated into the worker that unpickles it."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        return _received_fd, (reduction.DupFd(self.fd),)  # the fd travels beside the pickle


def _received_fd(duplicate: Any) -> int:
    return int(duplicate.detach())


@dataclass(frozen=True)
class LauncherState:
    """What a worker takes over from its launcher: the environment (tests and callers change it
    between launches) and the standard streams (where a caller or pytest redirects them)."""

    environment: dict[str, str]
    streams: tuple[Any, Any] = field(default_factory=lambda: (_InheritedFd(1), _InheritedFd(2)))

    @classmethod
    def here(cls) -> LauncherState:
        return cls(dict(os.environ))

    def adopt(self) -> None:
        """In the worker: becomes the launcher's environment and writes to its streams."""
        os.environ.clear()
        os.environ.update(self.environment)
        sys.stdout.flush()
        sys.stderr.flush()
        for target, fd in zip((1, 2), self.streams, strict=True):
            os.dup2(fd, target)
            os.close(fd)
