"""The stored graph as the server reads it: memory-mapped features, a CSR adjacency per message
edge type in the direction the model aggregates, and the original-id index.

Nothing of size O(nodes) or O(edges) is held in anonymous memory:

- features: per partition, a read-only ``np.memmap`` over the ``features`` tensor of
  ``part-<p>/nodes/<type>.safetensors`` (the published file itself, or its checked copy);
- adjacency: per stored message edge type, ``indptr`` (n_aggregating + 1) and ``indices``
  (neighbour partition ids), built once from the partitions' edge files into the cache as
  ``.npy`` and opened with ``np.load(mmap_mode="r")``. A node aggregates over the edges its own
  partition holds, as the samplers and exact inference do: edges assigned by source
  (``edge_dir`` out) give a node its out-neighbours, by destination its in-neighbours. Link
  prediction leaves out the validation and test positives, as training and infer do;
- ids: :class:`~components.serving.id_index.IdIndex` per node type.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from components.errors import GnnflowError
from components.feature_storage.codec import codec_of, log_clipped
from components.gnn.build import batch_edge_types
from components.gnn.link_labels import HELD_OUT, target_edge_names
from components.gnn.model import EdgeType
from components.partition.output import METADATA_FILE, PartitionMetadata
from components.partition.store import part_folder
from components.schema import SPLIT_CODES, GraphSchema, stored_edge_types
from components.serving.id_index import IdIndex
from components.serving.local_files import LocalOutput
from components.serving.tensor_files import built_npy, map_safetensors

log = logging.getLogger("gnnflow.serving")


@dataclass(frozen=True)
class Relation:
    """One way nodes of type ``aggregating`` gather messages: along stored edge type ``stored``
    from ``neighbour`` nodes, arriving at the encoder as edge type ``batch``."""

    stored: str
    aggregating: str
    neighbour: str
    batch: EdgeType


@dataclass(frozen=True)
class Adjacency:
    """CSR rows of the aggregating type (partition ids): neighbours of node v are
    ``indices[indptr[v]:indptr[v + 1]]``."""

    indptr: np.ndarray
    indices: np.ndarray


def relations_of(schema: GraphSchema, edge_dir: str) -> list[Relation]:
    """Every stored message edge type, seen from the end that aggregates along it."""
    batch = batch_edge_types(schema, edge_dir)
    out = []
    for name, (src, _, dst) in stored_edge_types(schema).items():
        aggregating, neighbour = (src, dst) if edge_dir == "out" else (dst, src)
        out.append(Relation(name, aggregating, neighbour, batch[name]))
    return out


class GraphStore:
    """A published partition output, opened for serving (see the module docstring)."""

    def __init__(self, local: LocalOutput) -> None:
        self.local = local
        self.metadata = PartitionMetadata.from_json(open(local.path(METADATA_FILE)).read(), str(local.published.uri(METADATA_FILE)))  # noqa: SIM115
        self.schema = self.metadata.schema
        self.edge_dir = "out" if self.metadata.edge_assignment == "src" else "in"
        self.counts = {t: int(sum(c)) for t, c in self.metadata.node_counts.items()}
        self.ends = {t: np.cumsum(np.asarray(c, dtype=np.int64)) for t, c in self.metadata.node_counts.items()}
        self.relations = relations_of(self.schema, self.edge_dir)
        parts = range(self.metadata.num_partitions)
        nodes = {t: [map_safetensors(local.path(f"{part_folder(p)}/nodes/{t}.safetensors")) for p in parts] for t in self.counts}
        self.features = {t: [n["features"] for n in nodes[t]] for t in self.counts if self.schema.node_types[t].feature_dim}
        self.codecs = {t: codec_of(self.schema.node_types[t], f"{METADATA_FILE}, node type {t!r}") for t in self.features}
        self.rows = {t: self._rows(t, [n["node_id"] for n in nodes[t]]) for t in self.counts}
        self.adjacency = {r.stored: self._adjacency(r) for r in self.relations}
        self.ids = {t: IdIndex.build(local, t, self.metadata.num_partitions) for t in self.counts}

    def _rows(self, node_type: str, node_ids: list[np.ndarray]) -> np.ndarray | None:
        """(n,) row in its partition's file of each partition id; None when every file lists
        its range in order (what partition writes), so the row is the id minus the offset."""
        offsets = np.concatenate([[0], self.ends[node_type][:-1]])
        if all(np.array_equal(ids, np.arange(o, o + len(ids))) for ids, o in zip(node_ids, offsets)):
            return None

        def build() -> np.ndarray:
            rows = np.full(self.counts[node_type], -1, dtype=np.int64)
            for ids in node_ids:
                rows[np.asarray(ids, dtype=np.int64)] = np.arange(len(ids))
            if (rows < 0).any():
                raise GnnflowError(f"{self.local.published.root}: the partitions do not list every {node_type!r} node")
            return rows

        return built_npy(self.local.derived_path(f"rows-{node_type}.npy"), build)

    def owner(self, node_type: str, ids: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.ends[node_type], ids, side="right")

    def gather_features(self, node_type: str, ids: np.ndarray) -> np.ndarray:
        """(k, d) float32 features of partition ids ``ids`` (k,) of a featured type, decoded from
        their stored type as the model decodes a batch's rows."""
        tables = self.features[node_type]
        out = np.empty((len(ids), tables[0].shape[1]), dtype=tables[0].dtype)
        owner = self.owner(node_type, ids)
        offsets = np.concatenate([[0], self.ends[node_type][:-1]])
        rows_of = self.rows[node_type]
        for p in np.unique(owner):
            at = np.flatnonzero(owner == p)
            rows = rows_of[ids[at]] if rows_of is not None else ids[at] - offsets[p]
            out[at] = tables[p][rows]
        return self.codecs[node_type].decode_array(out)

    def as_stored(self, node_type: str, rows: np.ndarray) -> np.ndarray:
        """(k, d) float32 transformed rows of new nodes → (k, d) float32 as a stored row of the type
        reads back (encoded and decoded): a new node is encoded as if partition had stored it."""
        codec = self.codecs.get(node_type)
        if codec is None or codec.storage == "float32":
            return rows
        stored, clipped = codec.encode(torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float32)))
        log_clipped(clipped, f"serving: new {node_type!r} nodes")
        return codec.decode(stored).numpy()

    def _edge_keep(self, stored: str, edges: dict[str, np.ndarray], held: dict[str, np.ndarray]) -> np.ndarray | None:
        """Which of a partition's edges carry messages (None: all)."""
        schema = self.schema
        if schema.task_type != "link_prediction" or stored not in target_edge_names(schema):
            return None
        if schema.label_edge_type("positive_label") is None:
            return np.asarray(edges["split"]) == SPLIT_CODES["train"]
        src, dst = np.asarray(edges["edge_index"][0]), np.asarray(edges["edge_index"][1])
        width = self.counts[stored.split("__")[2]]
        return ~np.isin(src * width + dst, held[stored])

    def _held_out_keys(self) -> dict[str, np.ndarray]:
        """Per stored target type, the keys (src * n_dst + dst) of held-out positive label pairs,
        as the stored target type holds them (both directions within one node type)."""
        schema = self.schema
        table = schema.label_edge_type("positive_label")
        if schema.task_type != "link_prediction" or table is None:
            return {}
        pairs = []
        for p in range(self.metadata.num_partitions):
            labels = map_safetensors(self.local.path(f"{part_folder(p)}/edges/{table}.safetensors"))
            keep = np.isin(np.asarray(labels["split"]), np.asarray(HELD_OUT))
            pairs.append(np.asarray(labels["edge_index"])[:, keep])
        u, v = np.concatenate(pairs, axis=1) if pairs else np.zeros((2, 0), np.int64)
        edge = schema.edge_types[schema.target]
        keys: dict[str, np.ndarray] = {}
        if edge.undirected and edge.src_type == edge.dst_type:
            keys[schema.target] = np.concatenate([u * self.counts[edge.dst_type] + v, v * self.counts[edge.dst_type] + u])
        else:
            keys[schema.target] = u * self.counts[edge.dst_type] + v
            if edge.undirected:
                keys[f"{edge.dst_type}__rev_{edge.relation}__{edge.src_type}"] = v * self.counts[edge.src_type] + u
        return keys

    def _adjacency(self, relation: Relation) -> Adjacency:
        stored, aggregating = relation.stored, relation.aggregating
        prefix = self.local.derived_path(f"csr-{stored}-{self.edge_dir}")
        built: dict[str, np.ndarray] = {}

        def build() -> None:
            held = self._held_out_keys()
            by_source = self.edge_dir == "out"
            indptr, indices = [np.zeros(1, dtype=np.int64)], []
            offsets = np.concatenate([[0], self.ends[aggregating][:-1]])
            for p in range(self.metadata.num_partitions):  # one partition's edges at a time
                edges = map_safetensors(self.local.path(f"{part_folder(p)}/edges/{stored}.safetensors"))
                index = np.asarray(edges["edge_index"], dtype=np.int64)
                keep = self._edge_keep(stored, edges, held)
                if keep is not None:
                    index = index[:, keep]
                at, other = (index[0], index[1]) if by_source else (index[1], index[0])
                local = at - offsets[p]
                count = self.metadata.node_counts[aggregating][p]
                if len(local) and (local.min() < 0 or local.max() >= count):
                    raise GnnflowError(f"{self.local.published.root}: partition {p} holds {stored!r} edges of nodes it does not own")
                order = np.argsort(local, kind="stable")
                indptr.append(np.cumsum(np.bincount(local, minlength=count)) + indptr[-1][-1])
                indices.append(other[order])
            built["indptr"] = np.concatenate(indptr)
            built["indices"] = np.concatenate(indices) if indices else np.zeros(0, np.int64)

        def part(name: str) -> np.ndarray:
            if not built:
                build()
            return built.pop(name)

        indptr = built_npy(f"{prefix}-indptr.npy", lambda: part("indptr"))
        indices = built_npy(f"{prefix}-indices.npy", lambda: part("indices"))
        log.info("serving: %s adjacency (%s): %d rows, %d edges", stored, self.edge_dir, len(indptr) - 1, len(indices))
        return Adjacency(indptr, indices)
