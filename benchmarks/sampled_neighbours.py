"""How many distinct neighbours a gnnflow mini-batch holds, with and without replacement, against
PyG's NeighborLoader on the same seeds.

One batch of --batch-size training seeds from the train step's own GLT loader (1 worker, the
project's partitions of the synthetic ogbn-arxiv-sized graph of `benchmarks/synthetic_graph.py`),
drawn with `training.replace: false` (the default) and `true` (GLT 0.2.4's own CPU draw), and one
PyG `NeighborLoader` batch over the same seeds and fan-outs on the whole graph. Every batch is
checked against the graph (every edge real, features and labels equal the originals) and
counted: edges, distinct edges, edges into the seeds and the distinct first-hop neighbours they
come from. A sampler that draws with replacement shows fewer distinct neighbours than draws.
The replace-false batch is drawn again in a second launch (a rerun): it must be bit-identical.

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


def compare_worker(ctx, partitions_uri: str, config, graph_path: str, replace_values: list[bool]) -> dict:
    """The first training batch of the train step's loader for each ``replace`` value, checked
    and counted, and PyG's batch over the same seeds."""
    import graphlearn_torch as glt
    import torch
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader

    from components import storage
    from components.gnn.node_task import NodeTask
    from components.gnn.sampling import RPC_THREADS, SamplingSetup
    from components.gnn.glt_dataset import node_splits, to_dist_dataset
    from components.partition.output import STEP
    from components.partition.output import read_partition

    ctx.init_process_group()
    part = read_partition(storage.open_published(partitions_uri, step=STEP), ctx.rank)
    edge_dir = "out" if part.metadata.edge_assignment == "src" else "in"
    glt.distributed.init_worker_group(world_size=1, rank=0, group_name="gnnflow-bench")
    ctx.init_rpc(num_rpc_threads=RPC_THREADS, rpc_timeout=300)
    dataset = to_dist_dataset(part)
    graph = torch.load(graph_path, weights_only=True)
    n = len(graph["label"])
    both = torch.stack([torch.cat([graph["src"], graph["dst"]]), torch.cat([graph["dst"], graph["src"]])])
    real = set((both[0] * n + both[1]).tolist())
    result: dict = {"checks": {}, "batches": {}}
    for replace in replace_values:
        torch.manual_seed(config.training.seed)  # the same shuffle, so the same seeds
        run_config = with_replace(config, replace)
        task = NodeTask(SamplingSetup.of(ctx, run_config, part.metadata.schema, edge_dir), dataset, part, node_splits(part), run_config)
        batch = next(iter(task.loaders["train"]))
        task.shutdown()
        node, edges = batch.node, batch.edge_index
        name = f"replace {str(replace).lower()}"
        result["checks"][name] = {
            "every edge in the graph": all(int(u) * n + int(v) in real for u, v in zip(node[edges[0]], node[edges[1]])),
            "features equal": bool((batch.x == graph["features"][node]).all()),
            "labels equal": bool((batch.y.reshape(-1)[: batch.batch_size] == graph["label"][node[: batch.batch_size]]).all()),
        }
        result["batches"][name] = {"node": node.numpy().copy(), "edge_index": edges.numpy().copy(), "batch_size": int(batch.batch_size)}
    seeds = result["batches"][f"replace {str(replace_values[0]).lower()}"]
    data = Data(x=graph["features"], y=graph["label"], edge_index=both, num_nodes=n)
    reference = next(iter(NeighborLoader(data, num_neighbors=config.training.fan_outs, batch_size=seeds["batch_size"],
                                         input_nodes=torch.from_numpy(seeds["node"][: seeds["batch_size"]]))))
    result["batches"]["pyg"] = {"node": reference.n_id.numpy(), "edge_index": reference.edge_index.numpy(),
                                "batch_size": reference.batch_size}
    glt.distributed.shutdown_rpc()
    return result  # numpy arrays: tensors would cross the launcher's pipe as shared memory of a finished worker


def with_replace(config, replace: bool):
    """``config`` with ``training.replace`` set."""
    return config.model_copy(update={"training": config.training.model_copy(update={"replace": replace})})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=169_343)
    parser.add_argument("--edges", type=int, default=1_166_243)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--fan-outs", type=lambda s: [int(v) for v in s.split(",")], default=[15, 10])
    args = parser.parse_args()

    import numpy as np
    import torch

    from benchmarks.synthetic_graph import make_graph, write_serialized
    from benchmarks.train_throughput import make_config
    from components.config import PartitionSpec
    from components.runtime.launcher import launch
    from components.partition.step import partition

    logging.basicConfig(level=logging.WARNING)
    tmp = Path(tempfile.mkdtemp(prefix="gnnflow-neighbours-"))
    graph = make_graph(args.nodes, args.edges, 128, 40, 0.6, 0.12, 0)
    serialized = write_serialized(tmp / "tfrecords", graph, 40)
    torch.save({k: torch.from_numpy(v) for k, v in graph.items()}, tmp / "graph.pt")
    partitions = partition(serialized.root, tmp / "partitions", PartitionSpec(), world_size=1).root
    config = make_config(argparse.Namespace(batch_size=args.batch_size, fan_outs=args.fan_outs, epochs=1), 1)
    result = launch(compare_worker, (str(partitions), config, str(tmp / "graph.pt"), [False, True]), world_size=1)[0]
    rerun = launch(compare_worker, (str(partitions), config, str(tmp / "graph.pt"), [False]), world_size=1)[0]
    first, second = result["batches"]["replace false"], rerun["batches"]["replace false"]
    identical = all(np.array_equal(first[k], second[k]) for k in ("node", "edge_index"))
    same_seeds = np.array_equal(first["node"][: first["batch_size"]], result["batches"]["replace true"]["node"][: first["batch_size"]])
    print(f"{args.nodes:,} nodes, {args.edges:,} undirected edges; one batch of {args.batch_size} seeds, fan-outs {args.fan_outs}")
    for name, checks in result["checks"].items():
        print(f"checks on the gnnflow batch ({name}): " + ", ".join(f"{k}: {v}" for k, v in checks.items()))
    print(f"same seeds in both gnnflow batches: {same_seeds}; replace false rerun (a second launch) bit-identical: {identical}\n")
    rows = {label: {"nodes": len(result["batches"][name]["node"]),
                    **_counts(torch.from_numpy(result["batches"][name]["edge_index"]), args.batch_size)}
            for name, label in (("replace false", "gnnflow, `replace: false` (default)"),
                                ("replace true", "gnnflow, `replace: true` (GLT's own draw)"), ("pyg", "PyG NeighborLoader"))}
    columns = next(iter(rows.values()))
    print("| loader | " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for label, counts in rows.items():
        print(f"| {label} | " + " | ".join(f"{v:,}" for v in counts.values()) + " |")


if __name__ == "__main__":
    main()
