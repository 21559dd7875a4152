"""Distributed partitioning over torch.distributed: every worker ends with partition ``rank``.

Nodes are assigned to partitions (by a seeded hash of their id, or refined for locality, see
:mod:`.assignment`), move to their owners with one all-to-all per tensor, and are renumbered so
that each partition owns a contiguous id range per type (:mod:`.books`). Edge endpoints are
renumbered through an :class:`~.books.IdDirectory`; edges follow the owner of their source (or
destination) node; undirected edges are stored in both directions, as GLT's samplers expect
directed adjacency. Nothing on a worker grows with the whole graph, only with its share.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from components.config import PartitionSpec
from components.errors import GnnflowError
from components.partition.assignment import hash_assignment, propagated_assignment
from components.partition.books import IdDirectory, range_ends, range_offset, range_owner
from components.partition.loading import LoadedGraph
from components.runtime.collectives import all_gather_int, all_sum_int, exchange
from components.schema import GraphSchema


@dataclass
class GraphPartition:
    """Partition ``index`` of ``num_partitions``, in partition ids (contiguous per partition).

    nodes[type]: node_id (n,) = offset..offset+n-1, source_id (n,) the id preprocess gave it
        (increasing), features (n, d), label (n,) if labeled, split (n,) int8
    edges[type]: edge_index (2, e) [src; dst] partition node ids, sorted by the end whose owner
        stores the edge, then the other end, then source_edge_id (compressed order, as GLT's CSR
        or CSC holds them); indptr (n + 1,) the row pointer of that end over its n owned nodes;
        edge_id (e,) = offset..offset+e-1, source_edge_id (e,) (``count + i`` is the reverse copy
        of undirected edge ``i``), features (e, d_e), split (e,) int8
    node_counts / edge_counts[type]: (P,) rows per partition, every worker's: the range books
    cut_edges[type]: stored edges of the type whose ends lie in different partitions (all workers')
    """

    index: int
    num_partitions: int
    nodes: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    edges: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    node_counts: dict[str, list[int]] = field(default_factory=dict)
    edge_counts: dict[str, list[int]] = field(default_factory=dict)
    cut_edges: dict[str, int] = field(default_factory=dict)
    directories: dict[str, IdDirectory] = field(default_factory=dict, repr=False)


def _check_range(ids: torch.Tensor, count: int, what: str) -> None:
    """All workers agree before raising, so nobody is left waiting in a collective."""
    bad = int(((ids < 0) | (ids >= count)).sum()) if len(ids) else 0
    if all_sum_int(bad):
        raise GnnflowError(
            f"{what}: {all_sum_int(bad)} id(s) outside 0..{count - 1} in the shards: graph_metadata.json disagrees with the shards"
        )


def partition_nodes(graph: LoadedGraph, metadata: GraphSchema, owners: dict[str, torch.Tensor], part: GraphPartition) -> None:
    """Moves every loaded node to ``owners[type]`` (aligned with the loaded rows) and renumbers;
    takes each type out of ``graph`` as it goes, so a worker never holds its rows twice over."""
    world_size = part.num_partitions
    for name in metadata.node_types:
        loaded = graph.nodes.pop(name)  # the worker keeps one copy of its rows at a time, not two
        mine = exchange(loaded, owners.pop(name), world_size)
        del loaded
        order = torch.argsort(mine["node_id"])
        for key in mine:
            mine[key] = mine[key][order]
        unique = int(torch.unique_consecutive(mine["node_id"]).numel()) if len(order) else 0
        if all_sum_int(len(order) - unique):
            raise GnnflowError(f"node type '{name}': the shards hold some node ids more than once")
        counts = all_gather_int(len(order), world_size)
        offset = range_offset(counts, part.index)
        source = mine.pop("node_id")
        part.nodes[name] = {"node_id": torch.arange(offset, offset + len(source)), "source_id": source, **mine}
        part.node_counts[name] = counts
        part.directories[name] = IdDirectory(source, part.nodes[name]["node_id"], world_size)


def check_nodes(graph: LoadedGraph, metadata: GraphSchema) -> None:
    """Every worker agrees before raising: the loaded ids cover 0..count-1 (duplicates are found
    once nodes sit with their owners)."""
    for name, node in metadata.node_types.items():
        ids = graph.nodes[name]["node_id"]
        total = all_sum_int(len(ids))
        if total != node.count:
            raise GnnflowError(f"node type '{name}': graph_metadata.json says {node.count} nodes but the shards hold {total}")
        _check_range(ids, node.count, f"node type '{name}'")


def label_edge_types(metadata: GraphSchema) -> list[str]:
    """The label edge tables a partition stores beside its message edges (with their anchors)."""
    return [name for name, e in metadata.edge_types.items() if e.role != "message"]


def check_edges(graph: LoadedGraph, metadata: GraphSchema) -> None:
    for name, edge in metadata.edge_types.items():
        loaded = graph.edges[name]
        total = all_sum_int(len(loaded["edge_id"]))
        if total != edge.count:
            raise GnnflowError(f"edge type '{name}': graph_metadata.json says {edge.count} edges but the shards hold {total}")
        _check_range(loaded["edge_id"], edge.count, f"edge type '{name}'")
        _check_range(loaded["src"], metadata.node_types[edge.src_type].count, f"edge type '{name}' sources")
        _check_range(loaded["dst"], metadata.node_types[edge.dst_type].count, f"edge type '{name}' destinations")


def partition_edges(graph: LoadedGraph, metadata: GraphSchema, by: str, part: GraphPartition) -> None:
    """Renumbers, places and stores every loaded edge (taken out of ``graph`` type by type).

    A worker's edges are its largest tensors, so each column is dropped as soon as what replaces
    it exists: at most about two copies of a worker's edge columns are alive at any time."""
    for name, edge in metadata.edge_types.items():
        loaded = graph.edges.pop(name)
        columns = {
            "src": part.directories[edge.src_type].lookup(loaded.pop("src")),
            "dst": part.directories[edge.dst_type].lookup(loaded.pop("dst")),
            "source_edge_id": loaded.pop("edge_id"),
            "features": loaded.pop("features"),
            "split": loaded.pop("split"),
        }
        del loaded
        if edge.undirected and edge.src_type == edge.dst_type:
            _add_reverse_copies(columns, edge.count)
        # Label pairs live with their anchor (source), whatever the message edges do.
        message_by = by if edge.role == "message" else "src"
        if edge.undirected and edge.src_type != edge.dst_type:
            reverse = f"{edge.dst_type}__rev_{edge.relation}__{edge.src_type}"
            flipped = columns | {"src": columns["dst"], "dst": columns["src"]}
            _store_edges(name, (edge.src_type, edge.dst_type), columns, message_by, part)
            _store_edges(reverse, (edge.dst_type, edge.src_type), flipped, by, part)
        else:
            _store_edges(name, (edge.src_type, edge.dst_type), columns, message_by, part)


def _add_reverse_copies(columns: dict[str, torch.Tensor], count: int) -> None:
    """Appends the reverse of every edge (``count + i`` names the copy of edge ``i``), in place."""
    columns["src"] = torch.cat([columns["src"], columns.pop("dst")])
    half = len(columns["src"]) // 2
    columns["dst"] = torch.cat([columns["src"][half:], columns["src"][:half]])
    eid = columns["source_edge_id"]
    columns["source_edge_id"] = torch.cat([eid, eid + count])
    del eid
    for key in ("features", "split"):
        columns[key] = torch.cat([columns[key], columns[key]])


def _store_edges(name: str, ends: tuple[str, str], columns: dict[str, torch.Tensor], by: str, part: GraphPartition) -> None:
    """Sends each edge (``columns``: src, dst, source_edge_id, features, split, which it takes
    out of the dict as it goes) to the owner of its source (or destination) and renumbers it in
    the owner's edge range, in compressed order (:func:`compressed_order`: reruns are bit-identical)."""
    src_owner = range_owner(columns["src"], range_ends(part.node_counts[ends[0]]))
    dst_owner = range_owner(columns["dst"], range_ends(part.node_counts[ends[1]]))
    part.cut_edges[name] = all_sum_int(int((src_owner != dst_owner).sum()))
    owner = src_owner if by == "src" else dst_owner
    del src_owner, dst_owner
    mine = exchange(columns, owner, part.num_partitions, consume=True)
    del owner
    at = 0 if by == "src" else 1  # the end whose owner stores the edge: GLT's compressed side
    owned = part.node_counts[ends[at]]
    pairs = (mine["src"], mine["dst"])
    order, indptr = compressed_order(pairs, mine["source_edge_id"], at, range_offset(owned, part.index), owned[part.index])
    del pairs
    counts = all_gather_int(len(order), part.num_partitions)
    offset = range_offset(counts, part.index)
    part.edge_counts[name] = counts
    edge_index = torch.empty((2, len(order)), dtype=torch.int64)
    for row, end in enumerate(("src", "dst")):
        torch.index_select(mine.pop(end), 0, order, out=edge_index[row])
    part.edges[name] = {
        "edge_index": edge_index,
        "indptr": indptr,
        "edge_id": torch.arange(offset, offset + len(order)),
        "source_edge_id": mine.pop("source_edge_id")[order],
        "features": mine.pop("features")[order],
        "split": mine.pop("split")[order],
    }


def compressed_order(
    pairs: tuple[torch.Tensor, torch.Tensor], source_edge_id: torch.Tensor, at: int, first: int, owned: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(order, indptr) of a partition's edges ``pairs`` = (src (e,), dst (e,)): sorted by end
    ``at`` (ids ``first .. first + owned - 1``, this partition's), then the other end, then source
    edge id; indptr (owned + 1,) counts each owned node's edges. The order GLT's COO-to-CSR
    conversion would give them (it sorts by both ends), computed here once so no worker sorts again."""
    indptr = torch.zeros(owned + 1, dtype=torch.int64)
    if not len(source_edge_id):
        return torch.zeros(0, dtype=torch.int64), indptr
    order = torch.argsort(source_edge_id)  # ties (repeated pairs) end in source edge id order
    key = pairs[at][order].sub_(first)  # built in place: a partition's edges are its largest tensors
    torch.cumsum(torch.bincount(key, minlength=owned), 0, out=indptr[1:])
    key.mul_(int(pairs[1 - at].max()) + 1).add_(pairs[1 - at][order])  # fits int64 below ~3e9 nodes a side
    indices = torch.sort(key, stable=True).indices
    del key
    return order[indices], indptr


def partition_graph(graph: LoadedGraph, metadata: GraphSchema, rank: int, world_size: int, options: PartitionSpec) -> GraphPartition:
    """Runs on every worker inside an initialized process group; returns partition ``rank``."""
    check_nodes(graph, metadata)
    check_edges(graph, metadata)
    part = GraphPartition(rank, world_size)
    if options.method == "label_propagation" and world_size > 1:
        owners = propagated_assignment(graph, metadata, world_size, options.seed, options.refine_rounds, options.balance_slack)
    else:
        owners = hash_assignment(graph, world_size, options.seed)
    partition_nodes(graph, metadata, owners, part)
    partition_edges(graph, metadata, options.edge_assignment, part)
    return part
