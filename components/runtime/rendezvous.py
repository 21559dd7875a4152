"""Race-free rendezvous for the workers of one machine: the launcher hosts the stores.

Picking a free port, releasing it and letting rank 0 bind it later fails now and then under
load ("Address already in use": another process took the port in between). Instead the launcher
binds its TCPStores on port 0 itself, keeps them for the whole run, and the workers join them as
clients, for torch.distributed (gloo) and for GLT's RPC alike. Workers join a hosted store
through torch's own "agent store" mode (every rank a client), switched on only around the two
rendezvous, so that GLT's sampling subprocesses, which rendezvous among themselves, are unaffected.
On a cluster the platform gives the ports and rank 0 hosts the stores, as before. Also here: the
one warning torch's own RPC start-up prints in every worker (``RPC_BACKEND_WARNING``).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from datetime import timedelta

_AGENT_STORE = {"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0"}


def host_stores(count: int, host: str = "127.0.0.1", timeout_s: float = 300) -> list:
    """``count`` TCPStore servers on ports the OS picked (``store.port``); keep them referenced
    while the workers run: a store's server stops when it is collected."""
    from torch.distributed import TCPStore

    return [TCPStore(host, 0, None, True, timedelta(seconds=timeout_s), wait_for_workers=False) for _ in range(count)]


@contextlib.contextmanager
def joining_hosted_store(hosted: bool) -> Iterator[None]:
    """Within it, a ``tcp://`` rendezvous makes every rank a client of the store at that address."""
    if not hosted:
        yield
        return
    saved = {k: os.environ.get(k) for k in _AGENT_STORE}
    os.environ.update(_AGENT_STORE)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# torch 2.3's TensorPipe RPC start-up (torch/distributed/rpc/backend_registry.py, which GLT's
# init_rpc reaches through torch.distributed.rpc.init_rpc) gathers the workers' device maps over a
# bare ProcessGroupGloo backend it builds itself, and torch's own all_gather_object then warns
# that a backend is used as a process group. No argument of init_rpc (GLT's or torch's) avoids
# that path, so this one message, and only it, is silenced while RPC starts.
RPC_BACKEND_WARNING = r"You are using a Backend <class 'torch\.distributed\.distributed_c10d\.ProcessGroupGloo'> as a ProcessGroup"


def ignore_rpc_backend_warning() -> None:
    """Silences torch's RPC start-up warning in this process (see ``RPC_BACKEND_WARNING``): for GLT's
    sampling subprocesses, which start RPC inside GLT's own worker loop."""
    warnings.filterwarnings("ignore", message=RPC_BACKEND_WARNING, category=UserWarning)


@contextlib.contextmanager
def rpc_starting() -> Iterator[None]:
    """Around a worker's ``init_rpc``: torch's start-up warning silenced (see ``RPC_BACKEND_WARNING``)."""
    with warnings.catch_warnings():
        ignore_rpc_backend_warning()
        yield
