"""The progress watchdog of multi-worker steps: a stopped worker, a stopped sampling process and
a peer that never reaches the rendezvous each fail the step within the configured time, naming
the rank, its host and phase, and leave no process, shared-memory file or SysV segment behind."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import psutil
import pytest

from components.config import GnnflowConfig
from components.config.resources import WorkerTimeouts
from components.runtime import watchdog
from components.runtime.launcher import WorkerFailed, launch
from tests.test_launcher import LOCAL, _children, _new_shm_files, _sysv_segments
from tests.watchdog_workers import all_reduce_forever, late_peer

pytestmark = pytest.mark.multiworker

PROGRESS_S = 3.0


def _wait_for_records(folder: Path, ranks: int, timeout_s: float = 120) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while len(list(folder.glob("rank*.json"))) < ranks and time.monotonic() < deadline:
        time.sleep(0.05)
    return [json.loads((folder / f"rank{rank}.json").read_text())["pid"] for rank in range(ranks)]


def _after(delay_s: float, action) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(delay_s), action()), daemon=True)
    thread.start()
    return thread


def _assert_nothing_left(shm_before: set[str], sysv_before: set[int]) -> None:
    assert _children() == []
    assert _new_shm_files(shm_before) == set()
    assert _sysv_segments() - sysv_before == set()


def test_a_stopped_worker_fails_the_step_naming_it(tmp_path: Path) -> None:
    shm_before, sysv_before = set(os.listdir("/dev/shm")), _sysv_segments()

    def stop_rank_1() -> None:
        pids = _wait_for_records(tmp_path, 2)
        time.sleep(0.5)  # a few rounds of progress first
        os.kill(pids[1], signal.SIGSTOP)

    _after(0, stop_rank_1)
    started = time.monotonic()
    with pytest.raises(WorkerFailed) as raised:
        launch(all_reduce_forever, (str(tmp_path),), world_size=2, environ=LOCAL, timeouts=WorkerTimeouts(progress_s=PROGRESS_S))
    waited = time.monotonic() - started
    message = str(raised.value)
    assert raised.value.rank == 1, message
    assert "no progress for" in message and f"on host {socket.gethostname()}" in message, message
    assert "is stopped" in message and "resources.progress_timeout_s" in message, message
    assert any(f"in phase {p}" in message for p in ("computing", "all-reduce")), message
    assert waited < 60, waited  # stopped within seconds of the limit, not after gloo's 20 minutes
    _assert_nothing_left(shm_before, sysv_before)


def test_a_peer_that_never_reaches_the_rendezvous_fails_the_step_naming_it(tmp_path: Path) -> None:
    """Starting (imports) and the rendezvous have the rendezvous limit: the peer that never got
    there is named, not rank 0, which waited for it, and not torch's timeout at rank 0."""
    with pytest.raises(WorkerFailed) as raised:
        launch(late_peer, (str(tmp_path),), world_size=2, environ=LOCAL, timeouts=WorkerTimeouts(rendezvous_s=8, progress_s=PROGRESS_S))
    message = str(raised.value)
    assert raised.value.rank == 1 and "in phase starting" in message and "resources.rendezvous_timeout_s" in message, message
    assert "is stopped" not in message, message
    assert _children() == []


def test_waiting_at_the_rendezvous_has_the_rendezvous_limit_and_waiting_for_a_moving_peer_is_no_stall() -> None:
    board = watchdog.ProgressBoard(__import__("multiprocessing").get_context("spawn"), 3, 10.0, 100.0)
    now = time.monotonic()
    phases = {0: ("rendezvous", 50.0), 1: ("all-reduce", 20.0), 2: ("computing", 1.0)}
    for local_rank, (name, ago) in phases.items():
        board.array[2 * local_rank], board.array[2 * local_rank + 1] = now - ago, watchdog.PHASES.index(name)
    me = os.getpid()
    assert board.stall({0: me, 1: me, 2: me}) is None  # rank 1 waits for rank 2, which moves
    board.array[4] = now - 30.0  # now rank 2 is stuck too: it is to blame, not rank 1 that waits for it
    stall = board.stall({0: me, 1: me, 2: me})
    assert stall is not None and (stall.local_rank, stall.phase, stall.limit_s) == (2, "computing", 10.0)
    board.array[0] = now - 200.0
    assert {s.local_rank for s in [board.stall({0: me})] if s} == {0}  # past the rendezvous limit


