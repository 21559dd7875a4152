"""A worker process's own set-up: its process group, its parent-death signal, its launcher's
environment and streams, torch's environment variables, logging, the progress board; then the
worker function, whose result or error it sends to the supervisor."""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

from components.errors import GnnflowError
from components.runtime import watchdog, worker_resources
from components.runtime.launcher.context import WorkerContext, verbose
from components.runtime.launcher.processes import LauncherState

_PR_SET_NAME = 15
_PR_SET_PDEATHSIG = 1


def worker_main(payload: bytes, context: WorkerContext, writer: Connection, parent_pid: int, board: Any, launcher: LauncherState) -> None:
    """Entry point of a worker process: isolates it, runs the worker, reports the outcome."""
    os.setpgrp()  # first thing: all this worker starts joins its group, to be killed as one
    launcher.adopt()
    for fd in [int(name) for name in os.listdir("/proc/self/fd") if int(name) > 2]:
        with contextlib.suppress(OSError):  # multiprocessing's pipes: exec'd descendants must not hold them open
            os.set_inheritable(fd, False)
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the launcher's cleanup must do
        libc = ctypes.CDLL(None, use_errno=True)
        # The parent is the fork server, which exits as soon as its launcher is gone.
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        libc.prctl(_PR_SET_NAME, f"gnnflow-rank-{context.rank}".encode()[:15])  # for ps and top
    if os.getppid() != parent_pid:
        os._exit(1)  # the fork server died before prctl took effect
    # For libraries that read torch's variables (counting processes here, not replicas).
    os.environ.update(MASTER_ADDR=context.master_addr, MASTER_PORT=str(context.master_port), RANK=str(context.rank))
    os.environ.update(WORLD_SIZE=str(context.world_size), LOCAL_RANK=str(context.local_rank))
    lock = threading.Lock()  # resource registrations may come from any thread of the worker

    def send(message: tuple) -> None:
        with lock:
            writer.send(message)

    watchdog.attach(board, context.local_rank)
    send(("started", os.getpid()))
    worker_resources.report_registrations(send)
    from components.runtime.runlog import configure

    configure(prefix=f"[rank {context.rank}] ")
    try:
        worker, args = pickle.loads(payload)
        result = worker(context, *args)
        send(("result", result))
    except BaseException as error:  # SystemExit and KeyboardInterrupt are failures too
        expected = isinstance(error, GnnflowError)  # bad input: the message already says what and where
        summary = str(error) if expected else traceback.format_exception_only(type(error), error)[-1].strip()
        details = None if expected and not verbose() else traceback.format_exc()
        send(("error", time.time(), summary, details))
        sys.stdout.flush()
        sys.stderr.flush()
        # No interpreter teardown: atexit hooks such as RPC shutdown wait for the peers that
        # the launcher is about to kill; what they would free, the launcher frees.
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    # No process-group teardown either: gloo's destroy can block on a peer that has already
    # exited (seen under load). Workers end their work with a barrier, so nothing is in flight.
    os._exit(0)
