"""Point-to-point data movement between workers over torch.distributed, O(own rows) per worker.

Two patterns cover everything the steps move: :func:`exchange` sends rows to the worker that
should hold them, and :func:`request` asks the worker that knows something about a key for the
answer (a lookup in someone else's table) and brings the answers back in the asker's order.
Neither ever materializes anything the size of the whole graph on one worker.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import cast

import numpy as np
import pyarrow as pa
import torch
import torch.distributed as dist

from components.runtime import watchdog


def _wire(tensor: torch.Tensor) -> torch.Tensor:
    """A 2-D, gloo-transportable view of ``tensor`` (gloo moves no bool; int8, uint8, float16 and
    bfloat16 it moves as they are, measured with torch 2.3: int8 feature rows stay a quarter of float32's size)."""
    flat = tensor.reshape(len(tensor), int(np.prod(tensor.shape[1:], dtype=np.int64)))
    return flat.to(torch.int32) if flat.dtype == torch.bool else flat


def _all_to_all(tensor: torch.Tensor, send_sizes: list[int], recv_sizes: list[int]) -> torch.Tensor:
    """Rows of ``tensor`` (grouped by destination, ``send_sizes`` each) → rows received, grouped by sender."""
    if len(send_sizes) == 1:
        return tensor
    wire = _wire(tensor).contiguous()
    received = torch.empty((sum(recv_sizes), wire.shape[1]), dtype=wire.dtype)
    with watchdog.phase("all-reduce"):
        dist.all_to_all_single(received, wire, recv_sizes, send_sizes)
    return received.to(tensor.dtype).reshape((sum(recv_sizes), *tensor.shape[1:]))


def _sizes(destination: torch.Tensor, world_size: int) -> tuple[list[int], list[int]]:
    send = torch.bincount(destination, minlength=world_size)
    if world_size == 1:  # nothing to tell anyone (and no process group needed)
        return send.tolist(), send.tolist()
    recv = torch.empty_like(send)
    with watchdog.phase("all-reduce"):
        dist.all_to_all_single(recv, send)
    return send.tolist(), recv.tolist()


def exchange(
    rows: Mapping[str, torch.Tensor] | dict[str, torch.Tensor], destination: torch.Tensor, world_size: int, *, consume: bool = False
) -> dict[str, torch.Tensor]:
    """Sends row ``i`` of every tensor to worker ``destination[i]``; returns the rows this worker got.

    All tensors share their first dimension; received rows come grouped by sender rank, each
    sender's rows in their original order (so the result is deterministic). ``consume`` takes
    each tensor out of ``rows`` (a dict) once it is sent, so that a caller holding no other
    reference frees it before the next one's buffers exist.
    """
    order = torch.argsort(destination, stable=True)
    send_sizes, recv_sizes = _sizes(destination, world_size)
    received = {}
    for key in list(rows):
        tensor = cast(dict, rows).pop(key) if consume else rows[key]
        received[key] = _all_to_all(tensor[order], send_sizes, recv_sizes)
        del tensor
    return received


def request(keys: torch.Tensor, destination: torch.Tensor, world_size: int, answer: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Answers for ``keys`` (k,), each computed by worker ``destination[i]``; collective.

    Every worker receives the keys addressed to it and calls ``answer`` on them (a (r,) key
    tensor → (r, ...) answers, in the same order); the answers travel back and are returned in
    the order of ``keys``, shape (k, ...).
    """
    order = torch.argsort(destination, stable=True)
    send_sizes, recv_sizes = _sizes(destination, world_size)
    asked = _all_to_all(keys[order], send_sizes, recv_sizes)
    answers = answer(asked)
    replies = _all_to_all(answers, recv_sizes, send_sizes)
    out = torch.empty_like(replies)
    out[order] = replies
    return out


def exchange_strings(strings: pa.Array, destination: torch.Tensor, world_size: int) -> tuple[torch.Tensor, pa.Array]:
    """Moves ``strings[i]`` to worker ``destination[i]``; returns (the order rows were sent in,
    the strings received), grouped by sender as :func:`exchange` groups rows."""
    order = torch.argsort(destination, stable=True)
    ordered = strings.cast(pa.large_string()).take(pa.array(order.numpy()))  # a fresh array: offset 0
    offsets = np.frombuffer(ordered.buffers()[1], dtype=np.int64)[: len(ordered) + 1] if len(ordered) else np.zeros(1, np.int64)
    data = np.frombuffer(ordered.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[-1]] if len(ordered) else np.zeros(0, np.uint8)
    lengths = torch.from_numpy(np.diff(offsets))
    got = exchange({"length": lengths}, destination[order], world_size)["length"]
    byte_owner = torch.repeat_interleave(destination[order], lengths)
    got_bytes = exchange({"byte": torch.from_numpy(data.copy())}, byte_owner, world_size)["byte"]
    got_offsets = np.zeros(len(got) + 1, dtype=np.int64)
    np.cumsum(got.numpy(), out=got_offsets[1:])
    received = pa.LargeStringArray.from_buffers(len(got), pa.py_buffer(got_offsets), pa.py_buffer(got_bytes.numpy()))
    return order, received.cast(pa.string())


def request_strings(keys: torch.Tensor, destination: torch.Tensor, world_size: int, answer: Callable[[torch.Tensor], pa.Array]) -> pa.Array:
    """Like :func:`request`, for answers that are strings (e.g. original ids): ``answer`` maps a
    (r,) key tensor to r strings; returns one string per key, in the order of ``keys``."""
    order = torch.argsort(destination, stable=True)
    send_sizes, recv_sizes = _sizes(destination, world_size)
    asked = _all_to_all(keys[order], send_sizes, recv_sizes)
    askers = torch.repeat_interleave(torch.arange(world_size), torch.tensor(recv_sizes, dtype=torch.int64))
    _, replies = exchange_strings(answer(asked), askers, world_size)  # grouped by answering worker = keys[order]
    return replies.take(pa.array(torch.argsort(order).numpy()))


def all_sum_int(value: int) -> int:
    """``value`` summed over every worker (``value`` itself without a process group)."""
    if not dist.is_initialized():
        return value
    t = torch.tensor([value], dtype=torch.int64)
    with watchdog.phase("all-reduce"):
        dist.all_reduce(t)
    return int(t.item())


def all_max_int(value: int) -> int:
    """The largest ``value`` of any worker."""
    if not dist.is_initialized():
        return value
    t = torch.tensor([value], dtype=torch.int64)
    with watchdog.phase("all-reduce"):
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def all_gather_int(value: int, world_size: int) -> list[int]:
    """Every worker's ``value``, in rank order."""
    if world_size == 1:
        return [value]
    out = [torch.zeros(1, dtype=torch.int64) for _ in range(world_size)]
    with watchdog.phase("all-reduce"):
        dist.all_gather(out, torch.tensor([value], dtype=torch.int64))
    return [int(t.item()) for t in out]


def gather_to_rank_zero(mine: object) -> list:
    """Every rank's picklable ``mine``, in rank order, on rank 0; an empty list elsewhere."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [mine]
    rank_zero = dist.get_rank() == 0
    gathered: list = [None] * dist.get_world_size() if rank_zero else []
    with watchdog.phase("all-reduce"):
        dist.gather_object(mine, gathered if rank_zero else None, dst=0)
    return gathered
