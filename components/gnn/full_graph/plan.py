"""Which rows every worker fetches from every peer: decided once per graph, collectively.

A worker holds the edges its own nodes aggregate over, as (neighbour partition id, local row of
the aggregating node). Grouping them by the neighbour's owner (a binary search over the range
books) gives one *fetch block* per peer: the distinct rows needed from it, each fetched once
however many edges read it. One all-to-all of those row lists tells every owner which of its
rows each peer fetches (the *serve* lists). Both sides then know every block's size, so the
blocks can move later with plain point-to-point sends, in chunks of at most ``block_rows`` rows.

Schedule: at step ``s`` (0 .. P-1) worker ``p`` fetches from peer ``(p + s) % P`` and serves
peer ``(p - s) % P``; step 0 is the worker's own rows (no communication). Every step pairs each
worker with one sender and one receiver, so the ring never waits on itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from components.partition.output import range_ends, range_owner
from components.runtime.collectives import all_sum_int, exchange

DEFAULT_BLOCK_ROWS = 65_536


def chunk_bounds(count: int, block_rows: int) -> list[tuple[int, int]]:
    """[start, end) of each chunk of ``count`` rows, at most ``block_rows`` each (none for 0 rows)."""
    return [(start, min(start + block_rows, count)) for start in range(0, count, block_rows)]


@dataclass(frozen=True)
class FetchBlock:
    """The rows a worker reads from one peer (itself at step 0) and the edges reading them.

    ``rows``, ``cols``: (e,) local row of the aggregating node and index of the neighbour among
    the ``count`` fetched rows, sorted by ``cols``; ``edge_ptr``: (chunks + 1) edge range of
    each chunk of fetched rows (see :func:`chunk_bounds`).
    """

    peer: int
    count: int
    rows: torch.Tensor
    cols: torch.Tensor
    edge_ptr: list[int]


@dataclass(frozen=True)
class AggregationPlan:
    """One worker's side of the sequential aggregation schedule.

    ``fetch[s]``: the block fetched at step s; ``serve[s]``: (m,) local rows that the peer served
    at step s fetches, in the order it expects them; ``degree``: (n,) float edges each local node
    aggregates over (duplicates counted, as PyG counts them).
    """

    rank: int
    world_size: int
    num_rows: int
    block_rows: int
    fetch: list[FetchBlock]
    serve: list[torch.Tensor]
    degree: torch.Tensor
    edges: int  # edges held by this worker
    remote_edges: int  # of them, those whose neighbour lives on another worker
    cache: dict = field(default_factory=dict, repr=False, compare=False)  # sparse chunk matrices, built on first use

    def served_peer(self, step: int) -> int:
        return (self.rank - step) % self.world_size

    def serve_chunks(self, step: int) -> list[tuple[int, int]]:
        return chunk_bounds(len(self.serve[step]), self.block_rows)

    def fetch_chunks(self, step: int) -> list[tuple[int, int]]:
        return chunk_bounds(self.fetch[step].count, self.block_rows)


def build_plan(
    neighbour: torch.Tensor,
    row: torch.Tensor,
    position: torch.Tensor,
    counts: Sequence[int],
    rank: int,
    world_size: int,
    block_rows: int = DEFAULT_BLOCK_ROWS,
) -> AggregationPlan:
    """The plan for edges ``neighbour`` (e,) partition ids → ``row`` (e,) local rows; collective.

    ``position``: (n,) local row of this partition's i-th node id (its id minus the partition's
    offset); ``counts``: nodes per partition (the range books).
    """
    if len(counts) != world_size:
        raise ValueError(f"{len(counts)} partitions for {world_size} workers")
    if block_rows < 1:
        raise ValueError(f"block_rows must be positive, got {block_rows}")
    neighbour, row = neighbour.to(torch.int64), row.to(torch.int64)
    ends = range_ends(counts)
    starts = ends - torch.tensor(list(counts), dtype=torch.int64)
    owner = range_owner(neighbour, ends)
    by_peer: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
    for peer in range(world_size):
        mine = owner == peer
        needed, cols = torch.unique(neighbour[mine] - starts[peer], return_inverse=True)  # sorted: the owner reads in order
        order = torch.argsort(cols, stable=True)
        by_peer[peer] = (needed, row[mine][order], cols[order])
    # Tell every owner which of its rows this worker reads (itself included: one code path).
    wanted = torch.cat([by_peer[q][0] for q in range(world_size)])
    destination = torch.cat([torch.full((len(by_peer[q][0]),), q, dtype=torch.int64) for q in range(world_size)])
    got = exchange({"index": wanted, "asker": torch.full((len(wanted),), rank, dtype=torch.int64)}, destination, world_size)
    asked = got["index"]
    if len(asked) and (int(asked.min()) < 0 or int(asked.max()) >= len(position)):
        raise ValueError(f"partition {rank}: a peer asked for rows outside its {len(position)} nodes")
    per_asker = torch.bincount(got["asker"], minlength=world_size).tolist()
    served_by_asker = dict(zip(range(world_size), torch.split(position[asked], per_asker)))
    fetch, serve = [], []
    for step in range(world_size):
        peer = (rank + step) % world_size
        needed, rows, cols = by_peer[peer]
        bounds = chunk_bounds(len(needed), block_rows)
        edge_ptr = [0] + [int(torch.searchsorted(cols, end)) for _, end in bounds]
        fetch.append(FetchBlock(peer, len(needed), rows, cols, edge_ptr))
        serve.append(served_by_asker[(rank - step) % world_size].contiguous())
    degree = torch.bincount(row, minlength=len(position)).to(torch.float32)
    remote = int((owner != rank).sum())
    return AggregationPlan(rank, world_size, len(position), block_rows, fetch, serve, degree, len(row), remote)


def remote_edge_fraction(plan: AggregationPlan) -> float:
    """Share of all workers' edges whose neighbour is fetched from another worker; collective."""
    total = all_sum_int(plan.edges)
    return all_sum_int(plan.remote_edges) / total if total else 0.0
