"""A seeded, bounded sample of the published embeddings, read one shard at a time.

Every node gets a pseudo-random key from a keyed hash of its node type and original id; the
sample is the ``limit`` nodes with the smallest keys. So it is uniform over the nodes, the same
for the same seed however many workers wrote the shards (and in sampled or exact mode), and
memory stays bounded by one shard plus the sample.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from components.errors import GnnflowError
from components.report.inputs import InferenceRecord


@dataclass(frozen=True)
class EmbeddingSample:
    """Sampled nodes, rows ordered by their sampling key."""

    node_types: np.ndarray  # (m,) str
    node_ids: np.ndarray  # (m,) str, the ids of the user's tables
    embeddings: np.ndarray  # (m, hidden) float32
    classes: np.ndarray | None  # (m,) str predicted class names; None unless predictions were asked for
    total: int  # nodes the sample was drawn from

    def __len__(self) -> int:
        return len(self.node_ids)


@dataclass(frozen=True)
class _Rows:
    keys: np.ndarray
    node_types: np.ndarray
    node_ids: np.ndarray
    embeddings: np.ndarray
    classes: np.ndarray | None

    def take(self, index: np.ndarray) -> _Rows:
        return _Rows(
            self.keys[index],
            self.node_types[index],
            self.node_ids[index],
            self.embeddings[index],
            None if self.classes is None else self.classes[index],
        )

    def smallest(self, limit: int) -> _Rows:
        """The ``limit`` rows of smallest key, in key order."""
        return self.take(np.argsort(self.keys, kind="stable")[:limit])


def _hash_key(seed: int) -> str:
    """pandas' keyed hash takes exactly 16 characters of key."""
    return f"{seed & 0xFFFFFFFFFFFFFFFF:016x}"[-16:]


def sampling_keys(node_type: str, node_ids: np.ndarray, seed: int) -> np.ndarray:
    """(n,) uint64 keys of the original ids ``node_ids`` (str objects) of one node type."""
    key = _hash_key(seed)
    ids = pd.util.hash_array(np.asarray(node_ids, dtype=object), hash_key=key, categorize=False)
    type_hash = pd.util.hash_array(np.asarray([node_type], dtype=object), hash_key=key, categorize=False)[0]
    return ids ^ type_hash  # the same id in two node types gets two unrelated keys


def embedding_rows(table: pa.Table, where: str) -> np.ndarray:
    """(rows, hidden) float32 of the ``embedding`` list column; every row must have the same length."""
    column = table.column("embedding").combine_chunks()
    if column.null_count:
        raise GnnflowError(f"{where}: {column.null_count} rows have no embedding")
    lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
    if len(lengths) == 0:
        return np.zeros((0, 0), np.float32)
    if lengths.min() != lengths.max():
        raise GnnflowError(f"{where}: embeddings of different lengths ({lengths.min()} to {lengths.max()})")
    flat = np.asarray(column.flatten().to_numpy(zero_copy_only=False), dtype=np.float32)
    return flat.reshape(len(column), int(lengths[0]))


def _read_shard(inference: InferenceRecord, path: str, node_type: str, limit: int, with_classes: bool, seed: int) -> tuple[_Rows, int]:
    """The shard's ``limit`` rows of smallest key (only their embeddings are converted), and its row count."""
    where = str(inference.output.uri(path))
    columns = ["node_id", "embedding"] + (["prediction"] if with_classes else [])
    try:
        table = pq.read_table(io.BytesIO(inference.output.read_bytes(path)), columns=columns)
    except (pa.ArrowException, KeyError, ValueError) as exc:
        raise GnnflowError(f"{where} is not an embeddings shard with columns {', '.join(columns)}: {exc}") from None
    node_ids = np.asarray(table.column("node_id").to_numpy(zero_copy_only=False), dtype=object)
    keys = sampling_keys(node_type, node_ids, seed)
    chosen = np.argsort(keys, kind="stable")[:limit]
    table = table.take(pa.array(chosen))
    classes = None
    if with_classes:
        classes = np.asarray(table.column("prediction").to_numpy(zero_copy_only=False), dtype=object).astype(str)
    rows = _Rows(
        keys[chosen], np.full(len(chosen), node_type).astype(str), node_ids[chosen].astype(str), embedding_rows(table, where), classes
    )
    return rows, len(keys)


def _concat(a: _Rows | None, b: _Rows, where: str) -> _Rows:
    if a is None:
        return b
    if a.embeddings.shape[1] != b.embeddings.shape[1] and len(a.keys) and len(b.keys):
        raise GnnflowError(f"{where}: embeddings of length {b.embeddings.shape[1]}, earlier shards have {a.embeddings.shape[1]}")
    if not len(b.keys):
        return a
    if not len(a.keys):
        return b
    classes = None if a.classes is None or b.classes is None else np.concatenate([a.classes, b.classes])
    return _Rows(
        np.concatenate([a.keys, b.keys]),
        np.concatenate([a.node_types, b.node_types]),
        np.concatenate([a.node_ids, b.node_ids]),
        np.concatenate([a.embeddings, b.embeddings]),
        classes,
    )


def sample_embeddings(inference: InferenceRecord, node_types: list[str], limit: int, seed: int, with_classes: bool) -> EmbeddingSample:
    """At most ``limit`` nodes of ``node_types``, uniformly at random for ``seed``.

    with_classes: also read each node's ``prediction`` (the classification target's shards have it).
    """
    kept: _Rows | None = None
    total = 0
    for node_type in node_types:
        for path in inference.shards.get(node_type, []):
            rows, count = _read_shard(inference, path, node_type, limit, with_classes, seed)
            total += count
            kept = _concat(kept, rows, str(inference.output.uri(path))).smallest(limit)
    if kept is None or not len(kept.keys):
        raise GnnflowError(f"{inference.output.root} holds no embedded nodes of type {', '.join(node_types)}")
    return EmbeddingSample(kept.node_types, kept.node_ids, kept.embeddings, kept.classes, total)
