"""Sampled inference: GLT's distributed neighbor loader over every node a worker owns, with the
fan-outs of training, and the encoder on each sampled mini-batch (on the worker's device; the
results come back to the host, where they are written batch by batch, see :mod:`.shard_stream`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

import torch

from components.gnn.glt_dataset import edge_type_tuple
from components.gnn.model import decoded_features
from components.gnn.sampling import SamplingSetup, node_loader
from components.infer.outputs import NodeOutputs, class_probabilities
from components.infer.restore import RestoredModel
from components.infer.sinks import OutputSinks
from components.partition.output import StoredPartition
from components.runtime import watchdog
from components.runtime.runlog import progress, rate
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
    features, ids = decoded_features(model.encoder, node_type, nodes["features"].to(device)), nodes["node_id"].to(device)
    return model.encoder({node_type: features}, {}, {node_type: ids})[node_type]


def interleaved_seeds(seeds: torch.Tensor, batch_size: int, workers: int) -> torch.Tensor:
    """``seeds`` rearranged for GLT's multiprocess producer, which hands sampling subprocess r one
    contiguous run of whole batches (``_get_worker_seeds_ranges``: the first complete-batch-count
    % workers subprocesses one more, the last one the partial batch too): here subprocess r gets
    batches r, r + workers, r + 2 workers, ... of ``seeds``. The batches then arrive in seed order
    but for the subprocesses' difference in pace (their start, the scheduler), which the shard
    stream absorbs; with GLT's runs unchanged, the later runs' rows would wait for the whole first
    run, past the stream's window on a large partition (rows then go out in arrival order)."""
    complete = len(seeds) // batch_size
    if workers <= 1 or complete <= 1:
        return seeds
    batches = torch.cat([torch.arange(r, complete, workers) for r in range(workers)])
    index = (batches[:, None] * batch_size + torch.arange(batch_size)).reshape(-1)
    return seeds[torch.cat([index, torch.arange(complete * batch_size, len(seeds))])]


def _loader_seeds(setup: SamplingSetup, own: torch.Tensor, batch_size: int) -> torch.Tensor:
    """The seeds of one node type's loader: ``own`` (interleaved for several sampling subprocesses),
    or one borrowed seed for a worker without nodes of the type (its batches are dropped)."""
    if not len(own):
        return torch.zeros(1, dtype=torch.int64)
    if setup.training.sampling == "multiprocess":
        return interleaved_seeds(own, batch_size, setup.sampling_workers)
    return own


@torch.no_grad()
def sampled_outputs(
    setup: SamplingSetup, dataset, part: StoredPartition, model: RestoredModel, batch_size: int, sinks: OutputSinks
) -> dict[str, int]:
    """Embeds every node of ``part`` (and gives the class probabilities of the target type), one
    batch at a time into ``sinks`` (which write them as they come); returns the nodes embedded, by type.

    Every worker creates one loader per node type with edges to sample, in the same order, own
    nodes or not: GLT registers each loader's RPC callees collectively, so a worker that skipped
    one would leave its peers waiting. A worker without nodes of a type samples one borrowed seed
    and drops it. Types without such edges need no loader (see ``_without_neighbours``).
    Link prediction's embeddings go out in the decoder's space (``embed``: row by row).
    """
    schema = part.metadata.schema
    hetero, module = schema.is_heterogeneous, model.module
    classify = model.task_type == "node_classification"
    link = model.task_type == "link_prediction"
    counts: dict[str, int] = {}
    sampled = sampling_types(stored_edge_types(schema), setup.edge_dir)
    for node_type in schema.node_types:
        own = part.nodes[node_type]["node_id"]
        with_probabilities = classify and node_type == schema.target
        if node_type not in sampled:
            embeddings = _without_neighbours(module, part, node_type, setup.placement.device)
            probabilities = class_probabilities(module, embeddings) if with_probabilities else None
            embeddings = module.embed(embeddings) if link else embeddings
            with sinks.open(node_type) as sink:
                sink.add(NodeOutputs(own.clone(), *setup.placement.to_host((embeddings, probabilities))))
            counts[node_type] = len(own)
            log.info(
                "rank %d: %s: %d nodes embedded from their own features (no edges to sample in direction %r)",
                setup.ctx.rank,
                node_type,
                len(own),
                setup.edge_dir,
            )
            continue
        seeds = _loader_seeds(setup, own, batch_size)
        loader = node_loader(setup, dataset, (node_type, seeds) if hetero else seeds, batch_size=batch_size, shuffle=False)
        start = time.perf_counter()
        # Rank 0's share stands for every worker's (they hold equal shares): one bar, not one per worker.
        bar = progress(f"infer {node_type} (rank 0's nodes)", unit="nodes", total=len(own)) if setup.ctx.rank == 0 else None
        with sinks.open(node_type) as sink:
            for batch in watchdog.batches(loader, working="evaluating"):
                ids, embeddings = _embed_batch(module, batch, node_type)
                probabilities = class_probabilities(module, embeddings) if with_probabilities else None
                embeddings = module.embed(embeddings) if link else embeddings
                if len(own):
                    sink.add(NodeOutputs(*setup.placement.to_host((ids.clone(), embeddings, probabilities))))
                if bar is not None:
                    bar.update(min(len(ids), max(len(own) - bar.n, 0)))
            loader.shutdown()
        if bar is not None:
            bar.close()
        seconds = time.perf_counter() - start
        counts[node_type] = len(own)
        log.info(
            "rank %d: %s: %d nodes embedded by sampling and written in %.1fs (%s); at most %d rows waited for an earlier batch",
            setup.ctx.rank,
            node_type,
            len(own),
            seconds,
            rate(len(own), seconds),
            sink.most_early_rows,
        )
    return counts
