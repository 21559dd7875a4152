"""Learnt embeddings of featureless node types, sharded by partition.

Each worker holds the embedding rows of its own partition's nodes of a featureless type
(``(n_local, hidden)``, O(N/P) memory) and serves them to the samplers as that type's node
features: rows of remote nodes arrive with the subgraph over GLT's feature RPC, exactly as
features do. The trainer turns a batch's rows into leaves that require gradients, and after the
backward pass sends each row's gradient to the row's owner over GLT's RPC, where a sparse
optimizer (:mod:`.sparse_optimizers`) updates those rows in place (the samplers read the same
shared-memory tensor). Dense parameters stay under DDP; the table is never all-reduced.

What a sampled batch reads of a row may be a few steps old (batches are sampled ahead, and peers
update rows between their own steps): the asynchronous-embedding scheme of DGL and GraphStorm.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

from components.config import GnnflowConfig
from components.gnn.sparse_optimizers import DEFAULT_LEARNING_RATE, SparseRowOptimizer, sparse_optimizer
from components.partition.output import StoredPartition, range_ends, range_owner

# Published and checkpointed shards: one file per node type and partition.
SHARD_DIR = "learnt_embeddings"


def shard_path(node_type: str, rank: int) -> str:
    return f"{SHARD_DIR}/{node_type}/shard-{rank:05d}.pt"


def learnt_types(part: StoredPartition) -> list[str]:
    """The node types without features: each gets a learnt embedding."""
    return [t for t, n in part.metadata.schema.node_types.items() if not n.feature_dim]


def uses_sharded_embeddings(config: GnnflowConfig) -> bool:
    """Whether featureless types' embeddings are sharded (full-graph training and exact inference
    need node features, so they never meet a learnt type)."""
    return config.model.learnt_embeddings == "sharded"


@dataclass(frozen=True)
class Leaf:
    """A batch's rows of one learnt type, as a tensor that collects their gradients."""

    node_type: str
    node_ids: torch.Tensor  # (n,) global ids of the batch's nodes of the type
    rows: torch.Tensor  # (n, hidden), requires grad


