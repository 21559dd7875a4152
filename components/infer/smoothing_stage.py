"""``infer.smoothing: correct_and_smooth`` as a stage of the infer step, on each worker's own rows.

Inference writes each node type's shard while it computes it; the classification target's rows
are held instead (:class:`HoldingSinks`: its embeddings and class probabilities, O(own nodes x
(hidden + classes)), exact mode held them all anyway), then smoothed with Correct & Smooth
(:mod:`.smoothing`) over the edges between target nodes, on the full-graph ring (no worker
gathers the graph), and written. The training labels are those of the partitions' own ``train``
split: in an inference-only run on fresh tables, the fresh graph's labelled training nodes.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from components.config.inference import InferSpec
from components.errors import GnnflowError
from components.gnn.full_graph.graph import FullGraph, aggregation_edges, build_full_graph
from components.gnn.metrics import all_sum, classification_metrics, confusion_matrix
from components.infer.alpha_selection import NO_VALIDATION, Selection, labelled_rows, smooth_and_select
from components.infer.outputs import NodeOutputs
from components.infer.sinks import OutputSinks, RowSink
from components.infer.smoothing import ring_propagation
from components.partition.output import StoredPartition
from components.schema import NO_LABEL, SPLIT_CODES, GraphSchema

log = logging.getLogger("gnnflow.infer")


def self_edge_types(schema: GraphSchema) -> list[str]:
    """The message edge types joining the target node type to itself: what smoothing propagates over."""
    return [name for name, e in schema.message_edge_types.items() if e.src_type == e.dst_type == schema.target]


def check_smoothing(spec: InferSpec, schema: GraphSchema, where: str) -> None:
    """A GnnflowError, before any worker starts, when ``spec``'s smoothing cannot run on the graph in ``where``."""
    if spec.smoothing == "none":
        return
    if schema.task_type != "node_classification":
        raise GnnflowError(f"infer.smoothing {spec.smoothing} needs a node_classification task; {where} holds {schema.task_type}")
    if not self_edge_types(schema):
        raise GnnflowError(
            f"infer.smoothing {spec.smoothing} propagates over edges between {schema.target!r} nodes, and {where} has no such "
            f"edge type (its edge types: {sorted(schema.message_edge_types)}): set infer.smoothing to none"
        )


class HeldOutputs:
    """One node type's outputs of one worker, kept in node order (rows ``offset`` .. ``offset +
    count - 1``) until smoothing is done; every node must come exactly once."""

    def __init__(self, offset: int, count: int, where: str) -> None:
        self.offset, self.count, self.where = offset, count, where
        self.most_early_rows = 0  # nothing waits: rows land at their own position
        self.embeddings: torch.Tensor | None = None
        self.probabilities: torch.Tensor | None = None
        self._seen = torch.zeros(count, dtype=torch.bool)

    def add(self, out: NodeOutputs) -> None:
        if not len(out.node_ids):
            return
        if out.probabilities is None:
            raise ValueError(f"{self.where}: smoothing needs class probabilities")
        positions = out.node_ids.to(torch.int64) - self.offset
        if int(positions.min()) < 0 or int(positions.max()) >= self.count or len(positions.unique()) != len(positions):
            raise RuntimeError(f"{self.where}: inference did not cover each node exactly once")
        if bool(self._seen[positions].any()):
            raise RuntimeError(f"{self.where}: inference did not cover each node exactly once")
        self._seen[positions] = True
        if self.embeddings is None or self.probabilities is None:
            self.embeddings = torch.zeros((self.count, out.embeddings.shape[1]), dtype=out.embeddings.dtype)
            self.probabilities = torch.zeros((self.count, out.probabilities.shape[1]), dtype=torch.float32)
        self.embeddings[positions] = out.embeddings
        self.probabilities[positions] = out.probabilities.to(torch.float32)

    def check_complete(self) -> None:
        if not bool(self._seen.all()):
            raise RuntimeError(f"{self.where}: inference did not cover each node exactly once")


@dataclass(frozen=True)
class HoldingSinks(OutputSinks):
    """:class:`OutputSinks` that hold node type ``hold``'s outputs (see :class:`HeldOutputs`)
    instead of writing them; :func:`smooth_and_write` writes them."""

    hold: str = ""
    held: dict[str, HeldOutputs] = field(default_factory=dict)

    @contextlib.contextmanager
    def open(self, node_type: str) -> Iterator[RowSink]:
        if node_type != self.hold:
            with super().open(node_type) as sink:
                yield sink
            return
        holder = HeldOutputs(
            self.part.node_offset(node_type), len(self.originals[node_type]), f"partition {self.part.index}: {node_type!r}"
        )
        yield holder
        holder.check_complete()
        self.held[node_type] = holder


def _aggregation_edges(tensors: dict[str, torch.Tensor], own: torch.Tensor, offset: int, count: int, assignment: str) -> torch.Tensor:
    """(2, e) [neighbour partition id; local row] of one stored edge type, read whole (``edge_index``)
    or for sampling (CSR: ``indptr`` over the positions of the aggregating end, ``indices``)."""
    if "edge_index" in tensors:
        return aggregation_edges(tensors["edge_index"], own, count, assignment)
    indptr = tensors["indptr"].to(torch.int64)
    positions = torch.repeat_interleave(torch.arange(len(indptr) - 1), indptr.diff())
    row_of = torch.empty(len(own), dtype=torch.int64)
    row_of[own - offset] = torch.arange(len(own))
    return torch.stack([tensors["indices"].to(torch.int64), row_of[positions]])


