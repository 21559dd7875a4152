"""Which partition each node goes to: ``hash`` or ``label_propagation``.

``hash`` spreads nodes by a seeded hash of their id: perfectly balanced, blind to edges (with P
partitions about (P-1)/P of all edges are cut). ``label_propagation`` starts from the hash and
refines it for locality with balanced label propagation (as in Spinner, Martella et al.,
ICDE 2017), run by the partition workers themselves, every worker holding only its share:

- each node's current partition lives at its *home* worker (a hash of its id), 1/P of the nodes;
- per round, every worker looks up the partitions of the endpoints of the edges it loaded and
  sends each endpoint a vote for the partition of the other end;
- each home counts its nodes' votes; a node wants the partition most of its neighbours are in;
- a partition accepts newcomers only up to its capacity ``(1 + balance_slack) * n / P``: when
  more want in, each candidate moves with probability capacity left / candidates (drawn from a
  seeded hash, so reruns are identical).

METIS would need the whole graph in one process (ParMETIS is not on the package registries), and
the streaming heuristics (LDG, Fennel) are sequential over one stream; label propagation needs
nothing but the all-to-all exchanges the partitioner already makes.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist

from components.partition.books import hash_owner
from components.partition.loading import LoadedGraph
from components.runtime.collectives import all_sum_int, exchange, request
from components.schema import GraphSchema

log = logging.getLogger("gnnflow.partition")

METHODS = ("hash", "label_propagation")
_HOME_SALT = 0x40E5


def hash_assignment(graph: LoadedGraph, world_size: int, seed: int) -> dict[str, torch.Tensor]:
    """(n,) partition of each loaded node, per type, aligned with ``graph.nodes[type]['node_id']``."""
    return {t: hash_owner(v["node_id"], world_size, seed) for t, v in graph.nodes.items()}


class _Homes:
    """The current partition of every node, held by the nodes' home workers (1/P each)."""

    def __init__(self, graph: LoadedGraph, world_size: int, seed: int) -> None:
        self.world_size = world_size
        self.ids: dict[str, torch.Tensor] = {}
        self.part: dict[str, torch.Tensor] = {}
        for name, nodes in graph.nodes.items():
            held = exchange({"id": nodes["node_id"]}, self.home(nodes["node_id"]), world_size)["id"]
            self.ids[name] = torch.sort(held).values
            self.part[name] = hash_owner(self.ids[name], world_size, seed)

    def home(self, ids: torch.Tensor) -> torch.Tensor:
        return hash_owner(ids, self.world_size, _HOME_SALT)

    def rows(self, node_type: str, ids: torch.Tensor) -> torch.Tensor:
        """Row of each held id (the ids must be held here)."""
        return torch.searchsorted(self.ids[node_type], ids)

    def lookup(self, node_type: str, ids: torch.Tensor) -> torch.Tensor:
        """(k,) current partition of ``ids`` (k,); collective."""
        return request(ids, self.home(ids), self.world_size, lambda asked: self.part[node_type][self.rows(node_type, asked)])


def _uniform(ids: torch.Tensor, seed: int, round_index: int) -> torch.Tensor:
    """(k,) float64 in [0, 1), a pure function of (id, seed, round)."""
    return hash_owner(ids, 1 << 30, seed * 7919 + round_index + 1).to(torch.float64) / (1 << 30)


def _best_partitions(
    rows: torch.Tensor, votes: torch.Tensor, current: torch.Tensor, world_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For the voted rows: (rows (u,), most-voted partition (u,), its votes minus the votes for
    the current partition (u,)). Ties go to the current partition, then the lowest index."""
    key = rows * world_size + votes
    keys, counts = torch.unique(key, return_counts=True)  # sorted by row, then partition
    row, partition = keys // world_size, keys % world_size
    stay = partition == current[row]
    # Best per row: most votes, then staying, then the lowest partition.
    score = counts * 2 * world_size + stay.to(torch.int64) * world_size + (world_size - 1 - partition)
    order = torch.argsort(row * (score.max() + 1 if len(score) else 1) + score, descending=True, stable=True)
    first = torch.ones(len(order), dtype=torch.bool)
    first[1:] = row[order][1:] != row[order][:-1]
    best = order[first]
    current_votes = torch.zeros(len(current), dtype=torch.int64)
    current_votes[row[stay]] = counts[stay]
    return row[best], partition[best], counts[best] - current_votes[row[best]]


def propagated_assignment(
    graph: LoadedGraph, metadata: GraphSchema, world_size: int, seed: int, rounds: int, balance_slack: float
) -> dict[str, torch.Tensor]:
    """(n,) partition of each loaded node, per type (as :func:`hash_assignment`), refined by
    ``rounds`` rounds of balanced label propagation; collective."""
    homes = _Homes(graph, world_size, seed)
    capacity = {t: int((1 + balance_slack) * n.count / world_size) + 1 for t, n in metadata.node_types.items()}
    for r in range(rounds):
        voters: dict[str, list[torch.Tensor]] = {t: [] for t in metadata.node_types}
        choices: dict[str, list[torch.Tensor]] = {t: [] for t in metadata.node_types}
        cut = 0
        for name, edge in metadata.message_edge_types.items():
            src, dst = graph.edges[name]["src"], graph.edges[name]["dst"]
            src_part, dst_part = homes.lookup(edge.src_type, src), homes.lookup(edge.dst_type, dst)
            cut += int((src_part != dst_part).sum())
            voters[edge.src_type].append(src)
            choices[edge.src_type].append(dst_part)
            voters[edge.dst_type].append(dst)
            choices[edge.dst_type].append(src_part)
        moved = 0
        for node_type in metadata.node_types:
            ids, votes = (
                torch.cat(voters[node_type] or [torch.zeros(0, dtype=torch.int64)]),
                torch.cat(choices[node_type] or [torch.zeros(0, dtype=torch.int64)]),
            )
            at_home = exchange({"id": ids, "vote": votes}, homes.home(ids), world_size)
            current = homes.part[node_type]
            rows, best, gain = _best_partitions(homes.rows(node_type, at_home["id"]), at_home["vote"], current, world_size)
            want = gain > 0
            rows, best = rows[want], best[want]
            demand = torch.bincount(best, minlength=world_size)
            load = torch.bincount(current, minlength=world_size)
            dist.all_reduce(demand)
            dist.all_reduce(load)
            room = (capacity[node_type] - load).clamp(min=0).to(torch.float64)
            chance = torch.where(demand > 0, (room / demand.clamp(min=1)).clamp(max=1.0), torch.zeros_like(room))
            go = _uniform(homes.ids[node_type][rows], seed, r) < chance[best]
            current[rows[go]] = best[go]
            moved += all_sum_int(int(go.sum()))
        total_edges = sum(e.count for e in metadata.message_edge_types.values())
        cut = all_sum_int(cut)
        if dist.get_rank() == 0:
            log.info(
                "label propagation round %d/%d: %.1f%% of edges cut before it, %d node(s) moved",
                r + 1,
                rounds,
                100 * cut / max(total_edges, 1),
                moved,
            )
        if moved == 0:
            break
    return {t: homes.lookup(t, v["node_id"]) for t, v in graph.nodes.items()}
