"""Sampled inference: GLT's distributed neighbor loader over every node a worker owns, with the
fan-outs of training, and the encoder on each sampled mini-batch (on the worker's device; the
results come back to the host, where they are written)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

import torch

from components.gnn.glt_dataset import edge_type_tuple
from components.gnn.sampling import SamplingSetup, node_loader
from components.infer.outputs import NodeOutputs, class_probabilities, concat_outputs
from components.infer.restore import RestoredModel
from components.partition.output import StoredPartition
from components.runtime import watchdog
from components.runtime.runlog import rate
from components.schema import stored_edge_types

log = logging.getLogger("gnnflow.infer")


def _embed_batch(model: torch.nn.Module, batch, node_type: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(global ids (b,), embeddings (b, hidden)) of the seeds of one GLT batch (every type is
    encoded; a classifier's forward would keep only its target type)."""
    seeds = batch[node_type] if hasattr(batch, "node_types") else batch
    size = int(seeds.batch_size)
    return seeds.node[:size], model.encoder.encode_batch(batch)[node_type][:size]


def sampling_types(stored_edge_types: Iterable[str], edge_dir: str) -> set[str]:
    """Node types that have edges to sample from, given the edge types the partitions store
    (``src__relation__dst``): their sources when sampling out-edges, destinations for in-edges."""
    ends = [edge_type_tuple(name) for name in stored_edge_types]
    return {src if edge_dir == "out" else dst for src, _, dst in ends}


def _without_neighbours(model: torch.nn.Module, part: StoredPartition, node_type: str, device: torch.device) -> torch.Tensor:
    """(n, hidden) embeddings, on ``device``, of this partition's nodes of a type no edge reaches: the
    encoder on their own features (or learnt embeddings), as on a subgraph of seeds only (which GLT cannot batch)."""
    nodes = part.nodes[node_type]
    features, ids = nodes["features"].to(device=device, dtype=torch.float32), nodes["node_id"].to(device)
    return model.encoder({node_type: features}, {}, {node_type: ids})[node_type]


@torch.no_grad()
def sampled_outputs(setup: SamplingSetup, dataset, part: StoredPartition, model: RestoredModel, batch_size: int) -> dict[str, NodeOutputs]:
    """Embeddings (and class probabilities of the target type) of every node of ``part``, by type.

    Every worker creates one loader per node type with edges to sample, in the same order, own
    nodes or not: GLT registers each loader's RPC callees collectively, so a worker that skipped
    one would leave its peers waiting. A worker without nodes of a type samples one borrowed seed
    and drops it. Types without such edges need no loader (see ``_without_neighbours``).
    """
    schema = part.metadata.schema
    hetero, module = schema.is_heterogeneous, model.module
    classify = model.task_type == "node_classification"
    num_classes = schema.node_types[schema.target].num_classes if classify else 0
    results: dict[str, NodeOutputs] = {}
    sampled = sampling_types(stored_edge_types(schema), setup.edge_dir)
    for node_type in schema.node_types:
        own = part.nodes[node_type]["node_id"]
        with_probabilities = classify and node_type == schema.target
        if node_type not in sampled:
            embeddings = _without_neighbours(module, part, node_type, setup.placement.device)
            probabilities = class_probabilities(module, embeddings) if with_probabilities else None
            results[node_type] = NodeOutputs(own.clone(), *setup.placement.to_host((embeddings, probabilities)))
            log.info(
                "rank %d: %s: %d nodes embedded from their own features (no edges to sample in direction %r)",
                setup.ctx.rank,
                node_type,
                len(own),
                setup.edge_dir,
            )
            continue
        seeds = own if len(own) else torch.zeros(1, dtype=torch.int64)
        loader = node_loader(setup, dataset, (node_type, seeds) if hetero else seeds, batch_size=batch_size, shuffle=False)
        start, pieces = time.perf_counter(), []
        for batch in watchdog.batches(loader, working="evaluating"):
            ids, embeddings = _embed_batch(module, batch, node_type)
            probabilities = class_probabilities(module, embeddings) if with_probabilities else None
            pieces.append(NodeOutputs(*setup.placement.to_host((ids.clone(), embeddings, probabilities))))
        loader.shutdown()
        out = concat_outputs(pieces if len(own) else [], model.spec.hidden_channels, with_probabilities, num_classes)
        seconds = time.perf_counter() - start
        log.info(
            "rank %d: %s: %d nodes embedded by sampling in %.1fs (%s)",
            setup.ctx.rank,
            node_type,
            len(out.node_ids),
            seconds,
            rate(len(out.node_ids), seconds),
        )
        results[node_type] = out
    return results
