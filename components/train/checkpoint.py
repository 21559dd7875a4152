"""Resumable training state, written atomically by rank 0 after every epoch, and within an epoch
on SIGTERM or every ``training.checkpoint_every_batches`` / ``_seconds``.

The checkpoint lives under ``<output>/_checkpoints/`` (outside the published generations, so a
failed run leaves it for the re-run to resume from) and records a fingerprint of everything
that shapes training; a checkpoint from a different config or partitioning is ignored.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass, field
from typing import Any

import torch

from components import storage
from components.config import GnnflowConfig

CHECKPOINT_FILE = "_checkpoints/checkpoint.pt"
POSITION_FILE = "_checkpoints/position.txt"  # where the checkpoint stands, for people and for attempts.py
# Each rank's shard of the learnt embeddings (components/gnn/learnt_embeddings.py), written by
# that rank under a tag per checkpoint: the state names its tag, so that a crash between the
# shards and the state leaves the state's own shards in place.
SHARDS_DIR = "_checkpoints/learnt_embeddings"


# When to stop is not what was trained: raising epochs (or patience) continues the same run.
# Nor is where it ran: a run started on GPUs may resume on the CPU and the other way round.
_RESUMABLE_CHANGES = {
    "epochs",
    "early_stopping_patience",
    "device",
    "gpu_feature_fraction",
    "gpu_graph_placement",
    "checkpoint_every_batches",
    "checkpoint_every_seconds",
}


def fingerprint(config: GnnflowConfig, partitions_generation: str, world_size: int) -> str:
    """What must match for a checkpoint to be resumed: everything that shapes the epochs trained
    so far, not how many there are to be."""
    shaping = {
        "task": config.task.model_dump(mode="json"),
        "model": config.model.model_dump(mode="json"),
        "training": config.training.model_dump(mode="json", exclude=_RESUMABLE_CHANGES),
        "partitions": partitions_generation,
        "world_size": world_size,
    }
    return hashlib.sha256(json.dumps(shaping, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class TrainingState:
    """Epoch counter, early-stopping bookkeeping, and the best model so far.

    ``ranks`` holds what differs between ranks, in rank order: each one's optimizer (DDP steps
    only the ranks that still have batches, so their moments part), and, when ``mid_epoch``
    (epoch ``next_epoch`` was stopped part-way), each one's model, batches trained, random states
    and running sums (see components.gnn.interruption).
    """

    fingerprint: str
    next_epoch: int = 0
    best_metric: float = float("-inf")
    best_epoch: int = -1
    epochs_without_improvement: int = 0
    history: list[dict[str, float]] = field(default_factory=list)
    model: dict[str, torch.Tensor] = field(default_factory=dict)
    optimizer: dict[str, Any] = field(default_factory=dict)
    best_model: dict[str, torch.Tensor] = field(default_factory=dict)
    ranks: list[dict[str, Any]] = field(default_factory=list)
    mid_epoch: bool = False
    # The run's TensorBoard event file (components/train/curves.py): its name, when the run began
    # and when each epoch of ``history`` ended, so that a resumed run extends the same bytes.
    curves_name: str = ""
    started: float = 0.0
    wall_times: list[float] = field(default_factory=list)
    # Epochs in a row, and their optimizer steps, whose training loss stayed at chance (health.py).
    epochs_at_chance: int = 0
    steps_at_chance: int = 0
    # The tag of the learnt-embedding shards that belong with this state ("": none).
    embeddings_tag: str = ""


def save(state: TrainingState, output: storage.Uri) -> None:
    buffer = io.BytesIO()
    torch.save(state.__dict__, buffer)
    storage.write_bytes(output.join(CHECKPOINT_FILE), buffer.getvalue())
    storage.write_text(output.join(POSITION_FILE), position(state))


def shard_uri(output: storage.Uri, tag: str, rank: int) -> storage.Uri:
    return output.join(f"{SHARDS_DIR}/{tag}/rank-{rank:05d}.pt")


def shards_tag(state: TrainingState, batches: int = 0) -> str:
    """The tag of the shards written with ``state`` (at ``batches`` of its epoch when mid-epoch)."""
    return f"epoch-{state.next_epoch:05d}-batch-{batches:07d}"


def save_shard(output: storage.Uri, tag: str, rank: int, shard: dict[str, Any]) -> None:
    buffer = io.BytesIO()
    torch.save(shard, buffer)
    storage.write_bytes(shard_uri(output, tag, rank), buffer.getvalue())


def load_shard(output: storage.Uri, tag: str, rank: int) -> dict[str, Any]:
    uri = shard_uri(output, tag, rank)
    if not storage.exists(uri):
        raise FileNotFoundError(f"the checkpoint names learnt-embedding shards {tag!r}, but {uri} does not exist")
    return torch.load(io.BytesIO(storage.read_bytes(uri)), map_location="cpu", weights_only=True)


def drop_other_shards(output: storage.Uri, keep: set[str]) -> None:
    """Deletes the shards of earlier checkpoints (rank 0, once the state naming the tags ``keep`` is written)."""
    root = output.join(SHARDS_DIR)
    for uri in storage.list_files(root):
        tag = storage.relative_to(uri, root).split("/")[0]
        if tag not in keep:
            storage.delete(uri)


def position(state: TrainingState) -> str:
    """Where ``state`` stands, in words: "batch 16/27 of epoch 2" (per rank) or "the end of epoch 3"."""
    if state.mid_epoch:
        return f"batch {'/'.join(str(rank['batches']) for rank in state.ranks)} of epoch {state.next_epoch + 1}"
    return f"the end of epoch {state.next_epoch}"


def load(output: storage.Uri, expected_fingerprint: str) -> TrainingState | None:
    """The saved state if there is one for this same training setup, else None."""
    uri = output.join(CHECKPOINT_FILE)
    if not storage.exists(uri):
        return None
    # weights_only: a checkpoint is data, never code to run. Tensors saved from a GPU load onto
    # the host (the trainer moves them where its model and optimizer live).
    raw = torch.load(io.BytesIO(storage.read_bytes(uri)), map_location="cpu", weights_only=True)
    if raw.get("fingerprint") != expected_fingerprint:
        return None
    return TrainingState(**raw)


def for_rank(state: TrainingState, rank: int) -> dict[str, Any]:
    """What ``state`` holds for ``rank`` alone (empty for a checkpoint written before ranks had their own)."""
    return state.ranks[rank] if rank < len(state.ranks) else {}
