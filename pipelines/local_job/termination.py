"""``gnnflow local-job`` on SIGTERM: what Vertex AI does to a job's replicas when it is cancelled
or its VMs are preempted.

Vertex AI sends SIGTERM to every replica's container (its PID 1: the step's KFP executor, which
runs the launcher) and kills those still running after the grace period. The local job does the
same on its own SIGTERM: it passes SIGTERM to each replica, waits at most ``--grace-s`` (default
:data:`DEFAULT_GRACE_S`), kills and names the replicas still running then, and exits with the
job's status: 75 when the replicas stopped as preempted (train wrote a checkpoint that a rerun of
the same command resumes from), the status a replica ended with otherwise. A second SIGTERM
stops the wait and kills what is left at once.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from components.errors import GnnflowError
from components.runtime.exit_status import EXIT_PREEMPTED

# A Spot VM has 30 s between its preemption notice and its end; the step's launcher gives its
# workers 25 s of them, so a replica's own escalation (exit 143) comes before this one's kill.
DEFAULT_GRACE_S = 30.0
KILLED_BY_SIGTERM = 128 + signal.SIGTERM  # what a shell reports for a process that died of it


class ReplicasStopped(GnnflowError):
    """The job's replicas stopped before they were done; ``exit_code`` is the job's status."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class SigtermRequests:
    """How many SIGTERMs this process got while the replicas ran (set by the handler)."""

    def __init__(self) -> None:
        self.count = 0
        self.event = threading.Event()

    def _on_sigterm(self, signum: int, frame: Any) -> None:  # noqa: ARG002
        self.count += 1
        self.event.set()

    @property
    def requested(self) -> bool:
        return self.count > 0


@contextlib.contextmanager
def sigterm_requests() -> Iterator[SigtermRequests]:
    """Catches SIGTERM while the block runs (main thread only: elsewhere it keeps its action)."""
    requests = SigtermRequests()
    if threading.current_thread() is not threading.main_thread():
        yield requests
        return
    previous = signal.signal(signal.SIGTERM, requests._on_sigterm)
    try:
        yield requests
    finally:
        signal.signal(signal.SIGTERM, previous)


def status(returncode: int) -> int:
    """A replica's exit status as a shell gives it: 128 + N for a process killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


@dataclass(frozen=True)
class Outcome:
    """The job's status after a SIGTERM and the line that says what became of its replicas."""

    status: int
    message: str


def outcome(label: str, exits: Mapping[str, int], killed: Sequence[str], grace_s: float) -> Outcome:
    """The job's status from its replicas' exit statuses (by name, in pool order) after a SIGTERM.

    ``killed``: the replicas that did not exit within ``grace_s`` and were killed.
    """
    if killed:
        return Outcome(
            KILLED_BY_SIGTERM,
            f"{label}: stopped by SIGTERM; replica(s) {', '.join(killed)} did not exit within the grace period of "
            f"{grace_s:g} s (--grace-s) and were killed: rerun the task",
        )
    failed = {name: code for name, code in exits.items() if code not in (0, EXIT_PREEMPTED)}
    if failed:
        codes = ", ".join(f"{name} exit {code}" for name, code in exits.items())
        return Outcome(next(iter(failed.values())), f"{label}: stopped by SIGTERM; replicas ended with {codes}: rerun the task")
    if any(code == EXIT_PREEMPTED for code in exits.values()):
        return Outcome(
            EXIT_PREEMPTED,
            f"{label}: stopped by SIGTERM; replicas preempted (exit {EXIT_PREEMPTED}): rerun to resume from the checkpoint",
        )
    return Outcome(0, f"{label}: SIGTERM came after every replica had finished; the job is done")
