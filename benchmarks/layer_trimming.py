"""Layer trimming alone: one training step's forward + backward + Adam, plain against trimmed, on
the same GLT-sampled batches of an ogbn-arxiv-sized random graph; one thread; prints markdown.

    .venv/bin/python benchmarks/layer_trimming.py [--batches 20] [--repeat 3]

The batches come from GLT's own CPU sampler (its draw with replacement; fan-outs 15/10, 1,024 seeds each, nodes and edges
listed hop by hop, as the train step's loaders hand them over), with 128 random features. The
model is the train step's: GraphSAGE (2 layers, hidden 64, mean) + linear head over 40 classes.
"plain" runs every layer over every node of the batch (what ``model(x, edge_index)`` does);
"trimmed" is ``encode_batch`` (components/gnn/hop_trimming.py). Rows alternate, each best of
--repeat; sampling is done before the clock starts.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    import graphlearn_torch as glt
    import torch
    import torch.nn.functional as F
    from graphlearn_torch.sampler import NeighborSampler, NodeSamplerInput
    from torch_geometric.data import Data

    from components.config import ModelSpec
    from components.gnn.model import HomogeneousSAGE, NodeClassifier

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=169_343)
    parser.add_argument("--edges", type=int, default=1_166_243, help="undirected edges")
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    src, dst = torch.randint(0, args.nodes, (2, args.edges))
    graph = glt.data.Graph(glt.data.Topology(torch.stack([torch.cat([src, dst]), torch.cat([dst, src])]), layout="CSR"), "CPU")
    sampler = NeighborSampler(graph, [15, 10])
    features, labels = torch.randn(args.nodes, 128), torch.randint(0, 40, (args.nodes,))
    batches = []
    for i in range(args.batches):
        out = sampler.sample_from_nodes(NodeSamplerInput(torch.arange(i * 1024, (i + 1) * 1024)))
        batch = Data(x=features[out.node], edge_index=torch.stack([out.row, out.col]), y=labels[out.node])
        batch.num_sampled_nodes, batch.num_sampled_edges = list(out.num_sampled_nodes), list(out.num_sampled_edges)
        batches.append(batch)
    spec = ModelSpec()
    model = NodeClassifier(HomogeneousSAGE("node", 128, spec), spec.hidden_channels, 40, "node")
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)

    def epoch(trimmed: bool) -> float:
        start = time.perf_counter()
        for batch in batches:
            optimizer.zero_grad()
            z = model.encoder.encode_batch(batch)["node"] if trimmed else model.encoder(batch.x, batch.edge_index)
            F.cross_entropy(model.classify(z[:1024]), batch.y[:1024]).backward()
            optimizer.step()
        return time.perf_counter() - start

    seconds: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.repeat):
        for trimmed in (False, True):
            seconds[trimmed].append(epoch(trimmed))
    nodes = sum(sum(b.num_sampled_nodes) for b in batches) / len(batches)
    hops = [round(sum(b.num_sampled_nodes[h] for b in batches) / len(batches)) for h in range(3)]
    print(f"{args.batches} batches, {nodes:,.0f} nodes a batch (per hop {hops}); load {os.getloadavg()[0]:.2f}")
    print("| forward | seconds for the batches (best of %d) | vs plain |\n|---|---:|---:|" % args.repeat)
    base = min(seconds[False])
    for trimmed in (False, True):
        print(f"| {'trimmed' if trimmed else 'plain'} | {min(seconds[trimmed]):.2f} | {min(seconds[trimmed]) / base:.2f}x |")


if __name__ == "__main__":
    main()
