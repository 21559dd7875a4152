"""An infer output, opened for serving: its embeddings by partition id, and top-k retrieval.

- Embeddings: each node type's shards (``embeddings/<type>/part-*.parquet``) are put in
  partition-id order once, into ``.npy`` files of the cache, and memory-mapped.
- Retrieval (link prediction): the faiss index shards infer built for the destination type
  (``retrieval/index/part-*.faiss`` with their row → original id maps) are searched for each
  query and the shards' lists merged, best first; where infer built none (retrieval off),
  candidates are found exactly: the inner product with every destination embedding. Scores are
  inner products in the decoder's space, the ``dot`` decoder's logits, as infer's candidates.
"""

from __future__ import annotations

import io
import logging
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from components.errors import GnnflowError
from components.infer.output import EMBEDDINGS_FOLDER
from components.infer.retrieval import INDEX_DIR
from components.serving.graph_store import GraphStore
from components.serving.local_files import LocalOutput
from components.serving.tensor_files import built_npy

log = logging.getLogger("gnnflow.serving")
_INDEX_NAME = re.compile(r"part-(\d+)\.faiss$")


def _table(local: LocalOutput, relative: str, columns: list[str] | None = None) -> pa.Table:
    with open(local.path(relative), "rb") as handle:
        return pq.read_table(io.BytesIO(handle.read()), columns=columns)


class StoredEmbeddings:
    """An infer output's embeddings, node type → (n, hidden) memmap by partition id."""

    def __init__(self, local: LocalOutput, store: GraphStore, hidden: int) -> None:
        self.local = local
        self.mode = str(local.published.manifest.metadata.get("mode", "sampled"))
        self.rows = {t: self._rows(t, store, hidden) for t in store.counts}

    def _rows(self, node_type: str, store: GraphStore, hidden: int) -> np.ndarray:
        def build() -> np.ndarray:
            out = np.zeros((store.counts[node_type], hidden), dtype=np.float32)
            seen = np.zeros(store.counts[node_type], dtype=bool)
            for relative in self.local.published.files_under(f"{EMBEDDINGS_FOLDER}/{node_type}"):
                table = _table(self.local, relative, ["node_id", "embedding"])
                ids = store.ids[node_type].lookup(table.column("node_id").to_pylist())
                column = table.column("embedding").combine_chunks()
                flat = np.asarray(column.flatten().to_numpy(zero_copy_only=False), dtype=np.float32)
                if (ids < 0).any() or len(flat) != len(ids) * hidden:
                    raise GnnflowError(
                        f"{self.local.published.uri(relative)} does not fit the partitions and model served "
                        f"({int((ids < 0).sum())} unknown node ids, or embeddings not {hidden} wide): give the infer output of this model"
                    )
                out[ids], seen[ids] = flat.reshape(len(ids), hidden), True
            if not seen.all():
                raise GnnflowError(f"{self.local.published.root} holds no embedding of {int((~seen).sum())} {node_type!r} nodes")
            return out

        return built_npy(self.local.derived_path(f"embeddings-{node_type}.npy"), build)


class Retrieval:
    """Top-k destinations of a query embedding (see the module docstring)."""

    def __init__(self, dst_type: str, embeddings: StoredEmbeddings, store: GraphStore, same_type: bool) -> None:
        import faiss

        self.dst_type, self.same_type = dst_type, same_type
        local = embeddings.local
        shards = sorted(p for p in local.published.files_under(INDEX_DIR) if _INDEX_NAME.search(p))
        self.indexes = []
        for relative in shards:
            with open(local.path(relative), "rb") as handle:
                index = faiss.deserialize_index(np.frombuffer(handle.read(), dtype=np.uint8))
            ids = _table(local, relative.replace(".faiss", ".ids.parquet"), ["row", "node_id"])
            order = np.argsort(ids.column("row").to_numpy())
            self.indexes.append((index, ids.column("node_id").combine_chunks().take(pa.array(order))))
        faiss.omp_set_num_threads(1)  # a query batch is small: threads would only add start-up cost
        self.exact = embeddings.rows[dst_type] if not self.indexes else None
        self.exact_originals: pa.Array | None = None
        if self.exact is not None:
            self.exact_originals = _originals_by_partition_id(store, dst_type)
        log.info(
            "serving: retrieval of %r from %s",
            dst_type,
            f"{len(self.indexes)} faiss index shard(s)" if self.indexes else "exact inner products",
        )

    def search(self, queries: np.ndarray, k: int, exclude: list[str | None]) -> list[list[dict[str, object]]]:
        """Per query, up to ``k`` candidates best first; ``exclude[i]``: the query's own original id
        (left out when sources and destinations are one type), or None."""
        depth = k + int(self.same_type)
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        lists: list[tuple[np.ndarray, list[list[str | None]]]] = []
        if self.exact is not None:
            scores = queries @ np.asarray(self.exact).T
            depth = min(depth, scores.shape[1])
            top = np.argpartition(-scores, depth - 1, axis=1)[:, :depth] if depth else np.zeros((len(queries), 0), np.int64)
            originals = self.exact_originals.take(pa.array(top.reshape(-1))).to_pylist()  # type: ignore[union-attr]
            lists.append((np.take_along_axis(scores, top, 1), [originals[i * depth : (i + 1) * depth] for i in range(len(queries))]))
        for index, originals_of in self.indexes:
            found = min(depth, index.ntotal)
            if not found:
                continue
            scores, rows = index.search(queries, found)
            names = originals_of.take(pa.array(np.maximum(rows, 0).reshape(-1))).to_pylist()
            named = [[n if r >= 0 else None for n, r in zip(names[i * found : (i + 1) * found], rows[i])] for i in range(len(queries))]
            lists.append((scores, named))
        out = []
        for i in range(len(queries)):
            pairs = [(float(s), n) for scores, names in lists for s, n in zip(scores[i], names[i]) if n is not None and n != exclude[i]]
            pairs.sort(key=lambda p: (-p[0], p[1]))
            out.append([{"node_type": self.dst_type, "node_id": n, "score": s} for s, n in pairs[:k]])
        return out


def _originals_by_partition_id(store: GraphStore, node_type: str) -> pa.Array:
    """Original ids of every node of ``node_type``, in partition-id order."""
    from components.partition.store import original_ids_path, part_folder

    parts = [
        _table(store.local, original_ids_path(part_folder(p), node_type), ["original_id"]).column("original_id")
        for p in range(store.metadata.num_partitions)
    ]
    return pa.chunked_array([c for part in parts for c in part.chunks], pa.string()).combine_chunks()
