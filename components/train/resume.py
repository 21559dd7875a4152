"""Where a training run starts: the checkpoint's state loaded into the model, optimizer and this
rank's shard of the learnt embeddings, and where each rank starts an epoch part-way through."""

from __future__ import annotations

import logging
import time

from components import storage
from components.config import GnnflowConfig
from components.gnn.epoch import FROM_THE_START, EpochStart, restore_random_state
from components.runtime.launcher import WorkerContext
from components.train import checkpoint, curves
from components.train.embeddings import TrainedEmbeddings

log = logging.getLogger("gnnflow.train")


def resumed_state(
    ctx: WorkerContext, config: GnnflowConfig, output: storage.Uri, generation: str, model, optimizer, embeddings: TrainedEmbeddings | None
) -> checkpoint.TrainingState:
    """The checkpoint's state, loaded into ``model``, ``optimizer`` and this rank's ``embeddings``, or a fresh one."""
    fingerprint = checkpoint.fingerprint(config, generation, ctx.world_size)
    state = checkpoint.load(output, fingerprint, announce=ctx.rank == 0)
    if state is not None and state.next_epoch > config.training.epochs:
        state = None  # fewer epochs than the checkpoint has run: a shorter run, trained afresh
    fresh = state is None
    state = state or checkpoint.TrainingState(fingerprint)
    if not state.curves_name:  # a fresh run, or a checkpoint from before the curves were written live
        state.started = time.time()
        state.curves_name = curves.file_name(state.started)
    if fresh:
        return state
    own = checkpoint.for_rank(state, ctx.rank)
    model.load_state_dict(own.get("model", state.model))
    optimizer.load_state_dict(own.get("optimizer", state.optimizer))
    if embeddings is not None:
        tag = own.get("embeddings_tag") or state.embeddings_tag
        embeddings.resume(checkpoint.load_shard(output, tag, ctx.rank), str(checkpoint.shard_uri(output, tag, ctx.rank)))
    if ctx.rank == 0:
        where = f"batch {own['batches']} of epoch {state.next_epoch + 1}" if state.mid_epoch else f"epoch {state.next_epoch - 1}"
        log.info(
            "resuming from the checkpoint of %s (best %.4f at epoch %d)",
            where,
            state.best_metric,
            state.best_epoch,
        )
    return state


def epoch_start(state: checkpoint.TrainingState, rank: int) -> EpochStart:
    """Where this rank starts the epoch ``state.next_epoch``: after its checkpointed batches, if any."""
    if not state.mid_epoch:
        return FROM_THE_START
    own = checkpoint.for_rank(state, rank)
    return EpochStart(own["batches"], own["sums"], own["epoch_rng"], own)


def task_loaders(task) -> dict:
    """The task's GLT loaders by name (none in full-graph training)."""
    return getattr(task, "loaders", {})


def restore_task_random_state(task, own: dict) -> bool:
    """Restores the random state a checkpoint holds for this rank, if it holds one; whether it did."""
    if "rng" not in own:
        return False
    restore_random_state(task_loaders(task), own)
    return True
