"""Node classification over the whole graph on one worker (``training.mode: full_graph``).

An epoch is one optimisation step over every labelled training node of the graph: each worker
runs the encoder over its own nodes (the layers fetch the rest block by block, see
:mod:`.aggregate`), takes the cross-entropy of its training nodes divided by the number of
training nodes on all workers, and backpropagates; the parameter gradients are then summed over
the workers (an all-reduce, as DDP does), which gives exactly the gradient of the mean loss over
the whole graph. The interface is :class:`components.gnn.node_task.NodeTask`'s, so the train
step's loop (checkpoints, early stopping, metrics) serves both modes.
"""

from __future__ import annotations

import logging
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from components.config import GnnflowConfig
from components.errors import GnnflowError
from components.gnn.epoch import FROM_THE_START, EpochStart
from components.gnn.full_graph.encoder import check_encoder, encode, reads_input_linearly, uses_gcn
from components.gnn.full_graph.graph import partition_graph
from components.gnn.full_graph.plan import remote_edge_fraction
from components.gnn.full_graph.sparse_input import SparseFeatures, sparse_features
from components.gnn.interruption import BatchAgreement
from components.gnn.metrics import all_sum, classification_metrics, confusion_matrix, label_entropy
from components.gnn.model import decoded_features
from components.gnn.node_task import EpochResult
from components.partition.output import StoredPartition
from components.runtime.collectives import all_sum_int
from components.schema import SPLIT_CODES

log = logging.getLogger("gnnflow.train")


def broadcast_parameters(model: nn.Module) -> None:
    """Rank 0's weights on every worker (they start equal from the same seed; this makes sure)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, 0)


def all_reduce_gradients(model: nn.Module) -> None:
    """Sums every parameter's gradient over the workers, in one flat all-reduce."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not dist.is_initialized() or dist.get_world_size() == 1 or not params:
        return
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
    dist.all_reduce(flat)
    at = 0
    for p in params:
        p.grad = flat[at : at + p.numel()].view_as(p).clone()
        at += p.numel()


class FullGraphNodeTask:
    """Everything full-graph node classification needs on one worker: its nodes' features,
    labels and splits, and the graph with its fetch plan (built collectively)."""

    def __init__(self, part: StoredPartition, model: nn.Module, config: GnnflowConfig, world_size: int) -> None:
        schema = part.metadata.schema
        if schema.task_type != "node_classification":
            raise GnnflowError(f"training.mode full_graph supports node_classification, not {schema.task_type}")
        check_encoder(model.encoder)
        self.target = schema.target
        self.num_classes = schema.node_types[self.target].num_classes
        nodes = part.nodes[self.target]
        x = decoded_features(model.encoder, self.target, nodes["features"])
        # Mostly-zero features (bag of words) stay sparse where the first layer maps them linearly.
        self.x = sparse_features(x) if reads_input_linearly(model.encoder) else x
        self.y = nodes["label"].reshape(-1).to(torch.int64)
        labelled = self.y >= 0
        self.index = {name: torch.nonzero((nodes["split"] == code) & labelled).reshape(-1) for name, code in SPLIT_CODES.items()}
        self.graph = partition_graph(part, world_size, gcn=uses_gcn(model.encoder), block_rows=config.training.full_graph_block_rows)
        self.train_count = all_sum_int(len(self.index["train"]))
        self.remote_fraction = remote_edge_fraction(self.graph.plan)
        plan = self.graph.plan
        log.info(
            "rank %d: full graph: %d nodes, %d edges (%.1f%% read from other workers), %d training nodes of %d%s",
            part.index,
            plan.num_rows,
            plan.edges,
            100 * plan.remote_edges / max(plan.edges, 1),
            len(self.index["train"]),
            self.train_count,
            f"; features sparse ({len(self.x.values) / max(x.numel(), 1):.1%} non-zero)" if isinstance(self.x, SparseFeatures) else "",
        )
        broadcast_parameters(model)

    def _logits(self, model: nn.Module, dropout_key: int | None = None) -> torch.Tensor:
        """(n, num_classes) logits of every node of this worker; collective."""
        return model.classify(encode(model.encoder, self.graph, self.x, dropout_key))

    @staticmethod
    def _dropout_key() -> int:
        """Rank 0's next draw from torch's generator, on every worker: dropout masks then depend on
        the seed, the epoch and node ids only (rank 0 is seeded alike with 1 or N workers)."""
        key = torch.randint(0, 1 << 62, (1,), dtype=torch.int64)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.broadcast(key, 0)
        return int(key)

    def train_epoch(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        show_progress: bool,
        agreement: BatchAgreement | None = None,
        start: EpochStart = FROM_THE_START,
    ) -> EpochResult:
        """One full-graph step. The other arguments are the sampled tasks' (one step has no bar,
        and an epoch of one step is never stopped or resumed part-way)."""
        assert agreement is None and start == FROM_THE_START, "a full-graph epoch is one step"
        model.train()
        began = time.perf_counter()
        optimizer.zero_grad()
        logits = self._logits(model, self._dropout_key())
        train = self.index["train"]
        # Summed here, divided by every worker's count: the all-reduced gradient is the global mean's.
        loss = F.cross_entropy(logits[train], self.y[train], reduction="sum") / max(self.train_count, 1)
        loss.backward()
        all_reduce_gradients(model)
        optimizer.step()
        confusion = all_sum(confusion_matrix(logits[train].detach().argmax(-1), self.y[train], self.num_classes))
        total = float(all_sum(loss.detach().reshape(1).to(torch.float64)))
        metrics, chance = classification_metrics(confusion), label_entropy(confusion.sum(1))
        return EpochResult(total, 1, time.perf_counter() - began, metrics, self.remote_fraction, chance)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str) -> dict[str, float]:
        """Accuracy and macro-F1 over every worker's labelled ``split`` nodes; collective."""
        model.eval()
        index = self.index[split]
        pred = self._logits(model)[index].argmax(-1)
        return classification_metrics(all_sum(confusion_matrix(pred, self.y[index], self.num_classes)))

    def shutdown(self) -> None:
        self.graph.plan.cache.clear()
