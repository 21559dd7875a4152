"""One training epoch's batches, from wherever a resumed run left off, under DDP's join and the
ranks' :class:`~components.gnn.interruption.BatchAgreement`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel

from components.gnn.distinct_sampling import restore_sampler_key_states, sampler_key_states
from components.gnn.interruption import BatchAgreement, restore_rng_states, rng_states
from components.gnn.sampling import resumed_iterator
from components.runtime import watchdog


@dataclass(frozen=True)
class EpochStart:
    """Where a rank starts an epoch: at its beginning, or after ``skip`` batches a checkpoint
    holds, with the random states it had when the epoch began (``epoch_rng``, which the epoch's
    seed order is drawn from) and after those batches (``random``, which includes the in-process
    loaders' key generators), and its running sums then."""

    skip: int = 0
    sums: dict[str, torch.Tensor] = field(default_factory=dict)
    epoch_rng: dict[str, Any] | None = None
    random: dict[str, Any] | None = None  # what random_state() returned after those batches


FROM_THE_START = EpochStart()


def random_state(loaders: dict) -> dict[str, Any]:
    """This rank's random state: its generators' (``rng``) and its in-process ``loaders``' key
    generators' (``samplers``)."""
    return {"rng": rng_states(), "samplers": sampler_key_states(loaders)}


def restore_random_state(loaders: dict, saved: dict[str, Any]) -> None:
    """Puts back what :func:`random_state` returned."""
    restore_rng_states(saved["rng"])
    restore_sampler_key_states(loaders, saved.get("samplers", {}))


def trained_batches(model: nn.Module, loaders: dict, agreement: BatchAgreement | None, start: EpochStart) -> Iterator[Any]:
    """The batches of ``loaders["train"]`` from ``start.skip`` on. Each is trained by the caller
    before it asks for the next one; the ranks then agree whether to stop there. A rank with fewer
    batches joins DDP (which shadows its peers' all-reduces) and the agreement until all are done."""
    if start.epoch_rng is not None:
        restore_rng_states(start.epoch_rng)
    iterator = resumed_iterator(loaders["train"], start.skip)
    if start.random is not None:  # after the skip: in-process shuffling draws its order at the first batch
        restore_random_state(loaders, start.random)
    joinables: list[Any] = [model] if isinstance(model, DistributedDataParallel) else []
    if agreement is not None:
        joinables.append(agreement)
    with Join(joinables) if joinables else contextlib.nullcontext():
        for batch in watchdog.batches(iterator):
            yield batch
            if agreement is not None and agreement.after_batch():
                return
