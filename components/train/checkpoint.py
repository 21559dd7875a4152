"""Resumable training state, written atomically by rank 0 after every epoch, and within an epoch
on SIGTERM or every ``training.checkpoint_every_batches`` / ``_seconds``.

The checkpoint lives under ``<output>/_checkpoints/`` (outside the published generations, so a
failed run leaves it for the re-run to resume from) and records a fingerprint of everything
that shapes training; a checkpoint from a different config or partitioning is ignored.

Each checkpoint is written whole (temporary file and rename locally, one upload on GCS), then its
size and CRC32C go into a small record beside it, last. The one before it is kept (as
``previous.pt``, with its record) until the new one is written, so a checkpoint damaged on its
storage is skipped for the previous good one, said in the log; with none good, the run is refused,
naming the file and what to do, instead of failing deep inside torch.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from components import storage
from components.config import GnnflowConfig
from components.errors import GnnflowError

log = logging.getLogger("gnnflow.train")

CHECKPOINT_FILE = "_checkpoints/checkpoint.pt"
RECORD_FILE = "_checkpoints/checkpoint.json"  # its size and CRC32C, written after it
PREVIOUS_FILE = "_checkpoints/previous.pt"  # the checkpoint before, kept as the fallback
PREVIOUS_RECORD_FILE = "_checkpoints/previous.json"
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
    """Writes ``state`` as the checkpoint, keeping the one before as the fallback until it is written."""
    buffer = io.BytesIO()
    torch.save(state.__dict__, buffer)
    data = buffer.getvalue()
    current, record = output.join(CHECKPOINT_FILE), output.join(RECORD_FILE)
    if storage.exists(record) and storage.exists(current):
        # Its record first: a previous.pt without one is only tried when nothing recorded is left.
        storage.delete(output.join(PREVIOUS_RECORD_FILE))
        storage.rename(current, output.join(PREVIOUS_FILE))
        storage.rename(record, output.join(PREVIOUS_RECORD_FILE))
    storage.write_bytes(current, data)
    entry = storage.FileEntry.of(data)
    written = storage.size(current)  # the write is whole (rename, or a checksummed upload on GCS)
    if written != entry.size:
        raise GnnflowError(f"writing the checkpoint {current} left {written} bytes of {entry.size}: check the storage")
    tags = sorted({state.embeddings_tag, *(rank.get("embeddings_tag", "") for rank in state.ranks)} - {""})
    storage.write_text(
        record, json.dumps({"size": entry.size, "crc32c": entry.crc32c, "position": position(state), "embeddings_tags": tags})
    )
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
    return _unpickle(storage.read_bytes(uri), uri, output)


def drop_other_shards(output: storage.Uri, keep: set[str]) -> None:
    """Deletes the shards of earlier checkpoints (rank 0, once the state naming the tags ``keep`` is
    written), except those of the previous checkpoint, which a damaged newest one falls back to."""
    keep = keep | _previous_tags(output)
    root = output.join(SHARDS_DIR)
    for uri in storage.list_files(root):
        tag = storage.relative_to(uri, root).split("/")[0]
        if tag not in keep:
            storage.delete(uri)


def _previous_tags(output: storage.Uri) -> set[str]:
    """The learnt-embedding tags of the previous checkpoint (none when it has no readable record)."""
    if not storage.exists(output.join(PREVIOUS_RECORD_FILE)):
        return set()
    try:
        return set(_record(output, PREVIOUS_RECORD_FILE).get("embeddings_tags", []))
    except storage.DamagedFile:
        return set()


def position(state: TrainingState) -> str:
    """Where ``state`` stands, in words: "batch 16/27 of epoch 2" (per rank) or "the end of epoch 3"."""
    if state.mid_epoch:
        return f"batch {'/'.join(str(rank['batches']) for rank in state.ranks)} of epoch {state.next_epoch + 1}"
    return f"the end of epoch {state.next_epoch}"


def _what_to_do(output: storage.Uri) -> str:
    return f"delete {output.join('_checkpoints')} to train from the start"


def _record(output: storage.Uri, name: str) -> dict[str, Any]:
    uri = output.join(name)
    try:
        raw = json.loads(storage.read_text(uri))
        storage.FileEntry(int(raw["size"]), str(raw["crc32c"]))
        return dict(raw)
    except (ValueError, KeyError, TypeError) as exc:
        raise storage.DamagedFile(f"{uri} is not a valid checkpoint record ({type(exc).__name__}: {exc})") from None


def _unpickle(data: bytes, uri: storage.Uri, output: storage.Uri | None = None) -> dict[str, Any]:
    """The state in ``data``; a damaged file is named (with what to do, given ``output``)."""
    # weights_only: a checkpoint is data, never code to run. Tensors saved from a GPU load onto
    # the host (the trainer moves them where its model and optimizer live).
    try:
        raw = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises many kinds on damaged bytes; all mean the same here
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        problem = f"{uri} is not a readable checkpoint ({reason})"
    else:
        if isinstance(raw, dict):
            return raw
        problem = f"{uri} is not a gnnflow checkpoint (it holds a {type(raw).__name__})"
    raise storage.DamagedFile(problem if output is None else f"{problem}; {_what_to_do(output)}")


def _read(output: storage.Uri, data_file: str, record_file: str) -> dict[str, Any] | None:
    """One checkpoint file's state, checked against its record; None if there is no file."""
    uri = output.join(data_file)
    if not storage.exists(uri):
        return None
    if storage.exists(output.join(record_file)):
        record = _record(output, record_file)
        entry = storage.FileEntry(int(record["size"]), str(record["crc32c"]))
        data = storage.read_verified(uri, storage.Expected(entry, f"its record {output.join(record_file)}"))
    else:  # written by a gnnflow before records, or the write of its record was cut short
        data = storage.read_bytes(uri)
    return _unpickle(data, uri)


def load(output: storage.Uri, expected_fingerprint: str, *, announce: bool = True) -> TrainingState | None:
    """The saved state if there is one for this same training setup, else None.

    A damaged newest checkpoint is skipped for the previous one (``announce``: say so in the log);
    when no checkpoint is good the run is refused, naming the damage and what to do.
    """
    damage: list[str] = []
    for data_file, record_file in ((CHECKPOINT_FILE, RECORD_FILE), (PREVIOUS_FILE, PREVIOUS_RECORD_FILE)):
        try:
            raw = _read(output, data_file, record_file)
        except storage.DamagedFile as error:  # not a failure to read: that fails the run as it is
            damage.append(str(error))
            continue
        if raw is None:
            continue
        same_setup = raw.get("fingerprint") == expected_fingerprint
        if damage and announce:
            instead = "resuming from" if same_setup else "training from the start: the setup differs from"
            log.warning("%s; %s the previous checkpoint, %s", damage[0], instead, output.join(data_file))
        return TrainingState(**raw) if same_setup else None
    if damage:
        raise GnnflowError(f"{'; '.join(damage)}; there is no earlier good checkpoint: restore the file, or {_what_to_do(output)}")
    return None


def for_rank(state: TrainingState, rank: int) -> dict[str, Any]:
    """What ``state`` holds for ``rank`` alone (empty for a checkpoint written before ranks had their own)."""
    return state.ranks[rank] if rank < len(state.ranks) else {}
