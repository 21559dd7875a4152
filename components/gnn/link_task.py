"""Link prediction on one worker: its partition's positives as seeds (see :mod:`.link_labels`),
with random, hard and in-batch negatives as ``training.negatives`` asks, and ROC-AUC over every
worker's scores. Validation and test positives never carry messages, so evaluation never sees
the edges it scores.
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F
from torch import nn

from components.config import GnnflowConfig
from components.gnn.build import reverse_edge_type, target_edge_type
from components.gnn.epoch import FROM_THE_START, EpochStart, trained_batches
from components.gnn.interruption import BatchAgreement
from components.gnn.learnt_embeddings import EmbeddingShards
from components.gnn.link_labels import hard_negative_pairs, positive_pairs
from components.gnn.metrics import AUC_BINS, all_sum, histogram_auc, label_entropy, score_histogram
from components.gnn.node_task import EpochResult
from components.gnn.sampling import RemoteCounter, SamplingSetup, link_loader
from components.partition.output import StoredPartition
from components.runtime import watchdog
from components.runtime.runlog import progress


def in_batch_negatives(pairs: torch.Tensor, label: torch.Tensor, rolls: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``pairs`` (2, m) and ``label`` (m,) plus, per positive, the destinations of ``rolls``
    other positives of the batch as its negatives (labelled 0): (2, m + rolls * positives)."""
    positive = pairs[:, label.bool()]
    m = positive.shape[1]
    if not rolls or m < 2:
        return pairs, label
    shifts = [1 + (r % (m - 1)) for r in range(rolls)]
    extra = torch.cat([torch.stack([positive[0], positive[1].roll(shift)]) for shift in shifts], dim=1)
    return torch.cat([pairs, extra], dim=1), torch.cat([label, torch.zeros(extra.shape[1], dtype=label.dtype, device=label.device)])


# Pair labels handed to GLT: its random negatives come back labelled 0; GLT would shift labels
# that include 0 up by one (as PyG does), so given ones never use it.
POSITIVE, GIVEN_NEGATIVE = 1, 2


class LinkTask:
    """Everything link prediction needs on one worker."""

    def __init__(
        self, setup: SamplingSetup, dataset, part: StoredPartition, config: GnnflowConfig, embeddings: EmbeddingShards | None = None
    ) -> None:
        self.embeddings = embeddings  # sharded learnt embeddings: their rows' gradients go to their owners
        schema = part.metadata.schema
        self.node_counts, self.rank = part.metadata.node_counts, part.index
        negatives = config.training.negatives
        self.in_batch_rolls = math.ceil(config.training.negative_ratio) if "in_batch" in negatives else 0
        # GLT files a heterogeneous batch's labelled pairs under the edge type its sampled edges
        # carry: reversed, with the pairs as [destination; source], when sampling out-edges.
        target = target_edge_type(schema)
        self.label_store = (reverse_edge_type(target) if setup.edge_dir == "out" else target) if schema.is_heterogeneous else None
        self.flip = schema.is_heterogeneous and setup.edge_dir == "out"
        edge_type = schema.target if schema.is_heterogeneous else None
        self.loaders, self.positive_counts = {}, {}
        # Every worker builds every loader, even over no pairs: building one is collective in GLT.
        for split in ("train", "val", "test"):
            positives, _ = positive_pairs(part, split)
            # Training takes hard negatives only when asked to; evaluation always scores them.
            hard = hard_negative_pairs(part, split) if split != "train" or "hard" in negatives else torch.zeros((2, 0), dtype=torch.int64)
            pairs = torch.cat([positives, hard], dim=1)
            labels = torch.cat([torch.full((positives.shape[1],), POSITIVE), torch.full((hard.shape[1],), GIVEN_NEGATIVE)])
            self.positive_counts[split] = positives.shape[1]
            self.loaders[split] = link_loader(
                setup,
                dataset,
                edge_type,
                pairs,
                labels,
                shuffle=split == "train",
                random_negatives=split != "train" or "random" in negatives,
            )

    def _labelled_pairs(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """((2, m) batch-local [source; destination] pairs, (m,) 1/0 labels) of a GLT batch."""
        store = batch[self.label_store] if self.label_store is not None else batch
        pairs = store.edge_label_index.flip(0) if self.flip else store.edge_label_index
        return pairs, (store.edge_label == POSITIVE).to(torch.float32)

    def train_epoch(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        show_progress: bool,
        agreement: BatchAgreement | None = None,
        start: EpochStart = FROM_THE_START,
    ) -> EpochResult:
        """One epoch (or its rest, from ``start``); see :meth:`NodeTask.train_epoch`."""
        model.train()
        began = time.perf_counter()
        self.sums = {
            "stats": torch.zeros(3, dtype=torch.float64),  # summed loss, batches, scored pairs
            "remote": torch.zeros(2, dtype=torch.int64),
            "labels": torch.zeros(2, dtype=torch.int64),  # negatives, positives scored
        } | {k: v.clone() for k, v in start.sums.items()}
        bar = progress("train", unit="batch") if show_progress else None
        remote = RemoteCounter(self.node_counts, self.rank, *self.sums["remote"].tolist())
        for batch in trained_batches(model, self.loaders, agreement, start):
            remote.add(batch)
            optimizer.zero_grad()
            leaves = self.embeddings.attach(batch) if self.embeddings is not None else []
            pairs, label = in_batch_negatives(*self._labelled_pairs(batch), self.in_batch_rolls)
            logits = model(batch, pairs)
            loss = F.binary_cross_entropy_with_logits(logits, label.float())
            loss.backward()
            if self.embeddings is not None:
                self.embeddings.push(leaves)
            optimizer.step()
            self.sums["stats"] += torch.tensor([float(loss) * len(logits), 1.0, len(logits)], dtype=torch.float64)
            self.sums["labels"] += torch.bincount(label.to(torch.int64).cpu(), minlength=2)
            self.sums["remote"] = torch.tensor([remote.sampled, remote.remote])
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        totals = all_sum(self.sums["stats"])
        return EpochResult(
            float(totals[0]) / max(float(totals[2]), 1.0),
            int(totals[1]),
            time.perf_counter() - began,
            {},
            remote.fraction(),
            label_entropy(all_sum(self.sums["labels"])),
        )

    def epoch_sums(self) -> dict[str, torch.Tensor]:
        """This rank's running sums of the epoch in progress."""
        return {k: v.clone() for k, v in self.sums.items()}

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str) -> dict[str, float]:
        """ROC-AUC of ``split`` positives against as many sampled negatives, over every worker
        (from summed score histograms: constant memory whatever the number of pairs)."""
        model.eval()
        positive, negative = torch.zeros(AUC_BINS, dtype=torch.int64), torch.zeros(AUC_BINS, dtype=torch.int64)
        for batch in watchdog.batches(self.loaders[split], working="evaluating"):
            pairs, label = self._labelled_pairs(batch)
            scores = model(batch, pairs)
            label = label.bool()
            positive += score_histogram(scores[label])
            negative += score_histogram(scores[~label])
        positive, negative = all_sum(positive), all_sum(negative)
        return {"roc_auc": histogram_auc(positive, negative), "count": int(positive.sum())}

    def shutdown(self) -> None:
        for loader in self.loaders.values():
            loader.shutdown()
        self.loaders = {}  # and let go of them (see glt_compat.keep_with)
