"""A stored edge type's adjacency in the form GLT 0.2.4's ``Topology`` keeps, built without copies.

GLT holds a sampled edge type as CSR (``edge_dir: out``: ``indptr`` over source ids, ``indices``
the destinations) or CSC (``in``: over destinations, ``indices`` the sources), plus the edge ids
in the same order, all int64 and in shared memory (``Graph`` calls ``share_memory_()`` on each,
which copies a tensor not already there). Given COO it converts with torch_sparse, which sorts
every edge (about six int64 copies of the edge list at once). Partitions store their edges in
that order already, with the row pointer over the owned nodes (:mod:`components.partition.store`),
so here the tensors are only placed: ``indptr`` is widened to the id range GLT indexes (zeros
for the ids below this partition's), ``indices`` and edge ids are the stored ones, allocated in
shared memory from the start. Partitions written before that order are handed over as COO, as
before. Edge ids only serve to look up edge features: a graph without any, sampled on the host,
gets a stand-in of the right length that holds one value (GLT checks the length; its CPU sampler
reads the ids only for batches that carry edges, ``with_edge``, which needs edge features; its
GPU modes copy them whole, so there they are real).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from components.gnn.device import Placement
from components.partition.output import PartitionMetadata, range_offset
from components.runtime.shared_tensors import empty_tensor
from components.schema import GraphSchema, stored_edge_types


@dataclass(frozen=True)
class GltTopology:
    """What ``DistDataset.init_graph`` takes for one edge type: ``edge_index`` in ``layout``."""

    edge_index: torch.Tensor | tuple[torch.Tensor, torch.Tensor]
    edge_ids: torch.Tensor
    layout: str  # "CSR", "CSC" or "COO"


def glt_topology(
    tensors: dict[str, torch.Tensor],
    *,
    edge_dir: str,
    first_owned: int,
    first_edge: int,
    keep: torch.Tensor | None = None,
    edge_ids: bool = True,
) -> GltTopology:
    """The adjacency of one stored edge type's tensors (a partition's ``edges[type]``), ``keep``
    masking the edges that stay (None: all). ``first_owned``: partition id of this partition's
    first node of the compressed end's type (the source's with ``edge_dir`` out); ``first_edge``:
    its first edge id of the type. ``edge_ids`` False: no batch carries edges (no edge features,
    graph on the host), and GLT gets the stand-in ids."""
    if "indptr" not in tensors:  # older partitions: GLT sorts them itself
        if keep is None:
            return GltTopology(tensors["edge_index"], tensors["edge_id"], "COO")
        return GltTopology(tensors["edge_index"][:, keep], tensors["edge_id"][keep], "COO")
    local = tensors["indptr"]
    if "indices" in tensors:  # read for sampling: already in shared memory
        if keep is not None:
            raise ValueError("a partition read for sampling keeps no edge_index to filter: read it whole")
        indices = tensors["indices"]
        ids = tensors.get("edge_id", _shared_range(first_edge, len(indices))) if edge_ids else unused_edge_ids(len(indices))
    else:
        other = tensors["edge_index"][1 if edge_dir == "out" else 0]
        indices = _shared_rows(other, keep)
        ids = _shared_rows(tensors["edge_id"], keep) if edge_ids else unused_edge_ids(len(indices))
        if keep is not None:
            local = _kept_pointer(local, keep)
    indptr = empty_tensor((first_owned + len(local),), torch.int64, shared=True)
    indptr[:first_owned] = 0
    indptr[first_owned:] = local
    if edge_dir == "out":
        return GltTopology((indptr, indices), ids, "CSR")
    return GltTopology((indices, indptr), ids, "CSC")


def unused_edge_ids(count: int) -> torch.Tensor:
    """``count`` edge ids held in 8 bytes (all 0): for a graph whose batches never carry edges."""
    return torch.zeros(1, dtype=torch.int64).expand(count)


def _shared_range(first: int, count: int) -> torch.Tensor:
    """Edge ids ``first .. first + count - 1`` (a partition's stored edge ids) in shared memory."""
    out = empty_tensor((count,), torch.int64, shared=True)
    torch.arange(first, first + count, out=out)
    return out


def _shared_rows(values: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """``values`` (or its kept entries) written once, into shared memory."""
    if keep is None:
        return empty_tensor(tuple(values.shape), values.dtype, shared=True).copy_(values)
    out = empty_tensor((int(keep.sum()),), values.dtype, shared=True)
    torch.masked_select(values, keep, out=out)
    return out


def _kept_pointer(indptr: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The row pointer once only the ``keep`` edges remain (their order is unchanged)."""
    kept_before = torch.zeros(len(keep) + 1, dtype=torch.int64)
    torch.cumsum(keep, 0, out=kept_before[1:])
    return kept_before[indptr]


def has_edge_features(schema: GraphSchema) -> bool:
    return any(e.feature_dim for e in schema.message_edge_types.values())


def glt_graphs(
    metadata: PartitionMetadata,
    index: int,
    edges: dict[str, dict[str, torch.Tensor]],
    placement: Placement,
    edge_filter: dict[str, torch.Tensor] | None = None,
) -> dict[tuple[str, str, str], Any]:
    """GLT ``Graph`` per stored message edge type of partition ``index`` (its ``edges``), built and
    initialised as ``DistDataset.init_graph`` would (``Topology`` in the partition's layout, then
    ``Graph.lazy_init``). Built apart from the dataset so that a reader can build them before it
    reads the node tables: GLT's C++ initialisation counts the distinct ``indices`` with a sort
    (about three times their size for a moment), which then overlaps nothing else."""
    from graphlearn_torch.data.graph import Graph, Topology

    edge_dir = "out" if metadata.edge_assignment == "src" else "in"
    ids = has_edge_features(metadata.schema) or placement.graph_mode != "CPU"
    graphs = {}
    for name, ends in stored_edge_types(metadata.schema).items():  # label edge tables carry no messages
        compressed = ends[0] if edge_dir == "out" else ends[2]
        topology = glt_topology(
            edges[name],
            edge_dir=edge_dir,
            first_owned=range_offset(metadata.node_counts[compressed], index),
            first_edge=range_offset(metadata.edge_counts[name], index),
            keep=edge_filter.get(name) if edge_filter else None,
            edge_ids=ids,
        )
        layout = "CSR" if edge_dir == "out" else "CSC"
        adjacency = Topology(topology.edge_index, topology.edge_ids, input_layout=topology.layout, layout=layout)
        graph = Graph(adjacency, placement.graph_mode, placement.cuda_index if placement.on_cuda else None)
        graph.lazy_init()
        graphs[ends] = graph
    return graphs
