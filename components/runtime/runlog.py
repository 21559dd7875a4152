"""Logging and progress bars for a step run: what a user needs to follow it, on stderr."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from tqdm import tqdm

from components.runtime import watchdog


class _CurrentStderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record arrives, not the one at set-up: a
    process that swaps it (pytest's capture, a notebook) still sees the log, and a closed old
    stream is never written to."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):  # noqa: ANN201
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # noqa: ANN001
        pass


def configure(level: int = logging.INFO, prefix: str = "") -> None:
    """Idempotent: one stderr handler with timestamps, as a step's entry point (or a worker
    process, with its rank as ``prefix``) wants."""
    root = logging.getLogger()
    if not any(getattr(h, "_gnnflow", False) for h in root.handlers):
        handler = _CurrentStderrHandler()
        handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s {prefix}%(name)s: %(message)s", "%H:%M:%S"))
        handler._gnnflow = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.setLevel(level)


PROGRESS_LOG_INTERVAL_S = 30.0  # without a terminal: one log line per this many seconds of work


class LoggedProgress:
    """What :func:`progress` gives when stderr is no terminal (a pipeline task, a CI log):
    no bar redrawn with carriage returns, but a log line every ``interval_s`` seconds with the
    count, the rate and, given a total, the share done. Same interface as the tqdm bar used."""

    def __init__(self, description: str, unit: str, total: int | None, interval_s: float = PROGRESS_LOG_INTERVAL_S) -> None:
        self.description, self.unit, self.total, self.interval_s = description, unit, total, interval_s
        self.n = 0
        self.start = self.last = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.n += n
        watchdog.touch()
        now = time.monotonic()
        if now - self.last >= self.interval_s:
            self.last = now
            share = f" ({100 * self.n / self.total:.0f}% of {self.total:,})" if self.total else ""
            logging.getLogger("gnnflow.progress").info(
                "%s: %s %s%s, %s", self.description, f"{self.n:,}", self.unit, share, rate(self.n, now - self.start)
            )

    def close(self) -> None:
        pass

    def __enter__(self) -> LoggedProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _WatchedBar(tqdm):
    """tqdm's bar whose every update is progress for the watchdog too."""

    def update(self, n: float | None = 1) -> bool | None:
        watchdog.touch()
        return super().update(n)


def progress(description: str, unit: str = "rows", total: int | None = None) -> tqdm | LoggedProgress:
    """A progress bar on stderr when it is a terminal; otherwise periodic log lines. Each update
    is progress for the watchdog of a multi-worker step (components.runtime.watchdog)."""
    if not sys.stderr.isatty():
        return LoggedProgress(description, unit, total)
    return _WatchedBar(desc=description, unit=unit, unit_scale=True, total=total, file=sys.stderr, mininterval=1.0, leave=False)


@contextmanager
def timed() -> Iterator[list[float]]:
    """Yields a one-element list that holds the elapsed seconds once the block ends."""
    elapsed = [0.0]
    start = time.perf_counter()
    try:
        yield elapsed
    finally:
        elapsed[0] = time.perf_counter() - start


def rate(count: int, seconds: float) -> str:
    return f"{count / seconds:,.0f}/s" if seconds > 0 else "n/a"
