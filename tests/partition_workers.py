"""Worker functions for partition tests: importable, so the launcher can spawn them."""

from __future__ import annotations

import torch

from components import storage
from components.gnn.glt_dataset import to_dist_dataset
from components.partition.output import read_partition
from components.runtime.launcher import WorkerContext


def sample_and_check(
    ctx: WorkerContext, partitions_uri: str, features: torch.Tensor, labels: torch.Tensor, source_of: torch.Tensor
) -> dict[str, int]:
    """Samples with GLT's distributed neighbor loader over the stored partitions and counts
    sampled nodes whose features or labels differ from the originals (``features`` and
    ``labels`` indexed by source id; ``source_of`` maps partition ids to source ids)."""
    import graphlearn_torch as glt

    part = read_partition(storage.open_published(partitions_uri), ctx.rank)
    dataset = to_dist_dataset(part)
    glt.distributed.init_worker_group(world_size=ctx.world_size, rank=ctx.rank, group_name="partition-test")
    ctx.init_rpc(num_rpc_threads=4)
    (node_type,) = part.nodes
    seeds = part.nodes[node_type]["node_id"][:256]
    loader = glt.distributed.DistNeighborLoader(
        dataset,
        [5, 5],
        seeds,
        batch_size=64,
        shuffle=False,
        collect_features=True,
        edge_dir="out" if part.metadata.edge_assignment == "src" else "in",
        worker_options=glt.distributed.CollocatedDistSamplingWorkerOptions(master_addr=ctx.master_addr, master_port=ctx.rpc_port),
    )
    counts = {"batches": 0, "sampled": 0, "remote": 0, "feature_mismatch": 0, "label_mismatch": 0, "seeds": 0}
    ends = torch.cumsum(torch.tensor(part.metadata.node_counts[node_type]), 0)
    for batch in loader:
        ids = batch.node
        counts["batches"] += 1
        counts["sampled"] += len(ids)
        counts["seeds"] += int(batch.batch_size)
        counts["remote"] += int((torch.searchsorted(ends, ids, right=True) != ctx.rank).sum())
        counts["feature_mismatch"] += int((batch.x != features[source_of[ids]]).any(dim=1).sum())
        counts["label_mismatch"] += int((batch.y.reshape(-1) != labels[source_of[ids]]).sum())
    loader.shutdown()
    glt.distributed.barrier()
    glt.distributed.shutdown_rpc()
    return counts
