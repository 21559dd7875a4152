"""Link prediction on one worker: positive edges of its partition as seeds, sampled negatives,
and ROC-AUC over every worker's scores.

Only training edges carry messages (validation and test edges are held out of the sampled
graph), so evaluation never sees the edges it scores.
"""

from __future__ import annotations

import contextlib
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from components.config import GnnflowConfig
from components.errors import GnnflowError
from components.partition.store import StoredPartition
from components.runlog import progress
from components.schema import SPLIT_CODES, GraphSchema
from components.train.metrics import AUC_BINS, all_sum, histogram_auc, score_histogram
from components.train.model import LinkPredictor, homogeneous_encoder
from components.train.node_task import EpochResult
from components.train.sampling import RemoteCounter, SamplingSetup, link_loader


def build_link_predictor(schema: GraphSchema, config: GnnflowConfig, edge_dir: str) -> LinkPredictor:
    if schema.is_heterogeneous:
        raise GnnflowError("link prediction is supported on homogeneous graphs (one node type, one edge type)")
    node = next(iter(schema.node_types.values()))
    encoder = homogeneous_encoder(node.feature_dim, config.model)
    return LinkPredictor(encoder, config.model.hidden_channels, config.model.decoder)


def training_edges(part: StoredPartition, target: str) -> dict[str, torch.Tensor]:
    """Edge mask per type for the sampled graph: the target type keeps its training edges only."""
    return {name: (e["split"] == SPLIT_CODES["train"]) if name == target else torch.ones(len(e["edge_id"]), dtype=torch.bool)
            for name, e in part.edges.items()}


def positive_pairs(part: StoredPartition, target: str, split: str, count: int) -> torch.Tensor:
    """(2, m) partition ids of this partition's ``split`` edges, each undirected edge once."""
    edges = part.edges[target]
    keep = (edges["split"] == SPLIT_CODES[split]) & (edges["source_edge_id"] < count)
    return edges["edge_index"][:, keep]


class LinkTask:
    """Everything link prediction needs on one worker."""

    def __init__(self, setup: SamplingSetup, dataset, part: StoredPartition, config: GnnflowConfig) -> None:
        schema = part.metadata.schema
        count = schema.edge_types[schema.target].count
        self.node_counts, self.rank = part.metadata.node_counts, part.index
        self.pairs = {name: positive_pairs(part, schema.target, name, count) for name in ("train", "val", "test")}
        # Every worker builds every loader, even over no pairs: building one is collective in GLT.
        self.loaders = {
            name: link_loader(setup, dataset, None, pairs, shuffle=name == "train") for name, pairs in self.pairs.items()
        }

    def train_epoch(self, model: nn.Module, optimizer: torch.optim.Optimizer, show_progress: bool) -> EpochResult:
        model.train()
        start = time.perf_counter()
        stats = [0.0, 0, 0]  # summed loss, batches, scored pairs
        bar = progress("train", unit="batch") if show_progress else None
        joined = model.join() if isinstance(model, DistributedDataParallel) else contextlib.nullcontext()
        remote = RemoteCounter(self.node_counts, self.rank)
        with joined:
            for batch in self.loaders["train"]:
                remote.add(batch)
                optimizer.zero_grad()
                logits = model(batch.x, batch.edge_index, batch.edge_label_index)
                loss = F.binary_cross_entropy_with_logits(logits, batch.edge_label.float())
                loss.backward()
                optimizer.step()
                stats[0] += float(loss) * len(logits)
                stats[1] += 1
                stats[2] += len(logits)
                if bar is not None:
                    bar.update(1)
        if bar is not None:
            bar.close()
        totals = all_sum(torch.tensor(stats, dtype=torch.float64))
        return EpochResult(float(totals[0]) / max(float(totals[2]), 1.0), int(totals[1]), time.perf_counter() - start, {},
                           remote.fraction())

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str) -> dict[str, float]:
        """ROC-AUC of ``split`` positives against as many sampled negatives, over every worker
        (from summed score histograms: constant memory whatever the number of pairs)."""
        model.eval()
        positive, negative = torch.zeros(AUC_BINS, dtype=torch.int64), torch.zeros(AUC_BINS, dtype=torch.int64)
        for batch in self.loaders[split]:
            scores = model(batch.x, batch.edge_index, batch.edge_label_index)
            label = batch.edge_label.bool()
            positive += score_histogram(scores[label])
            negative += score_histogram(scores[~label])
        positive, negative = all_sum(positive), all_sum(negative)
        return {"roc_auc": histogram_auc(positive, negative), "count": int(positive.sum())}

    def shutdown(self) -> None:
        for loader in self.loaders.values():
            loader.shutdown()
        self.loaders = {}  # and let go of them (see glt_compat.keep_with)
