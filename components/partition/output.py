"""What the ``partition`` step publishes, and everything later steps read of it: the stored
partitions (:mod:`.store`) and the range partition books that map ids to partitions
(:mod:`.books`). Train, infer and the GNN runtime import these from here."""

from __future__ import annotations

from components.partition.books import IdDirectory, hash_owner, range_ends, range_offset, range_owner
from components.partition.store import METADATA_FILE, PartitionMetadata, StoredPartition, read_metadata, read_original_ids, read_partition

__all__ = [
    "METADATA_FILE",
    "STEP",
    "IdDirectory",
    "PartitionMetadata",
    "StoredPartition",
    "hash_owner",
    "range_ends",
    "range_offset",
    "range_owner",
    "read_metadata",
    "read_original_ids",
    "read_partition",
]

STEP = "partition"
