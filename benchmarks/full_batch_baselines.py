"""Full-batch PyG baselines with their papers' hyperparameters, on the graph a preprocess output holds
(used by benchmarks/unseen_accuracy.py).

The graph is read from the published output of step preprocess: the node ids, features (after the
config's transforms: what gnnflow's models see), labels and split (CiteSeer's own; on the demo
graphs, the random split preprocess drew), and the message edges, made undirected. Each model then
row-normalises the features (each row divided by its sum of absolute values; for 0/1 columns, the
papers' normalisation) and trains on the whole graph at once.

  gcn    Kipf & Welling 2017, "Semi-Supervised Classification with Graph Convolutional Networks",
         section 5.3 and its code (tkipf/gcn): 2 layers, 16 hidden, ReLU, dropout 0.5 on each
         layer's input, Adam lr 0.01, weight decay 5e-4 on the first layer's weights, 200 epochs.
  gat    Velickovic et al. 2018, "Graph Attention Networks", section 3.3 (transductive): 8 heads x 8
         hidden, ELU, one output head, dropout 0.6 on both layers' inputs and on the attention
         coefficients, Adam lr 0.005, weight decay 5e-4 (all weights), patience 100.
  appnp  Klicpera et al. 2019, "Predict then Propagate", section 6 and its code (klicpera/ppnp): an
         MLP with 64 hidden (Glorot init, no bias), dropout 0.5 on both layers and on the adjacency
         matrix (drawn afresh at each propagation step), K 10, teleport 0.1, Adam lr 0.01,
         weight decay 5e-3 on the first layer's weights, patience 100.

Patience (gat, appnp): training stops after 100 epochs in which neither validation accuracy nor
validation loss improved on its best (GAT's "early stopping on both the loss and the accuracy of
the validation nodes"; APPNP's criterion is the same pair), or after MAX_EPOCHS. Improved means
strictly better: the GAT code's >= on accuracy never stops a run whose validation accuracy keeps
returning to its plateau (the demo graphs, near 0.98), which only the cap would end.

Model selection, every model: the epoch with the best validation accuracy, ties broken by the
lower validation loss; the test split is read once, with that epoch's weights, after training.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import time
from dataclasses import dataclass

import numpy as np
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F
from torch_geometric.nn import GATConv, GCNConv, Linear
from torch_geometric.nn.conv.gcn_conv import gcn_norm
from torch_geometric.utils import to_undirected

from components import storage
from components.schema import NO_LABEL, SPLIT_CODES

MAX_EPOCHS = 10_000  # the cap of the early-stopped models (APPNP's paper: 10,000); patience ends them long before
PATIENCE = 100


@dataclass(frozen=True)
class Graph:
    """x (n, f) row-normalised, edge_index (2, e) undirected, y (n,) (-1: none), masks of each split."""

    x: torch.Tensor
    edge_index: torch.Tensor
    y: torch.Tensor
    masks: dict[str, torch.Tensor]
    num_classes: int


def load_preprocessed(uri: storage.Uri) -> Graph:
    """The target node type and its message edges from a published preprocess output (local)."""
    published = storage.open_published(uri, step="preprocess")
    schema = published.read_json("graph_schema.json")
    target = schema["target"]
    nodes = schema["node_types"][target]
    tables = [pq.read_table(str(published.uri(f))) for f in nodes["files"]]
    ids = np.concatenate([t.column("node_id").to_numpy() for t in tables])
    order = np.argsort(ids)
    if not np.array_equal(ids[order], np.arange(len(ids))):
        raise ValueError(f"{uri}: node ids are not 0..{len(ids) - 1}")
    width = len(nodes["feature_names"])
    x = np.concatenate([t.column("features").combine_chunks().flatten().to_numpy().reshape(-1, width) for t in tables])[order]
    y = np.concatenate([t.column("label").to_numpy() for t in tables])[order]
    split = np.concatenate([t.column("split").to_numpy() for t in tables])[order]
    pairs = []
    for edge_type in schema["edge_types"].values():
        if edge_type["src_type"] != target or edge_type["dst_type"] != target or edge_type.get("role", "message") != "message":
            continue
        for f in edge_type["files"]:
            table = pq.read_table(str(published.uri(f)), columns=["src", "dst"])
            pairs.append(np.stack([table.column("src").to_numpy(), table.column("dst").to_numpy()]))
    edge_index = to_undirected(torch.from_numpy(np.concatenate(pairs, axis=1)).to(torch.int64), num_nodes=len(ids))
    features = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    features = features / features.abs().sum(dim=1, keepdim=True).clamp(min=1e-12)  # all-zero rows stay zero
    labels = torch.from_numpy(y.astype(np.int64))
    masks = {name: torch.from_numpy((split == code) & (y != NO_LABEL)) for name, code in SPLIT_CODES.items()}
    return Graph(features, edge_index, labels, masks, len(nodes["label_vocabulary"]))


class GCN(torch.nn.Module):
    def __init__(self, features: int, classes: int) -> None:
        super().__init__()
        self.conv1, self.conv2 = GCNConv(features, 16, cached=True), GCNConv(16, classes, cached=True)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = F.dropout(x, 0.5, self.training)
        x = F.dropout(F.relu(self.conv1(x, edge_index)), 0.5, self.training)
        return self.conv2(x, edge_index)

    def parameter_groups(self) -> list[dict]:
        return [{"params": self.conv1.parameters(), "weight_decay": 5e-4}, {"params": self.conv2.parameters(), "weight_decay": 0.0}]


class GAT(torch.nn.Module):
    def __init__(self, features: int, classes: int) -> None:
        super().__init__()
        self.conv1 = GATConv(features, 8, heads=8, dropout=0.6)
        self.conv2 = GATConv(64, classes, heads=1, concat=False, dropout=0.6)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = F.dropout(x, 0.6, self.training)
        x = F.dropout(F.elu(self.conv1(x, edge_index)), 0.6, self.training)
        return self.conv2(x, edge_index)

    def parameter_groups(self) -> list[dict]:
        return [{"params": self.parameters(), "weight_decay": 5e-4}]


class PersonalizedPageRank(torch.nn.Module):
    """K steps of x <- (1 - teleport) A x + teleport h, A the symmetrically normalised adjacency with
    self-loops, each step's A with its own edge dropout (PyG's APPNP drops the edges of the step before
    again at every step, so that after K steps the survivors weigh 2^K: written here instead)."""

    def __init__(self, steps: int, teleport: float, edge_dropout: float) -> None:
        super().__init__()
        self.steps, self.teleport, self.edge_dropout = steps, teleport, edge_dropout
        self._normalised: tuple[torch.Tensor, torch.Tensor] | None = None

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        if self._normalised is None:
            index, weight = gcn_norm(edge_index, None, x.size(0), add_self_loops=True)
            self._normalised = (index.flip(0), weight)  # rows: the messages' destinations
        index, weight = self._normalised
        h = x
        for _ in range(self.steps):
            adjacency = torch.sparse_coo_tensor(index, F.dropout(weight, self.edge_dropout, self.training), (x.size(0), x.size(0)))
            x = (1 - self.teleport) * torch.sparse.mm(adjacency, x) + self.teleport * h
        return x


class APPNPNet(torch.nn.Module):
    def __init__(self, features: int, classes: int) -> None:
        super().__init__()
        # Glorot-initialised like GCN's and GAT's layers; no bias, as in the paper's code.
        self.lin1 = Linear(features, 64, bias=False, weight_initializer="glorot")
        self.lin2 = Linear(64, classes, bias=False, weight_initializer="glorot")
        self.propagate = PersonalizedPageRank(steps=10, teleport=0.1, edge_dropout=0.5)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = F.dropout(x, 0.5, self.training)
        x = F.dropout(F.relu(self.lin1(x)), 0.5, self.training)
        return self.propagate(self.lin2(x), edge_index)

    def parameter_groups(self) -> list[dict]:
        return [{"params": self.lin1.parameters(), "weight_decay": 5e-3}, {"params": self.lin2.parameters(), "weight_decay": 0.0}]


@dataclass(frozen=True)
class Recipe:
    model: type[torch.nn.Module]
    learning_rate: float
    epochs: int
    patience: int | None  # None: every epoch runs


RECIPES = {
    "gcn": Recipe(GCN, 0.01, 200, None),
    "gat": Recipe(GAT, 0.005, MAX_EPOCHS, PATIENCE),
    "appnp": Recipe(APPNPNet, 0.01, MAX_EPOCHS, PATIENCE),
}


def version(name: str) -> str:
    """A digest of the code that trains ``name``: a result recorded with another is stale."""
    parts = [RECIPES[name].model, *(PersonalizedPageRank,) * (name == "appnp"), load_preprocessed, train_and_test, _evaluate]
    text = repr(RECIPES[name]) + "".join(inspect.getsource(part) for part in parts)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _evaluate(model: torch.nn.Module, graph: Graph, split: str) -> tuple[float, float]:
    """(accuracy, loss) of ``split``."""
    model.eval()
    with torch.no_grad():
        out = model(graph.x, graph.edge_index)
    mask = graph.masks[split]
    accuracy = float((out[mask].argmax(1) == graph.y[mask]).float().mean())
    return accuracy, float(F.cross_entropy(out[mask], graph.y[mask]))


def train_and_test(name: str, graph: Graph, seed: int) -> dict:
    """Trains ``name`` with ``seed``; the best validation epoch's accuracies and the seconds trained."""
    recipe = RECIPES[name]
    torch.manual_seed(seed)
    model = recipe.model(graph.x.shape[1], graph.num_classes)  # type: ignore[call-arg]
    optimizer = torch.optim.Adam(model.parameter_groups(), lr=recipe.learning_rate)  # type: ignore[operator]
    train = graph.masks["train"]
    best: tuple[float, float] = (-1.0, float("inf"))  # (val accuracy, -val loss) order: see ``better``
    best_state, best_epoch, top_accuracy, low_loss, waited, epoch = None, -1, -1.0, float("inf"), 0, 0
    start = time.perf_counter()
    for epoch in range(recipe.epochs):
        model.train()
        optimizer.zero_grad()
        F.cross_entropy(model(graph.x, graph.edge_index)[train], graph.y[train]).backward()
        optimizer.step()
        accuracy, loss = _evaluate(model, graph, "val")
        if accuracy > best[0] or (accuracy == best[0] and loss < best[1]):
            best, best_epoch, best_state = (accuracy, loss), epoch, copy.deepcopy(model.state_dict())
        if accuracy > top_accuracy or loss < low_loss:
            top_accuracy, low_loss, waited = max(accuracy, top_accuracy), min(loss, low_loss), 0
        else:
            waited += 1
            if recipe.patience is not None and waited >= recipe.patience:
                break
    seconds = time.perf_counter() - start
    model.load_state_dict(best_state)  # type: ignore[arg-type]
    test, _ = _evaluate(model, graph, "test")  # the only read of the test split
    return {
        "val_accuracy": best[0],
        "test_accuracy": test,
        "best_epoch": best_epoch,
        "epochs_run": epoch + 1,
        "train_seconds": round(seconds, 2),
    }


if __name__ == "__main__":
    import sys

    g = load_preprocessed(storage.parse_uri(sys.argv[1]))
    for method in sys.argv[2:] or list(RECIPES):
        print(method, json.dumps(train_and_test(method, g, 0)), flush=True)
