"""Worker functions for the learnt-embedding tests: importable, so the launcher can spawn them."""

from __future__ import annotations

import numpy as np

from components import storage
from components.partition.output import read_partition
from components.runtime.launcher import WorkerContext
from tests.small_graphs import with_updates


def served_after_owner_updates(ctx: WorkerContext, partitions_uri: str, raw: dict, node_type: str, frozen: bool) -> dict:
    """Trains the learnt rows once over this worker's ``node_type`` seeds the way the trainer does
    (attach, backward, push to the owners), then samples the same seeds again and returns what
    the samplers served: every batch's global ids and rows of each learnt type (numpy), with this
    worker's table before and after and its first id per type. ``frozen``: the tables' optimizers
    step with a learning rate of 0 (a model that never updates its table)."""
    import graphlearn_torch as glt
    import torch.distributed as dist

    from components.gnn.glt_dataset import to_dist_dataset
    from components.gnn.learnt_embeddings import EmbeddingShards
    from components.gnn.sampling import RPC_THREADS, SamplingSetup, node_loader

    ctx.init_process_group()
    config = with_updates(raw)
    part = read_partition(storage.open_published(partitions_uri), ctx.rank)
    shards = EmbeddingShards.initial(part, config, ctx.world_size)
    if frozen:
        for optimizer in shards.optimizers.values():
            optimizer.lr = 0.0
    initial = {t: v.numpy().copy() for t, v in shards.tables_copy().items()}
    shards.install(part)
    dataset = to_dist_dataset(part)
    glt.distributed.init_worker_group(world_size=ctx.world_size, rank=ctx.rank, group_name="embedding-test")
    ctx.init_rpc(num_rpc_threads=RPC_THREADS)
    shards.register()
    edge_dir = "out" if part.metadata.edge_assignment == "src" else "in"
    setup = SamplingSetup.of(ctx, config, part.metadata.schema, edge_dir)
    seeds = (node_type, part.nodes[node_type]["node_id"])

    def loader():
        return node_loader(setup, dataset, seeds, batch_size=64, shuffle=False)

    training = loader()
    for batch in training:
        leaves = shards.attach(batch)
        sum(leaf.rows.sum() for leaf in leaves).backward()  # every row a batch read gets a gradient of ones
        shards.push(leaves)
    dist.barrier()  # every owner has applied every peer's gradients
    training.shutdown()
    served: list[tuple[str, np.ndarray, np.ndarray]] = []
    sampling = loader()
    for batch in sampling:
        for t in shards.tables:
            if t in batch.node_types and "x" in batch[t]:
                served.append((t, batch[t].node.numpy().copy(), batch[t].x.detach().numpy().copy()))
    dist.barrier()  # the peer may still ask this worker's samplers for rows
    sampling.shutdown()
    now = {t: v.numpy().copy() for t, v in shards.tables_copy().items()}
    return {"served": served, "initial": initial, "now": now, "offsets": dict(shards.offsets)}
