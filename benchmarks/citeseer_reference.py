"""CiteSeer full-batch reference in one PyG process: which classifier head and which feature
transform reach the file's reference accuracy (2-layer GraphSAGE, hidden 64, dropout 0.5, Adam
lr 0.01, weight decay 5e-4, 200 epochs, test accuracy at the best validation epoch).

    .venv/bin/python benchmarks/citeseer_reference.py [--seeds 0 1 2] [--variants plain linear_head ...]

Variants (each on row-normalised and raw 0/1 features):
  plain       the two SAGE layers, the last one emitting the classes (the reference recipe)
  relu_head   the layers emit ``hidden`` values, then ReLU and a linear layer (gnnflow's NodeClassifier)
  linear_head the layers emit ``hidden`` values, then a linear layer (tried; see benchmarks/RESULTS.md)
"""

from __future__ import annotations

import argparse
import pathlib
import time

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch_geometric.nn import GraphSAGE
from torch_geometric.utils import to_undirected
from torch_sparse import SparseTensor

CITESEER = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "citeseer"
HIDDEN, EPOCHS = 64, 200


def load(folder: pathlib.Path) -> tuple[torch.Tensor, SparseTensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Features (n, 3703) 0/1, adjacency (n, n), labels (n,) (-1: none), split masks."""
    nodes = pd.read_csv(folder / "nodes.csv.gz", dtype={"node_id": str, "label": str, "split": str})
    edges = pd.read_csv(folder / "edges.csv.gz", dtype=str)
    index = pd.Series(np.arange(len(nodes)), index=nodes["node_id"])
    edge_index = to_undirected(torch.tensor(np.stack([index[edges["src"]].to_numpy(), index[edges["dst"]].to_numpy()])))
    adj = SparseTensor(row=edge_index[1], col=edge_index[0], sparse_sizes=(len(nodes), len(nodes)))
    x = torch.tensor(nodes.filter(regex=r"^f\d+$").to_numpy(), dtype=torch.float32)
    classes = sorted(nodes["label"].dropna().unique())
    y = torch.tensor(nodes["label"].map({c: i for i, c in enumerate(classes)}).fillna(-1).astype(int).to_numpy())
    masks = {name: torch.tensor((nodes["split"] == name).to_numpy()) for name in ("train", "val", "test")}
    return x, adj, y, masks


class HeadedSAGE(torch.nn.Module):
    def __init__(self, in_dim: int, num_classes: int, relu: bool) -> None:
        super().__init__()
        self.encoder, self.head, self.relu = GraphSAGE(in_dim, HIDDEN, 2, dropout=0.5), torch.nn.Linear(HIDDEN, num_classes), relu

    def forward(self, x: torch.Tensor, adj: SparseTensor) -> torch.Tensor:
        h = self.encoder(x, adj)
        return self.head(torch.relu(h) if self.relu else h)


def best_val_test_accuracy(model: torch.nn.Module, x, adj, y, masks, seed: int) -> float:
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    best_val, test_at_best = -1.0, 0.0
    for _ in range(EPOCHS):
        model.train()
        optimizer.zero_grad()
        F.cross_entropy(model(x, adj)[masks["train"]], y[masks["train"]]).backward()
        optimizer.step()
        model.eval()
        with torch.no_grad():
            predicted = model(x, adj).argmax(dim=1)
        val, test = ((predicted[masks[s]] == y[masks[s]]).float().mean().item() for s in ("val", "test"))
        if val > best_val:
            best_val, test_at_best = val, test
    return test_at_best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--variants", nargs="+", default=["plain", "relu_head", "linear_head"])
    args = parser.parse_args()
    x, adj, y, masks = load(CITESEER)
    num_classes = int(y.max()) + 1
    features = {"row-normalised": x / x.sum(dim=1, keepdim=True).clamp(min=1), "raw 0/1": x}
    print("| head | features | test accuracy per seed | mean | seconds |\n|---|---|---|---:|---:|")
    for variant in args.variants:
        for feature_name, inputs in features.items():
            started, accuracies = time.perf_counter(), []
            for seed in args.seeds:
                torch.manual_seed(seed)
                if variant == "plain":
                    model: torch.nn.Module = GraphSAGE(x.shape[1], HIDDEN, 2, out_channels=num_classes, dropout=0.5)
                else:
                    model = HeadedSAGE(x.shape[1], num_classes, relu=variant == "relu_head")
                accuracies.append(best_val_test_accuracy(model, inputs, adj, y, masks, seed))
            shown = " / ".join(f"{a:.3f}" for a in accuracies)
            print(f"| {variant} | {feature_name} | {shown} | {np.mean(accuracies):.4f} | {time.perf_counter() - started:.0f} |", flush=True)


if __name__ == "__main__":
    main()
