"""Logging and progress bars for a step run: what a user needs to follow it, on stderr."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from tqdm import tqdm


def configure(level: int = logging.INFO, prefix: str = "") -> None:
    """Idempotent: one stderr handler with timestamps, as a step's entry point (or a worker
    process, with its rank as ``prefix``) wants."""
    root = logging.getLogger()
    if not any(getattr(h, "_gnnflow", False) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s {prefix}%(name)s: %(message)s", "%H:%M:%S"))
        handler._gnnflow = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.setLevel(level)


def progress(description: str, unit: str = "rows", total: int | None = None) -> tqdm:
    """A progress bar on stderr that stays quiet when stderr is not a terminal and the job is short."""
    return tqdm(desc=description, unit=unit, unit_scale=True, total=total, file=sys.stderr, mininterval=1.0, leave=False)


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
