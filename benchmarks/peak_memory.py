"""Peak resident memory of the worker processes a benchmark starts (sampled, not exact)."""

from __future__ import annotations

import threading

import psutil


def is_tracker(process: psutil.Process) -> bool:
    """multiprocessing's resource tracker: a helper of the launcher, not a worker."""
    return "resource_tracker" in " ".join(process.cmdline())


def worker_processes(launcher: psutil.Process) -> list[psutil.Process]:
    """The worker processes ``launcher`` started: its children, or where it forks them from a fork
    server (components/runtime/launcher/processes.py), that server's children; the server itself
    and multiprocessing's resource tracker are no workers."""
    workers = []
    for child in launcher.children():
        if is_tracker(child):
            continue
        workers.extend(child.children() if "multiprocessing.forkserver" in " ".join(child.cmdline()) else [child])
    return workers


class PeakMemory:
    """Samples, every ``interval_s``, the RSS of each worker process this process started (see
    ``worker_processes``) alone and summed with its descendants (loader children, GLT sampling
    subprocesses)."""

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self.peaks: dict[tuple[float, int], int] = {}  # (create time, pid) → peak with descendants
        self.alone: dict[tuple[float, int], int] = {}  # (create time, pid) → peak of the process alone
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        me = psutil.Process()
        while not self.stop.wait(self.interval_s):
            for child in worker_processes(me):
                try:
                    own = child.memory_info().rss
                    total = own + sum(p.memory_info().rss for p in child.children(recursive=True) if not is_tracker(p))
                    key = (child.create_time(), child.pid)
                except psutil.Error:
                    continue
                self.peaks[key] = max(self.peaks.get(key, 0), total)
                self.alone[key] = max(self.alone.get(key, 0), own)

    def workers(self) -> list[tuple[int, int]]:
        """(peak alone, peak with descendants) per worker, in start order (the launcher starts ranks in order)."""
        return [(self.alone[k], self.peaks[k]) for k in sorted(self.peaks)]

    def __enter__(self) -> PeakMemory:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
