"""Stopping training between two batches on every rank at once: on SIGTERM (a Spot or
FLEX_START VM being reclaimed, a scheduler cancelling the job) and for periodic checkpoints.

After each batch every rank all-reduces two flags (asked to stop, a checkpoint due), so all of
them act after the same batch. A rank whose loader is exhausted while its peers still train has
joined DDP's :class:`~torch.distributed.algorithms.Join`; :class:`BatchAgreement` is a joinable
too, so that rank answers the same all-reduces with zeros and learns the decision all the same.
When a checkpoint is due, every rank hands rank 0 where it stands.
"""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Joinable, JoinHook

from components.errors import GnnflowError
from components.runtime.collectives import gather_to_rank_zero
from components.runtime.exit_status import EXIT_PREEMPTED

PREEMPTED_EXIT_CODE = EXIT_PREEMPTED  # 75: a rerun resumes from the checkpoint written on the way out

_stop_requested = False


class Preempted(GnnflowError):
    """The step stopped on SIGTERM after writing a checkpoint that its rerun resumes from."""

    exit_code = PREEMPTED_EXIT_CODE


def _on_sigterm(signum: int, frame: Any) -> None:  # noqa: ARG001
    global _stop_requested
    _stop_requested = True


def stop_on_sigterm() -> None:
    """From now on SIGTERM asks this worker to stop after its current batch instead of killing it."""
    signal.signal(signal.SIGTERM, _on_sigterm)


def stop_requested() -> bool:
    return _stop_requested


def rng_states() -> dict[str, Any]:
    """This process's random states (what dropout and the next epoch's shuffle draw from), as
    tensors and plain values a ``weights_only`` checkpoint load accepts."""
    _, keys, position, has_gauss, cached = np.random.get_state(legacy=True)
    return {
        "torch": torch.get_rng_state(),
        "numpy": {
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "position": int(position),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
        "python": list(random.getstate()[1]),
    }


def restore_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    saved = states["numpy"]
    np.random.set_state(("MT19937", saved["keys"].numpy().astype(np.uint32), saved["position"], saved["has_gauss"], saved["cached"]))
    random.setstate((3, tuple(states["python"]), None))


Snapshot = dict[str, Any]  # one rank's state at a checkpoint: model, optimizer, batches, rng, sums


class BatchAgreement(Joinable):
    """One epoch's agreement, after every batch, on whether to stop or checkpoint now.

    ``every_batches`` / ``every_seconds`` (None: never) ask for periodic checkpoints. When one is
    due, or a rank is asked to stop, every rank's ``snapshot()`` reaches rank 0, which passes
    them, in rank order, to ``write``. A rank that has joined (no batches left) snapshots too:
    its model and optimizer are its own (DDP steps only the ranks that still train).
    """

    def __init__(
        self,
        every_batches: int | None,
        every_seconds: float | None,
        snapshot: Callable[[], Snapshot],
        write: Callable[[list[Snapshot], bool], None],
    ) -> None:
        super().__init__()
        self.every_batches, self.every_seconds = every_batches, every_seconds
        self.snapshot, self.write = snapshot, write
        self.batches = 0  # batches this rank trained this epoch since it started or resumed
        # An epoch starts just after a checkpoint (the previous epoch's, or the one resumed from).
        self.batches_since_checkpoint, self.last_checkpoint = 0, time.monotonic()
        self.stopped = False
        self.distributed = dist.is_initialized() and dist.get_world_size() > 1

    def after_batch(self) -> bool:
        """Called by a rank that has just trained a batch; True when every rank stops here."""
        from torch.distributed.algorithms.join import Join

        self.batches += 1
        self.batches_since_checkpoint += 1
        Join.notify_join_context(self)
        by_batches = self.every_batches is not None and self.batches_since_checkpoint >= self.every_batches
        by_time = self.every_seconds is not None and time.monotonic() - self.last_checkpoint >= self.every_seconds
        self._agree(torch.tensor([int(stop_requested()), int(by_batches or by_time)], dtype=torch.int64))
        return self.stopped

    def _agree(self, flags: torch.Tensor) -> None:
        if self.distributed:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        stop, due = bool(flags[0]), bool(flags[1])
        self.stopped = self.stopped or stop
        if not (stop or due):
            return
        self.batches_since_checkpoint, self.last_checkpoint = 0, time.monotonic()
        snapshots = gather_to_rank_zero(self.snapshot())
        if snapshots:
            self.write(snapshots, stop)
        if self.distributed:
            dist.barrier()  # a stop ends the step: nobody leaves before the checkpoint exists

    def join_hook(self, **kwargs: Any) -> JoinHook:  # noqa: ARG002
        return _JoinedRank(self)

    @property
    def join_device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def join_process_group(self) -> Any:
        return dist.group.WORLD


class _JoinedRank(JoinHook):
    """A rank done with its batches answers its peers' agreements (its flags: nothing asked)."""

    def __init__(self, agreement: BatchAgreement) -> None:
        self.agreement = agreement

    def main_hook(self) -> None:
        self.agreement._agree(torch.zeros(2, dtype=torch.int64))
