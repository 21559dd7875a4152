"""What a sampled train worker needs, predicted from the graph's size before the step runs.

Its memory is the loaded partition's (:mod:`components.gnn.worker_sizing`, shared with infer);
this module adds the epoch's time and the model's disk. The epoch's constants are measured on
this stack; rerun ``benchmarks/plan_validation.py`` and refit them when sampling changes.
"""

from __future__ import annotations

import math

from components.config import GnnflowConfig
from components.gnn.shared_memory import whole_table_types
from components.gnn.worker_sizing import loading_peak, worker_shape
from components.graph_size import GraphSize, MiB, StepPrediction, share

# Epoch time: sampled nodes (seeds and their sampled neighbours) a trainer gets through per core
# and second, from the scale probe's epochs (fan-outs [10, 5], 74 features, hidden 64, 5% of the
# nodes as seeds; RESULTS.md "Scale probe" sections): 4M and 8M nodes at 2 and 4 workers on 2 cores
# without feature copies (11.6, 12.0, 15.0, 19.9 s: 0.51-0.81 M/s per core), and with whole feature
# tables (no feature RPC) 1.3x faster (4M, 2 workers: 8.0 against 11.6 s; 1M: 1.4 s). Peers here
# are processes on one machine: across machines each remote row is a network round trip.
SAMPLED_NODES_PER_CORE_S = 650_000.0
WHOLE_TABLES_SPEEDUP = 1.35
# How compute grows with a worker's cores (RESULTS.md, "Thread policy": 15 threads gave 6.15x one).
THREAD_SCALING_EXPONENT = 0.67


def sampled_per_seed(fan_outs: list[int], average_degree: float) -> float:
    """Nodes a seed brings into a batch: itself and each hop's draws (at most the degree)."""
    total = frontier = 1.0
    for fan_out in fan_outs:
        frontier *= min(fan_out, max(average_degree, 1.0))
        total += frontier
    return total


def epoch_seconds(graph: GraphSize, world_size: int, config: GnnflowConfig, cores_per_worker: float) -> float:
    """One epoch over the training seeds, split evenly over the workers."""
    fan_outs = config.training.fan_outs
    hops = fan_outs if isinstance(fan_outs, list) else max(fan_outs.values(), key=lambda f: math.prod(f))
    degree = graph.directed_message_edges() / max(graph.total_nodes, 1)
    work = share(graph.train_seeds, world_size) * sampled_per_seed(hops, degree)
    speed = cores_per_worker**THREAD_SCALING_EXPONENT if cores_per_worker >= 1 else cores_per_worker
    shape = worker_shape(graph, world_size)
    if whole_table_types(shape, world_size - 1, config.training.feature_cache_ratio):
        speed *= WHOLE_TABLES_SPEEDUP
    return work / (SAMPLED_NODES_PER_CORE_S * speed)


def predict(graph: GraphSize, world_size: int, config: GnnflowConfig, cores_per_worker: float = 1.0) -> StepPrediction:
    """The train step (sampled training) at ``world_size`` workers with ``cores_per_worker`` cores each."""
    peak, shm, parts = loading_peak(graph, world_size, config, "train")
    epoch = epoch_seconds(graph, world_size, config, cores_per_worker)
    return StepPrediction("train", world_size, peak, shm, model_bytes(graph, config) / MiB, epoch, parts)


def model_bytes(graph: GraphSize, config: GnnflowConfig) -> float:
    """The published model and its last checkpoint: weights and Adam's two moments (float32), and
    learnt embedding rows with one optimizer state each. An estimate from the layer shapes."""
    hidden, layers = config.model.hidden_channels, config.model.num_layers
    widest = max((n.feature_width for n in graph.nodes), default=0) or hidden
    relations = max(1, len(graph.stored_edges()))
    weights = (widest * hidden + (layers - 1) * hidden * hidden) * 2 * relations + hidden * 64
    learnt = sum(n.rows for n in graph.nodes if not n.feature_width) * hidden * 2
    return 4.0 * (3 * weights + learnt) * 2  # the model and the checkpoint beside it
