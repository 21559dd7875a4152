"""How many distinct neighbours a GLT mini-batch holds, against PyG's NeighborLoader on the same seeds.

One batch of --batch-size training seeds from the train step's own GLT loader (1 worker, the
project's partitions of the synthetic ogbn-arxiv-sized graph of `benchmarks/synthetic_graph.py`),
and one PyG `NeighborLoader` batch over the same seeds and fan-outs on the whole graph. Both are
checked against the graph (every edge real, features and labels equal the originals, messages
flowing into the seeds) and counted: edges, distinct edges, edges into the seeds and the distinct
first-hop neighbours they come from. A sampler that draws neighbours with replacement shows fewer
distinct neighbours than draws.

    python benchmarks/sampled_neighbours.py [--nodes 169343] [--edges 1166243] [--batch-size 64]
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _counts(edge_index, seeds: int) -> dict[str, float]:
    import torch

    into_seeds = edge_index[1] < seeds  # local ids: the seeds come first in both loaders
    width = int(edge_index.max()) + 1
    return {
        "edges": edge_index.shape[1],
        "distinct edges": int(torch.unique(edge_index[0] * width + edge_index[1]).numel()),
        "edges into the seeds": int(into_seeds.sum()),
        "distinct first-hop neighbours": int(torch.unique(edge_index[0][into_seeds]).numel()),
    }


def compare_worker(ctx, partitions_uri: str, config, graph_path: str) -> dict:
    import graphlearn_torch as glt
    import torch
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader

    from components import storage
    from components.partition.dataset import node_splits, to_dist_dataset
    from components.partition.step import STEP
    from components.partition.store import read_partition
    from components.gnn.node_task import NodeTask
    from components.gnn.sampling import RPC_THREADS, SamplingSetup

    ctx.init_process_group()
    torch.manual_seed(config.training.seed)
    part = read_partition(storage.open_published(partitions_uri, step=STEP), ctx.rank)
    edge_dir = "out" if part.metadata.edge_assignment == "src" else "in"
    glt.distributed.init_worker_group(world_size=1, rank=0, group_name="gnnflow-bench")
    ctx.init_rpc(num_rpc_threads=RPC_THREADS, rpc_timeout=300)
    task = NodeTask(SamplingSetup.of(ctx, config, part.metadata.schema, edge_dir), to_dist_dataset(part), part, node_splits(part), config)
    batch = next(iter(task.loaders["train"]))
    graph = torch.load(graph_path, weights_only=True)
    n = len(graph["label"])
    both = torch.stack([torch.cat([graph["src"], graph["dst"]]), torch.cat([graph["dst"], graph["src"]])])
    real = set((both[0] * n + both[1]).tolist())
    node, edges = batch.node, batch.edge_index
    checks = {
        "every edge in the graph": all(int(u) * n + int(v) in real for u, v in zip(node[edges[0]], node[edges[1]])),
        "features equal": bool((batch.x == graph["features"][node]).all()),
        "labels equal": bool((batch.y.reshape(-1)[: batch.batch_size] == graph["label"][node[: batch.batch_size]]).all()),
    }
    data = Data(x=graph["features"], y=graph["label"], edge_index=both, num_nodes=n)
    reference = next(iter(NeighborLoader(data, num_neighbors=config.training.fan_outs, batch_size=batch.batch_size,
                                         input_nodes=node[: batch.batch_size])))
    task.shutdown()
    glt.distributed.shutdown_rpc()
    return {"checks": checks, "glt": {"nodes": len(node), **_counts(edges, batch.batch_size)},
            "pyg": {"nodes": reference.num_nodes, **_counts(reference.edge_index, reference.batch_size)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=169_343)
    parser.add_argument("--edges", type=int, default=1_166_243)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--fan-outs", type=lambda s: [int(v) for v in s.split(",")], default=[15, 10])
    args = parser.parse_args()

    import torch

    from benchmarks.synthetic_graph import make_graph, write_serialized
    from benchmarks.train_throughput import make_config
    from components.config import PartitionSpec
    from components.launcher import launch
    from components.partition.step import partition

    logging.basicConfig(level=logging.WARNING)
    tmp = Path(tempfile.mkdtemp(prefix="gnnflow-neighbours-"))
    graph = make_graph(args.nodes, args.edges, 128, 40, 0.6, 0.12, 0)
    serialized = write_serialized(tmp / "tfrecords", graph, 40)
    torch.save({k: torch.from_numpy(v) for k, v in graph.items()}, tmp / "graph.pt")
    partitions = partition(serialized.root, tmp / "partitions", PartitionSpec(), world_size=1).root
    config = make_config(argparse.Namespace(batch_size=args.batch_size, fan_outs=args.fan_outs, epochs=1), 1)
    result = launch(compare_worker, (str(partitions), config, str(tmp / "graph.pt")), world_size=1)[0]
    print(f"{args.nodes:,} nodes, {args.edges:,} undirected edges; one batch of {args.batch_size} seeds, fan-outs {args.fan_outs}")
    print("checks on the GLT batch: " + ", ".join(f"{k}: {v}" for k, v in result["checks"].items()) + "\n")
    print("| loader | " + " | ".join(result["glt"]) + " |")
    print("|---|" + "---:|" * len(result["glt"]))
    for name, label in (("glt", "GLT DistNeighborLoader (train step)"), ("pyg", "PyG NeighborLoader")):
        print(f"| {label} | " + " | ".join(f"{v:,}" for v in result[name].values()) + " |")


if __name__ == "__main__":
    main()
