"""Named multiprocessing resources (semaphores, POSIX shared memory) that worker processes
register with the launcher's resource tracker, followed so that the launcher can free those a
worker never released.

A worker ends with ``os._exit`` (or is killed), so the finalizers that would unlink its queues'
and events' semaphores never run; the shared tracker then warns about "leaked semaphore objects"
when the launcher exits, after every failed run. Workers report each registration to the
launcher, which unlinks and unregisters whatever is left once they are gone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from multiprocessing import resource_tracker

Resource = tuple[str, str]  # (name, resource type as the tracker names it)


def report_registrations(send: Callable[[tuple], None]) -> None:
    """In a worker: forwards every (un)registration with the resource tracker to ``send`` as
    ``("resource", "register" | "unregister", name, rtype)``."""
    register, unregister = resource_tracker.register, resource_tracker.unregister

    def registering(name: str, rtype: str) -> None:
        register(name, rtype)
        send(("resource", "register", name, rtype))

    def unregistering(name: str, rtype: str) -> None:
        unregister(name, rtype)
        send(("resource", "unregister", name, rtype))

    # multiprocessing looks these up on the module at each call (synchronize, shared_memory).
    # (typeshed types the name as Sized; multiprocessing passes strings.)
    resource_tracker.register, resource_tracker.unregister = registering, unregistering  # type: ignore[assignment]


def follow(held: set[Resource], action: str, name: str, rtype: str) -> None:
    """Applies one reported (un)registration to the set of resources the workers hold."""
    (held.add if action == "register" else held.discard)((name, rtype))


def release(resources: Iterable[Resource]) -> None:
    """In the launcher, once the workers are gone: unlinks what they left and unregisters it."""
    import _multiprocessing
    import _posixshmem

    for name, rtype in resources:
        with contextlib.suppress(OSError):  # already unlinked by its owner: only the record is left
            if rtype == "semaphore":
                _multiprocessing.sem_unlink(name)
            elif rtype == "shared_memory":
                _posixshmem.shm_unlink(name)
        resource_tracker.unregister(name, rtype)
