"""Original node id (the user's table's id, a string) → partition id, per node type.

Stored as two ``.npy`` files per type in the cache, memory-mapped: the 64-bit hashes of the
original ids (pandas' stable SipHash of the string), sorted, and the partition id of each.
16 bytes per node on disk; a lookup is a binary search, touching about log2(n) pages. Two
original ids with the same hash would make lookups ambiguous: building refuses them (the
chance is about n² / 2^65, 4e-7 at 4M nodes).
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from components.errors import GnnflowError
from components.partition.store import original_ids_path, part_folder
from components.serving.local_files import LocalOutput
from components.serving.tensor_files import built_npy


def hash_ids(originals: Sequence[str] | np.ndarray) -> np.ndarray:
    """(n,) uint64 stable hashes of original ids (as strings)."""
    values = np.asarray([str(v) for v in originals], dtype=object) if not isinstance(originals, np.ndarray) else originals.astype(object)
    return pd.util.hash_array(values, categorize=False)


class IdIndex:
    """One node type's original id → partition id map (see the module docstring)."""

    def __init__(self, hashes: np.ndarray, ids: np.ndarray) -> None:
        self.hashes, self.ids = hashes, ids

    @staticmethod
    def build(local: LocalOutput, node_type: str, num_partitions: int) -> IdIndex:
        def read_all() -> tuple[np.ndarray, np.ndarray]:
            hashes, ids = [], []
            for index in range(num_partitions):
                relative = original_ids_path(part_folder(index), node_type)
                table = pq.read_table(io.BytesIO(open(local.path(relative), "rb").read()))  # noqa: SIM115 - read whole, closed by GC
                originals = np.asarray(table.column("original_id").to_numpy(zero_copy_only=False), dtype=object)
                hashes.append(hash_ids(originals))
                ids.append(table.column("node_id").to_numpy().astype(np.int64))
            hashed, node = np.concatenate(hashes), np.concatenate(ids)
            order = np.argsort(hashed, kind="stable")
            hashed, node = hashed[order], node[order]
            if len(hashed) > 1 and bool((hashed[1:] == hashed[:-1]).any()):
                raise GnnflowError(
                    f"{local.published.root}: two original ids of node type {node_type!r} share a 64-bit hash: serving cannot index them"
                )
            return hashed, node

        built: dict[str, np.ndarray] = {}

        def part(name: str) -> np.ndarray:
            if not built:
                built["hash"], built["node"] = read_all()
            return built[name]

        hashes = built_npy(local.derived_path(f"ids-{node_type}-hash.npy"), lambda: part("hash"))
        ids = built_npy(local.derived_path(f"ids-{node_type}-node.npy"), lambda: part("node"))
        return IdIndex(hashes, ids)

    def lookup(self, originals: Sequence[str]) -> np.ndarray:
        """(k,) partition ids of ``originals``; -1 where an id is not a node of the type."""
        if not len(originals) or not len(self.hashes):
            return np.full(len(originals), -1, dtype=np.int64)
        wanted = hash_ids(originals)
        at = np.minimum(np.searchsorted(self.hashes, wanted), len(self.hashes) - 1)
        return np.where(self.hashes[at] == wanted, self.ids[at], -1).astype(np.int64)
