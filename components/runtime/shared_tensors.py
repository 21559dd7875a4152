"""Tensors allocated in shared memory (``/dev/shm``) from the start.

GLT moves every tensor it samples from into shared memory with ``share_memory_()``, a copy of the
whole tensor unless it is already there; a reader that fills a tensor allocated here hands GLT
its final storage, and the copy never happens.
"""

from __future__ import annotations

import math

import torch


def empty_tensor(shape: tuple[int, ...], dtype: torch.dtype, *, shared: bool) -> torch.Tensor:
    """An uninitialised tensor; in shared memory (``/dev/shm``) from the start when ``shared``, so
    that GLT's ``share_memory_()`` later finds it there and copies nothing."""
    nbytes = math.prod(shape) * dtype.itemsize
    if not shared or nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    storage = torch.UntypedStorage._new_shared(nbytes)
    strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))]  # contiguous
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape, strides)