def target_graph(part: StoredPartition, world_size: int, block_rows: int) -> FullGraph:
    """The ring over the edges between target nodes (every such type's, summed); collective."""
    schema = part.metadata.schema
    target = schema.target
    own = part.nodes[target]["node_id"].to(torch.int64)
    counts = part.metadata.node_counts[target]
    if len(counts) != world_size:
        raise GnnflowError(f"{len(counts)} partitions for {world_size} workers: smoothing runs one worker per partition")
    offset, total = part.node_offset(target), sum(counts)
    edges = [_aggregation_edges(part.edges[t], own, offset, total, part.metadata.edge_assignment) for t in self_edge_types(schema)]
    return build_full_graph(torch.cat(edges, dim=1), own, counts, part.index, gcn=False, block_rows=block_rows)


def split_accuracies(predicted: torch.Tensor, labels: torch.Tensor, splits: torch.Tensor, classes: int, suffix: str) -> dict[str, float]:
    """``val_accuracy<suffix>`` and ``test_accuracy<suffix>`` (and macro-F1) over every worker's labelled nodes; collective."""
    metrics: dict[str, float] = {}
    for split in ("val", "test"):
        mask = (splits == SPLIT_CODES[split]) & (labels != NO_LABEL)
        figures = classification_metrics(all_sum(confusion_matrix(predicted[mask], labels[mask], classes)))
        metrics |= {f"{split}_accuracy{suffix}": figures["accuracy"], f"{split}_macro_f1{suffix}": figures["macro_f1"]}
    return metrics


def _slowest(seconds: float) -> float:
    value = torch.tensor([seconds], dtype=torch.float64)
    if dist.is_initialized():
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value)


def smooth_and_write(sinks: HoldingSinks, spec: InferSpec, world_size: int, block_rows: int) -> dict[str, object]:
    """Smooths the held target rows (the alphas chosen as ``spec.alpha_selection`` says: :mod:`.alpha_selection`),
    writes their shard and returns the metrics of the model's own predictions (``*_base``),
    ``smoothing_seconds`` (the slowest worker's) and the choice (``smoothing_selected``,
    ``smoothing_candidates``, ``smoothing_alpha_selection``); collective."""
    part = sinks.part
    schema = part.metadata.schema
    target = schema.target
    held = sinks.held[target]
    nodes = part.nodes[target]
    order = nodes["node_id"].to(torch.int64) - held.offset  # position of each local row
    classes = schema.node_types[target].num_classes
    base = held.probabilities[order] if held.probabilities is not None else torch.zeros((0, classes))
    labels, splits = nodes["label"].reshape(-1).to(torch.int64), nodes["split"].reshape(-1).to(torch.int64)
    start = time.perf_counter()
    graph = target_graph(part, world_size, block_rows)
    selection = smooth_and_select(base, labels, splits, ring_propagation(graph), spec)  # reads train and val labels only
    smoothed = selection.probabilities
    seconds = _slowest(time.perf_counter() - start)
    graph.plan.cache.clear()
    before = split_accuracies(base.argmax(1), labels, splits, classes, "_base")
    after = split_accuracies(smoothed.argmax(1), labels, splits, classes, "")
    train_count = int(all_sum(torch.tensor([len(labelled_rows(labels, splits, "train"))]))[0])
    if part.index == 0:
        _log_choice(selection)
        log.info(
            "infer: Correct & Smooth over %d training labels: validation accuracy %.4f -> %.4f (test %.4f -> %.4f) in %.2fs",
            train_count,
            before["val_accuracy_base"],
            after["val_accuracy"],
            before["test_accuracy_base"],
            after["test_accuracy"],
            seconds,
        )
        if not train_count:
            log.warning("infer: no labelled training nodes: correct changes nothing, smooth only averages the predictions")
    if held.embeddings is not None and held.probabilities is not None:
        held.probabilities[order] = smoothed
        rows = sinks.row_group_rows
        with OutputSinks.open(sinks, target) as sink:
            for at in range(0, held.count, rows):
                ids = torch.arange(held.offset + at, held.offset + min(at + rows, held.count))
                sink.add(NodeOutputs(ids, held.embeddings[at : at + rows], held.probabilities[at : at + rows]))
    else:
        with OutputSinks.open(sinks, target):
            pass  # no rows: an empty shard
    return {**before, "smoothing_seconds": seconds, **selection.metrics()}


def _log_choice(selection: Selection) -> None:
    if selection.how == NO_VALIDATION:
        log.warning(
            "infer: no validation nodes to choose Correct & Smooth's alphas on: the configured ones, %s", _named(selection.selected)
        )
    elif selection.how == "fixed":
        log.info("infer: Correct & Smooth with the configured alphas, %s", _named(selection.selected))
    else:
        scores = ", ".join(f"{_named(pair)}: {accuracy:.4f}" for pair, accuracy in selection.candidates)
        log.info("infer: Correct & Smooth chose %s on validation (validation accuracy of each: %s)", _named(selection.selected), scores)


def _named(pair: tuple[float, float] | None) -> str:
    return "none (the model's own predictions)" if pair is None else f"correction alpha {pair[0]:g} / smoothing alpha {pair[1]:g}"
