"""Keeps freed memory in the process for reuse while a step trains or infers (glibc malloc).

glibc serves every allocation above its mmap threshold (at most 32 MiB) with a mapping of its
own and unmaps it when freed, and gives the heap's free top back to the OS beyond 128 KiB. A
sampled mini-batch allocates tens of such blocks (its feature matrix: 89,000 rows of 128
floats on an arxiv-sized graph, 45 MB; per-edge messages; their gradients) and frees them
before the next batch, so the next batch page-faults all of that memory in afresh: gathering
the feature rows took 66 ms that way and 15 ms in reused memory, one forward and backward of
a GraphSAGE layer 269 vs 121 ms (``benchmarks/freed_memory.py``; ``benchmarks/RESULTS.md``).

:func:`reuse_freed_memory` turns both off for the calling process (``mallopt``) and, through
the environment, for the processes it starts (GLT's sampling subprocesses). The price: the
process's RSS stays at its peak until it exits instead of falling back between batches; the
peak itself is what it was. ``resources.reuse_freed_memory: false`` keeps glibc's behaviour.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger("gnnflow.runtime")

# mallopt(3) parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_NEVER_TRIM = 2**31 - 1  # bytes of free heap top before glibc returns it (mallopt's largest int)
# The same settings for child processes, read by glibc when a process starts.
CHILD_ENVIRONMENT = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(_NEVER_TRIM)}


def reuse_freed_memory() -> bool:
    """Makes glibc keep freed memory in this process (and its future children); False, and
    nothing changed, where the C library is not glibc (no ``mallopt``)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        log.info("freed memory: not glibc, left to the C library")
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    if not (mallopt(_M_MMAP_MAX, 0) and mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM)):
        log.warning("freed memory: mallopt refused the settings; glibc's defaults stay")
        return False
    for name, value in CHILD_ENVIRONMENT.items():
        os.environ.setdefault(name, value)  # a user's own setting wins
    return True