class EmbeddingShards:
    """This worker's rows of every learnt type, their optimizer, and the exchange of gradients.

    Args:
        tables: node type → (n_local, hidden) float32 rows of this partition's nodes, in id order.
        ends: node type → (P,) exclusive end id of each partition's range (the range books).
        rank, world_size: this worker and the number of partitions (one per worker).
        make_optimizer: a sparse optimizer for a table.
    """

    def __init__(
        self,
        tables: dict[str, torch.Tensor],
        ends: dict[str, torch.Tensor],
        rank: int,
        world_size: int,
        make_optimizer: Callable[[torch.Tensor], SparseRowOptimizer],
    ) -> None:
        self.tables = {t: v.share_memory_() for t, v in tables.items()}  # the samplers' subprocesses read them in place
        self.ends, self.rank, self.world_size = ends, rank, world_size
        self.offsets = {t: int(e[rank - 1]) if rank else 0 for t, e in ends.items()}
        self.optimizers = {t: make_optimizer(v) for t, v in self.tables.items()}
        self._lock = threading.Lock()  # RPC threads and the trainer update the same rows
        self._callee_id: int | None = None
        self.bytes_sent = 0  # gradients (ids and rows) sent to other workers
        self.bytes_fetched = 0  # rows of other workers' nodes that training batches carried

    @classmethod
    def initial(cls, part: StoredPartition, config: GnnflowConfig, world_size: int) -> EmbeddingShards:
        """N(0, 1) rows (as ``nn.Embedding`` starts), seeded by ``training.seed``, type and partition."""
        counts, hidden = part.metadata.node_counts, config.model.hidden_channels
        tables, ends = {}, {}
        for index, node_type in enumerate(learnt_types(part)):
            ends[node_type] = range_ends(counts[node_type]).to(torch.int64)
            generator = torch.Generator().manual_seed(config.training.seed * 7919 + index * 104729 + part.index)
            tables[node_type] = torch.randn(len(part.nodes[node_type]["node_id"]), hidden, generator=generator)
        training = config.training
        lr = training.embedding_learning_rate or DEFAULT_LEARNING_RATE.get(training.embedding_optimizer, training.learning_rate)
        return cls(tables, ends, part.index, world_size, lambda table: sparse_optimizer(training.embedding_optimizer, table, lr))

    def install(self, part: StoredPartition) -> None:
        """Makes each learnt type's rows its features in ``part`` (what the GLT dataset serves)."""
        for node_type, table in self.tables.items():
            part.nodes[node_type]["features"] = table

    def register(self) -> None:
        """Registers the owner side of the exchange with GLT's RPC; collective, after ``init_rpc``,
        in the same order on every worker."""
        import graphlearn_torch as glt

        self._callee_id = glt.distributed.rpc_register(_ApplyGradients(self))

    # -- the trainer's side ---------------------------------------------------------------

    def attach(self, batch) -> list[Leaf]:
        """Makes the batch's rows of every learnt type leaves that collect gradients."""
        leaves = []
        stores = [(t, batch[t]) for t in batch.node_types] if hasattr(batch, "node_types") else [(next(iter(self.tables)), batch)]
        for node_type, store in stores:
            if node_type in self.tables and "x" in store:
                store.x = store.x.detach().to(torch.float32).requires_grad_(True)
                remote = range_owner(store.node.cpu(), self.ends[node_type]) != self.rank
                self.bytes_fetched += int(remote.sum()) * store.x.shape[1] * store.x.element_size()
                leaves.append(Leaf(node_type, store.node, store.x))
        return leaves

    def push(self, leaves: list[Leaf]) -> None:
        """Sends each leaf's row gradients to their owners (averaged over workers, as DDP averages
        dense ones) and waits until every owner has applied them."""
        import graphlearn_torch as glt

        futures = []
        names = glt.distributed.rpc.get_rpc_current_group_worker_names() if self.world_size > 1 else []
        for leaf in leaves:
            if leaf.rows.grad is None:
                continue
            grads = leaf.rows.grad.detach().to("cpu") / self.world_size
            ids = leaf.node_ids.to("cpu")
            owners = range_owner(ids, self.ends[leaf.node_type])
            for owner in owners.unique().tolist():
                mask = owners == owner
                if owner == self.rank:
                    self.apply(leaf.node_type, ids[mask], grads[mask])
                    continue
                sent_ids, sent_grads = ids[mask], grads[mask]
                self.bytes_sent += sent_ids.numel() * sent_ids.element_size() + sent_grads.numel() * sent_grads.element_size()
                futures.append(
                    glt.distributed.rpc_request_async(names[owner], self._callee_id, args=(leaf.node_type, sent_ids, sent_grads))
                )
        torch.futures.wait_all(futures)

    # -- the owner's side -----------------------------------------------------------------

    def apply(self, node_type: str, ids: torch.Tensor, grads: torch.Tensor) -> None:
        """One sparse optimizer step on this worker's rows ``ids`` (global ids, repeats summed)."""
        rows, inverse = (ids - self.offsets[node_type]).unique(return_inverse=True)
        summed = torch.zeros(len(rows), grads.shape[1], dtype=grads.dtype).index_add_(0, inverse, grads)
        with self._lock:
            self.optimizers[node_type].step(rows, summed)

    # -- checkpoints and publishing ---------------------------------------------------------

    def state_dict(self) -> dict:
        """A copy of the rows and optimizer states (taken under the lock: no update half-applied)."""
        with self._lock:
            return {
                "offsets": dict(self.offsets),
                "tables": {t: v.clone() for t, v in self.tables.items()},
                "optimizers": {t: o.state_dict() for t, o in self.optimizers.items()},
            }

    def tables_copy(self) -> dict[str, torch.Tensor]:
        with self._lock:
            return {t: v.clone() for t, v in self.tables.items()}

    def load_tables(self, tables: dict[str, torch.Tensor], where: str) -> None:
        """Copies saved rows into the shared tables in place (the samplers keep reading them)."""
        for node_type, table in self.tables.items():
            saved = tables.get(node_type)
            if saved is None or saved.shape != table.shape:
                shape = None if saved is None else tuple(saved.shape)
                raise ValueError(f"{where}: no rows of shape {tuple(table.shape)} for node type {node_type!r} (found {shape})")
            with self._lock:
                table.copy_(saved)

    def load_state_dict(self, state: dict, where: str) -> None:
        if state.get("offsets") != self.offsets:
            raise ValueError(f"{where} holds the rows of id ranges {state.get('offsets')}, this worker owns {self.offsets}")
        self.load_tables(state["tables"], where)
        for node_type, optimizer in self.optimizers.items():
            optimizer.load_state_dict(state["optimizers"][node_type])

    def nbytes(self) -> int:
        """Bytes of this worker's rows and optimizer state."""
        tables = sum(v.numel() * v.element_size() for v in self.tables.values())
        return tables + sum(o.nbytes() for o in self.optimizers.values())


class _ApplyGradients:
    """GLT RPC callee: a peer's gradients for rows this worker owns."""

    def __init__(self, shards: EmbeddingShards) -> None:
        self.shards = shards

    def call(self, node_type: str, ids: torch.Tensor, grads: torch.Tensor) -> None:
        self.shards.apply(node_type, ids, grads)
