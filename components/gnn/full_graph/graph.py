"""A worker's part of the graph for full-graph message passing: its nodes' aggregation edges and
the fetch plan over them.

Direction: a node aggregates over the edges its own partition holds, as the samplers do in
training. With edges assigned by source (GLT edge_dir 'out') a node v aggregates over the
destinations u of its edges v→u; by destination ('in'), over the sources u of its edges u→v.
Either way every edge a node reads is already on its worker: no edge moves at set-up, only
the lists of rows each worker will fetch. (Undirected edge types are stored in both
directions, so both assignments read the same neighbours there.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from components.errors import GnnflowError
from components.gnn.full_graph.plan import DEFAULT_BLOCK_ROWS, AggregationPlan, build_plan
from components.partition.output import StoredPartition, range_offset


def aggregation_edges(edge_index: torch.Tensor, own_ids: torch.Tensor, count: int, edge_assignment: str) -> torch.Tensor:
    """(2, e) bipartite edge index [neighbour global id; row of the aggregating node in ``own_ids``].

    ``edge_index``: (2, e) [src; dst] global ids of the edges a partition holds; the
    aggregating end is the one the partition holds edges by (see the module docstring).
    """
    src, dst = edge_index.to(torch.int64)
    aggregating, neighbour = (src, dst) if edge_assignment == "src" else (dst, src)
    # A search in the sorted own ids, not a (count,) lookup table: nothing O(whole graph) per worker.
    own_sorted, order = torch.sort(own_ids.to(torch.int64))
    at = torch.searchsorted(own_sorted, aggregating).clamp(max=max(len(own_sorted) - 1, 0))
    found = own_sorted[at] == aggregating if len(own_sorted) else torch.zeros_like(aggregating, dtype=torch.bool)
    if not found.all():
        raise GnnflowError(
            f"the partition holds {int((~found).sum())} edges whose {edge_assignment} node lives elsewhere: "
            "its partition metadata does not match its edges"
        )
    if len(neighbour) and (int(neighbour.min()) < 0 or int(neighbour.max()) >= count):
        raise GnnflowError(f"the partition holds edges to node ids outside [0, {count}): its partition metadata does not match its edges")
    return torch.stack([neighbour, order[at]])


@dataclass(frozen=True)
class FullGraph:
    """One worker's graph: the plan, (n,) partition ids of its rows, and for GCN the (n,)
    deg^-1/2 of its nodes (self-loop included). ``mask_ids``: (n,) the ids dropout masks are drawn
    by, the ones preprocess gave the nodes: partition ids depend on how many partitions there are,
    and 1 and N workers must drop the same units of the same node."""

    plan: AggregationPlan
    ids: torch.Tensor
    gcn_norm: torch.Tensor | None = None
    mask_ids: torch.Tensor | None = None

    @property
    def dropout_ids(self) -> torch.Tensor:
        return self.ids if self.mask_ids is None else self.mask_ids


def build_full_graph(
    edges: torch.Tensor,
    own_ids: torch.Tensor,
    counts: list[int],
    rank: int,
    *,
    gcn: bool = False,
    block_rows: int = DEFAULT_BLOCK_ROWS,
    mask_ids: torch.Tensor | None = None,
) -> FullGraph:
    """The graph of worker ``rank`` over ``edges`` (2, e) [neighbour partition id; local row];
    ``own_ids``: (n,) partition ids of the local rows (a permutation of the partition's range);
    ``counts``: nodes per partition. Collective: every worker calls it.

    ``gcn``: GCN's normalisation (PyG's ``gcn_norm``: self-loops replaced by exactly one per node,
    each edge j→i weighted by (deg_i deg_j)^-1/2, degrees counted with the self-loop).
    """
    offset = range_offset(counts, rank)
    n = len(own_ids)
    if n != counts[rank]:
        raise GnnflowError(f"partition {rank} holds {n} nodes, the partition books say {counts[rank]}")
    position = torch.full((n,), -1, dtype=torch.int64)
    index = own_ids.to(torch.int64) - offset
    if n and (int(index.min()) < 0 or int(index.max()) >= n):
        raise GnnflowError(f"partition {rank} holds node ids outside its range [{offset}, {offset + n})")
    position[index] = torch.arange(n)
    if (position < 0).any():
        raise GnnflowError(f"partition {rank} holds a node id twice")
    neighbour, row = edges[0].to(torch.int64), edges[1].to(torch.int64)
    if gcn:
        rest = neighbour != own_ids.to(torch.int64)[row]
        neighbour = torch.cat([neighbour[rest], own_ids.to(torch.int64)])
        row = torch.cat([row[rest], torch.arange(n)])
    plan = build_plan(neighbour, row, position, counts, rank, len(counts), block_rows)
    norm = plan.degree.pow(-0.5) if gcn else None
    return FullGraph(plan, own_ids.to(torch.int64), norm, None if mask_ids is None else mask_ids.to(torch.int64))


def partition_graph(
    part: StoredPartition, world_size: int, *, gcn: bool, block_rows: int = DEFAULT_BLOCK_ROWS, edge_keep: torch.Tensor | None = None
) -> FullGraph:
    """:func:`build_full_graph` for a homogeneous stored partition; ``edge_keep``: (e,) bool mask
    of its edges that carry messages (None: all). Collective."""
    schema = part.metadata.schema
    if schema.is_heterogeneous:
        raise GnnflowError("full-graph message passing supports homogeneous graphs (one node type, one edge type)")
    (node_type,) = schema.node_types
    (edge_type,) = schema.message_edge_types
    own = part.nodes[node_type]["node_id"]
    edge_index = part.edges[edge_type]["edge_index"]
    if edge_keep is not None:
        edge_index = edge_index[:, edge_keep]
    counts = part.metadata.node_counts[node_type]
    if len(counts) != world_size:
        raise GnnflowError(f"{len(counts)} partitions for {world_size} workers: full-graph runs one worker per partition")
    edges = aggregation_edges(edge_index, own, sum(counts), part.metadata.edge_assignment)
    source = part.nodes[node_type].get("source_id")
    return build_full_graph(edges, own, counts, part.index, gcn=gcn, block_rows=block_rows, mask_ids=source)
