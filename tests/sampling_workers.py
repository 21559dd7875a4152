"""Worker functions for sampling tests: importable, so the launcher can spawn them."""

from __future__ import annotations

import torch

from components import storage
from components.config import TrainingSpec
from components.gnn.glt_dataset import to_dist_dataset
from components.partition.output import read_partition
from components.runtime.launcher import WorkerContext


def draw_epochs(ctx: WorkerContext, partitions_uri: str, fan_outs: list[int], batch_size: int, runs: list[tuple[str, bool]]) -> dict:
    """One epoch of the train step's node loader over this worker's labelled nodes for each
    ``(training.sampling, training.replace)`` of ``runs``; returns every batch's global node ids,
    edge_index (local positions, messages into the seeds), seed count and first-hop node count
    per run (numpy arrays), with every node's out-degree (over all partitions) and the partitions'
    id ranges."""
    import graphlearn_torch as glt
    import torch.distributed as dist

    from components.gnn.sampling import RPC_THREADS, SamplingSetup, node_loader

    ctx.init_process_group()
    published = storage.open_published(partitions_uri)
    part = read_partition(published, ctx.rank)
    (node_type,) = part.nodes
    (edge_type,) = part.edges
    assert part.metadata.edge_assignment == "src"  # out-edges are sampled: a node's degree is its stored out-edges
    total = sum(part.metadata.node_counts[node_type])
    sources = torch.cat([read_partition(published, i).edges[edge_type]["edge_index"][0] for i in range(ctx.world_size)])
    seeds = part.nodes[node_type]["node_id"][part.nodes[node_type]["split"] == 0]
    dataset = to_dist_dataset(part)
    glt.distributed.init_worker_group(world_size=ctx.world_size, rank=ctx.rank, group_name="sampling-test")
    ctx.init_rpc(num_rpc_threads=RPC_THREADS)
    # numpy, not tensors: the launcher's pipe would pass tensors as shared memory that a worker
    # which has returned no longer serves.
    result: dict = {
        "degree": torch.bincount(sources, minlength=total).numpy(),
        "ends": torch.cumsum(torch.tensor(part.metadata.node_counts[node_type]), 0).numpy(),
        "runs": {},
    }
    for sampling, replace in runs:
        training = TrainingSpec(fan_outs=fan_outs, batch_size=batch_size, replace=replace, sampling=sampling, seed=7)
        torch.manual_seed(0)  # the collocated loader's shuffle
        loader = node_loader(SamplingSetup(ctx, training, "out", fan_outs), dataset, seeds, batch_size=batch_size, shuffle=True)
        result["runs"][(sampling, replace)] = [
            {
                "node": batch.node.numpy().copy(),
                "edge_index": batch.edge_index.numpy().copy(),
                "batch_size": int(batch.batch_size),
                "hop_one": int(batch.num_sampled_nodes[1]),
                "nodes_per_hop": [int(n) for n in batch.num_sampled_nodes],
                "edges_per_hop": [int(e) for e in batch.num_sampled_edges],
            }
            for batch in loader
        ]
        dist.barrier()  # the peer may still ask this worker's samplers for neighbours
        loader.shutdown()
    glt.distributed.barrier()
    glt.distributed.shutdown_rpc()
    return result


def feature_batches(ctx: WorkerContext, partitions_uri: str, ratios: list[float], batch_size: int) -> dict:
    """One epoch of the node loader per ``training.feature_cache_ratio`` of ``ratios`` (same
    seeds, same draw); returns each run's whole tables' row counts and every batch's global node
    ids, feature rows and labels, with the true rows of every node (all partitions, id order)."""
    import graphlearn_torch as glt
    import torch.distributed as dist

    from components.gnn.feature_cache import fetch_whole_tables
    from components.gnn.sampling import RPC_THREADS, SamplingSetup, node_loader

    ctx.init_process_group()
    published = storage.open_published(partitions_uri)
    part = read_partition(published, ctx.rank)
    (node_type,) = part.nodes
    every = [read_partition(published, i).nodes[node_type] for i in range(ctx.world_size)]
    seeds = part.nodes[node_type]["node_id"][part.nodes[node_type]["split"] == 0]
    glt.distributed.init_worker_group(world_size=ctx.world_size, rank=ctx.rank, group_name="cache-test")
    ctx.init_rpc(num_rpc_threads=RPC_THREADS)
    result: dict = {
        "features": torch.cat([p["features"] for p in every]).numpy(),
        "labels": torch.cat([p["label"] for p in every]).numpy(),
        "own": (part.node_offset(node_type), part.node_offset(node_type) + len(part.nodes[node_type]["node_id"])),
        "runs": {},
    }
    training = TrainingSpec(fan_outs=[4, 3], batch_size=batch_size, seed=7)
    for ratio in ratios:
        whole = fetch_whole_tables(part, ratio, ctx.rank, ctx.world_size, ctx.local_world_size)
        dataset = to_dist_dataset(part, whole=whole)
        torch.manual_seed(0)  # the loader's shuffle
        loader = node_loader(SamplingSetup(ctx, training, "out", [4, 3]), dataset, seeds, batch_size=batch_size, shuffle=True)
        result["runs"][ratio] = {
            "whole": {t: len(w.features) for t, w in whole.items()},
            "book": type(dataset.node_feat_pb).__name__,
            "batches": [(b.node.numpy().copy(), b.x.numpy().copy(), b.y.view(-1).numpy().copy()) for b in loader],
        }
        dist.barrier()
        loader.shutdown()
    glt.distributed.barrier()
    glt.distributed.shutdown_rpc()
    return result
