"""What the ``partition`` step publishes, and everything later steps read of it: the stored
partitions (:mod:`.store`) and the range partition books that map ids to partitions
(:mod:`.books`). Train, infer and the GNN runtime import these from here."""

from __future__ import annotations

from components import storage
from components.partition.books import IdDirectory, hash_owner, range_ends, range_offset, range_owner
from components.partition.store import (
    METADATA_FILE,
    PartitionMetadata,
    StoredPartition,
    original_ids_path,
    part_folder,
    read_metadata,
    read_original_ids,
    read_partition,
)
from components.partition.tensor_read import header_entries

__all__ = [
    "METADATA_FILE",
    "STEP",
    "IdDirectory",
    "PartitionMetadata",
    "StoredPartition",
    "hash_owner",
    "header_entries",
    "original_ids_path",
    "part_folder",
    "range_ends",
    "range_offset",
    "range_owner",
    "read_metadata",
    "read_original_ids",
    "read_partition",
    "source_of",
]

STEP = "partition"


def source_of(partitions: storage.PublishedOutput) -> tuple[str | None, str | None]:
    """The serialize output these partitions were made from and its generation then, as the
    manifest records them (None where it does not: partitions made by hand, or an older gnnflow)."""
    metadata = partitions.manifest.metadata
    return metadata.get("source"), metadata.get("source_generation")
