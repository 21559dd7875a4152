"""Distributed partitioning over torch.distributed: every worker ends with partition ``rank``.

Nodes go to partitions by a seeded hash of their id, so the node partition book is a pure
function every worker computes alone; rows move to their owners with one all-to-all per
tensor. Edges follow the owner of their source (or destination) node; undirected edges are
stored in both directions (the reverse copy of edge ``i`` has id ``count + i``), as GLT's
samplers expect directed adjacency.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from components.errors import GnnflowError
from components.partition.loading import LoadedGraph
from components.schema import GraphSchema


@dataclass
class GraphPartition:
    """Partition ``index`` of ``num_partitions``, global ids throughout.

    nodes[type]: node_id (n,) sorted, features (n, d), label (n,) if labeled, split (n,) int8
    edges[type]: edge_index (2, e) [src; dst], edge_id (e,), features (e, d_e), split (e,) int8
    node_books[type]: (count,) int16, the partition of every node
    edge_books[type]: (stored edges,) int16, the partition of every stored edge; only for edge
        types with features (the only lookups by edge id across partitions)
    """

    index: int
    num_partitions: int
    nodes: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    edges: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    node_books: dict[str, torch.Tensor] = field(default_factory=dict)
    edge_books: dict[str, torch.Tensor] = field(default_factory=dict)


def node_owner(ids: torch.Tensor, num_partitions: int, seed: int) -> torch.Tensor:
    """Partition of each node id (same shape, int64): splitmix64 of (id, seed) mod partitions."""
    with np.errstate(over="ignore"):
        z = ids.numpy().astype(np.uint64) + np.uint64((seed * 0x9E3779B97F4A7C15 + 1) % 2**64)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return torch.from_numpy((z % np.uint64(num_partitions)).astype(np.int64))


def exchange(rows: Mapping[str, torch.Tensor], owner: torch.Tensor, world_size: int) -> dict[str, torch.Tensor]:
    """Sends row ``i`` of every tensor to worker ``owner[i]``; returns the rows this worker got.

    All tensors share their first dimension; received rows come grouped by sender rank.
    """
    order = torch.argsort(owner, stable=True)
    send = torch.bincount(owner, minlength=world_size)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    send_sizes, recv_sizes = send.tolist(), recv.tolist()
    out: dict[str, torch.Tensor] = {}
    for key, tensor in rows.items():
        width = int(np.prod(tensor.shape[1:], dtype=np.int64))
        flat = tensor[order].reshape(len(order), width)
        wire = flat.to(torch.int32) if flat.dtype == torch.int8 else flat  # gloo moves no int8
        received = torch.empty((sum(recv_sizes), flat.shape[1]), dtype=wire.dtype)
        dist.all_to_all_single(received, wire.contiguous(), recv_sizes, send_sizes)
        out[key] = received.to(tensor.dtype).reshape((sum(recv_sizes), *tensor.shape[1:]))
    return out


def _all_sum(value: int) -> int:
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t)
    return int(t.item())


def _check_range(ids: torch.Tensor, count: int, what: str) -> None:
    """All workers agree before raising, so nobody is left waiting in a collective."""
    bad = int(((ids < 0) | (ids >= count)).sum()) if len(ids) else 0
    if _all_sum(bad):
        raise GnnflowError(
            f"{what}: {_all_sum(bad)} id(s) outside 0..{count - 1} in the shards: graph_metadata.json disagrees with the shards"
        )


def partition_nodes(graph: LoadedGraph, metadata: GraphSchema, rank: int, world_size: int, seed: int, part: GraphPartition) -> None:
    for name, node in metadata.node_types.items():
        loaded = graph.nodes[name]
        ids = loaded["node_id"]
        total = _all_sum(len(ids))
        if total != node.count:
            raise GnnflowError(
                f"node type '{name}': graph_metadata.json says {node.count} nodes but the shards hold {total}"
            )
        _check_range(ids, node.count, f"node type '{name}'")
        book = node_owner(torch.arange(node.count), world_size, seed)
        mine = exchange(loaded, book[ids], world_size)
        order = torch.argsort(mine["node_id"])
        mine = {k: v[order] for k, v in mine.items()}
        unique = int(torch.unique_consecutive(mine["node_id"]).numel()) if len(order) else 0
        if _all_sum(len(order) - unique):
            raise GnnflowError(f"node type '{name}': the shards hold some node ids more than once")
        part.nodes[name] = mine
        part.node_books[name] = book.to(torch.int16)


def stored_edge_types(metadata: GraphSchema) -> dict[str, tuple[str, str, str]]:
    """Every edge type a partition stores, name → (src type, relation, dst type).

    The schema's types, plus ``<dst>__rev_<relation>__<src>`` for each undirected edge type
    between two different node types (its rows reversed, same edge ids): GLT samples along
    stored edges only, so without it nodes at the destination end never reach the sources.
    """
    types: dict[str, tuple[str, str, str]] = {}
    for name, edge in metadata.edge_types.items():
        types[name] = (edge.src_type, edge.relation, edge.dst_type)
        if edge.undirected and edge.src_type != edge.dst_type:
            types[f"{edge.dst_type}__rev_{edge.relation}__{edge.src_type}"] = (edge.dst_type, f"rev_{edge.relation}", edge.src_type)
    return types


def partition_edges(graph: LoadedGraph, metadata: GraphSchema, rank: int, world_size: int, by: str, part: GraphPartition) -> None:
    for name, edge in metadata.edge_types.items():
        loaded = graph.edges[name]
        total = _all_sum(len(loaded["edge_id"]))
        if total != edge.count:
            raise GnnflowError(f"edge type '{name}': graph_metadata.json says {edge.count} edges but the shards hold {total}")
        _check_range(loaded["edge_id"], edge.count, f"edge type '{name}'")
        _check_range(loaded["src"], metadata.node_types[edge.src_type].count, f"edge type '{name}' sources")
        _check_range(loaded["dst"], metadata.node_types[edge.dst_type].count, f"edge type '{name}' destinations")
        src, dst, eid = loaded["src"], loaded["dst"], loaded["edge_id"]
        rows = {"features": loaded["features"], "split": loaded["split"]}
        if edge.undirected and edge.src_type == edge.dst_type:
            src, dst = torch.cat([src, dst]), torch.cat([dst, src])
            eid = torch.cat([eid, eid + edge.count])
            rows = {k: torch.cat([v, v]) for k, v in rows.items()}
        stored = edge.count * (2 if edge.undirected and edge.src_type == edge.dst_type else 1)
        _store_edges(name, (edge.src_type, edge.dst_type), src, dst, eid, rows, stored, world_size, by, part)
        if edge.undirected and edge.src_type != edge.dst_type:
            reverse = f"{edge.dst_type}__rev_{edge.relation}__{edge.src_type}"
            _store_edges(reverse, (edge.dst_type, edge.src_type), dst, src, eid, rows, edge.count, world_size, by, part)


def _store_edges(name: str, ends: tuple[str, str], src: torch.Tensor, dst: torch.Tensor, eid: torch.Tensor,
                 rows: dict[str, torch.Tensor], stored: int, world_size: int, by: str, part: GraphPartition) -> None:
    """Sends each edge to the owner of its source (or destination) and records the edge book."""
    owner_type, owner_ids = (ends[0], src) if by == "src" else (ends[1], dst)
    owner = part.node_books[owner_type].to(torch.int64)[owner_ids]
    if rows["features"].shape[1]:
        # Only edge features are looked up by edge id across partitions: a type without them
        # needs no book, and no worker allocates O(stored edges) for it.
        book = torch.zeros(stored, dtype=torch.int32)
        book[eid] = owner.to(torch.int32)
        dist.all_reduce(book)  # each edge is loaded by exactly one worker: the sum is its owner
        part.edge_books[name] = book.to(torch.int16)
    mine = exchange({"edge_index": torch.stack([src, dst], dim=1), "edge_id": eid, **rows}, owner, world_size)
    order = torch.argsort(mine["edge_id"])
    part.edges[name] = {
        "edge_index": mine["edge_index"][order].t().contiguous(),
        "edge_id": mine["edge_id"][order],
        "features": mine["features"][order],
        "split": mine["split"][order],
    }


def partition_graph(graph: LoadedGraph, metadata: GraphSchema, rank: int, world_size: int, *, by: str = "src", seed: int = 0) -> GraphPartition:
    """Runs on every worker inside an initialized process group; returns partition ``rank``."""
    if world_size > np.iinfo(np.int16).max:
        raise GnnflowError(f"at most {np.iinfo(np.int16).max} partitions are supported, got {world_size}")
    part = GraphPartition(rank, world_size)
    partition_nodes(graph, metadata, rank, world_size, seed, part)
    partition_edges(graph, metadata, rank, world_size, by, part)
    return part