def test_progress_timeouts_come_from_the_config() -> None:
    config = GnnflowConfig.model_validate(
        {
            "graph": {"nodes": [{"type": "node", "uri": "n.csv", "label_column": "y"}], "edges": [{"type": "e", "uri": "e.csv"}]},
            "resources": {"progress_timeout_s": 7, "rpc_timeout_s": 11, "rendezvous_timeout_s": 13},
        }
    )
    assert config.resources.worker_timeouts == WorkerTimeouts(rendezvous_s=13, progress_s=7, rpc_s=11)
    assert GnnflowConfig.model_validate({**config.model_dump(mode="json"), "resources": {}}).resources.progress_timeout_s == 300


def sampling_processes(timeout_s: float = 180) -> list[psutil.Process]:
    """The sampling subprocesses of this process's workers, once there are some: the children of
    each worker's sampling fork server (glt_compat fix 7)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [
            sampler
            for worker in _children()
            for server in worker.children()
            if "forkserver" in " ".join(server.cmdline())
            for sampler in server.children()
        ]
        if found:
            return found
        time.sleep(0.2)
    return []


class _Statuses:
    """A process whose status is read from a list, one look at a time (the last one repeats)."""

    def __init__(self, *statuses: str) -> None:
        self.statuses = list(statuses)

    def status(self) -> str:
        return self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]


def test_a_waiter_in_uninterruptible_sleep_is_not_blamed_for_a_peer_that_never_came() -> None:
    """Rank 0 waits at the rendezvous for rank 1, stuck before it; a page fault under load can hold
    rank 0 in uninterruptible sleep at the moment of the check (a flaky blame of rank 0 in the
    suite). Rank 1 is blamed; a stopped (SIGSTOP) process is still blamed wherever it is."""
    asleep, stopped = "process 10 (gnnflow-rank-0) is in uninterruptible sleep", "process 10 (gnnflow-rank-0) is stopped"
    waiter = watchdog.Stall(0, "rendezvous", 9.0, 8.0, "resources.rendezvous_timeout_s", asleep)
    late = watchdog.Stall(1, "starting", 9.5, 8.0, "resources.rendezvous_timeout_s", None)
    assert watchdog.blame([waiter, late]) is late
    stopped_waiter = dataclasses.replace(waiter, stopped=stopped)
    assert watchdog.blame([stopped_waiter, late]) is stopped_waiter
    # Among ranks that are not waiting, lasting uninterruptible sleep still points at the cause.
    computing = watchdog.Stall(2, "computing", 30.0, 10.0, "resources.progress_timeout_s", None)
    stuck_read = dataclasses.replace(computing, local_rank=3, seconds=12.0, stopped=asleep)
    assert watchdog.blame([computing, stuck_read, waiter]) is stuck_read


def test_uninterruptible_sleep_is_blamed_only_when_it_lasts() -> None:
    """A disk read or page fault under load passes through uninterruptible sleep: one look at it
    must not blame that rank (the cause of a flaky blame of rank 0 at the rendezvous)."""
    assert watchdog._cannot_run(_Statuses(psutil.STATUS_DISK_SLEEP, psutil.STATUS_SLEEPING)) is None
    assert watchdog._cannot_run(_Statuses(psutil.STATUS_DISK_SLEEP, psutil.STATUS_DISK_SLEEP, psutil.STATUS_RUNNING)) is None
    assert watchdog._cannot_run(_Statuses(psutil.STATUS_DISK_SLEEP)) == "in uninterruptible sleep"
    assert watchdog._cannot_run(_Statuses(psutil.STATUS_STOPPED)) == "stopped"
    assert watchdog._cannot_run(_Statuses(psutil.STATUS_SLEEPING)) is None
