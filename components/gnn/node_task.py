"""Node classification on one worker: loaders over its partition's labelled seeds, an epoch of
training, and evaluation whose counts are summed over every worker."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from components.config import GnnflowConfig
from components.gnn.epoch import FROM_THE_START, EpochStart, trained_batches
from components.gnn.glt_dataset import NodeSplits
from components.gnn.interruption import BatchAgreement
from components.gnn.learnt_embeddings import EmbeddingShards
from components.gnn.metrics import all_sum, classification_metrics, confusion_matrix, label_entropy
from components.gnn.sampling import RemoteCounter, SamplingSetup, node_loader
from components.partition.output import StoredPartition
from components.runtime import watchdog
from components.runtime.runlog import progress


@dataclass
class EpochResult:
    loss: float
    batches: int
    seconds: float
    train: dict[str, float]
    remote_fraction: float = 0.0  # sampled nodes owned by another partition, over every worker
    chance_loss: float = 0.0  # the loss of predicting the trained labels' shares (components/train/health.py)


class NodeTask:
    """Everything node classification needs on one worker."""

    def __init__(
        self,
        setup: SamplingSetup,
        dataset,
        part: StoredPartition,
        splits: NodeSplits,
        config: GnnflowConfig,
        embeddings: EmbeddingShards | None = None,
    ) -> None:
        self.embeddings = embeddings  # sharded learnt embeddings: their rows' gradients go to their owners
        schema = part.metadata.schema
        self.target = schema.target
        self.hetero = schema.is_heterogeneous
        self.node_counts, self.rank = part.metadata.node_counts, part.index
        self.num_classes = schema.node_types[self.target].num_classes
        training = config.training

        def seeds(ids: dict[str, torch.Tensor]):
            own = ids[self.target]
            return (self.target, own) if self.hetero else own

        self.seed_counts = {name: len(getattr(splits, name)[self.target]) for name in ("train", "val", "test")}
        # Every worker builds every loader, even over no seeds (then it yields no batches):
        # building one is collective in GLT (RPC all-gathers), so a worker that skipped it
        # would leave its peers waiting.
        self.loaders = {
            name: node_loader(
                setup,
                dataset,
                seeds(getattr(splits, name)),
                shuffle=name == "train",
                batch_size=training.batch_size if name == "train" else training.eval_batch_size,
            )
            for name in ("train", "val", "test")
        }

    def _seed_labels(self, batch) -> torch.Tensor:
        """(batch_size,) labels of a GLT batch's seeds (the first nodes of the target type)."""
        store = batch[self.target] if self.hetero else batch
        return store.y.reshape(-1)[: store.batch_size]

    def train_epoch(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        show_progress: bool,
        agreement: BatchAgreement | None = None,
        start: EpochStart = FROM_THE_START,
    ) -> EpochResult:
        """One epoch (or its rest, from ``start``); it ends early when the ranks agree to stop
        (then ``agreement.stopped``)."""
        model.train()
        began = time.perf_counter()
        # Running sums, which a checkpoint taken mid-epoch carries (see epoch_sums).
        self.sums = {
            "stats": torch.zeros(2, dtype=torch.float64),  # summed loss, batches
            "confusion": torch.zeros((self.num_classes, self.num_classes), dtype=torch.int64),
            "remote": torch.zeros(2, dtype=torch.int64),
        } | {k: v.clone() for k, v in start.sums.items()}
        remote = RemoteCounter(self.node_counts, self.rank, *self.sums["remote"].tolist())
        bar = progress("train", unit="batch") if show_progress else None
        for batch in trained_batches(model, self.loaders, agreement, start):
            remote.add(batch)
            y = self._seed_labels(batch)
            optimizer.zero_grad()
            leaves = self.embeddings.attach(batch) if self.embeddings is not None else []
            logits = model(batch)[: len(y)]
            labelled = y >= 0
            # A batch can hold no labelled seed (a small batch of a sparsely labelled graph): its loss is 0, not nan.
            loss = F.cross_entropy(logits[labelled], y[labelled], reduction="sum") / max(int(labelled.sum()), 1)
            loss.backward()
            if self.embeddings is not None:
                self.embeddings.push(leaves)
            optimizer.step()
            self.sums["stats"] += torch.tensor([float(loss) * int(labelled.sum()), 1.0], dtype=torch.float64)
            self.sums["confusion"] += confusion_matrix(logits[labelled].argmax(-1).detach(), y[labelled], self.num_classes)
            self.sums["remote"] = torch.tensor([remote.sampled, remote.remote])
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        seconds = time.perf_counter() - began
        totals = all_sum(self.sums["stats"])
        confusion = all_sum(self.sums["confusion"])
        count = int(confusion.sum())
        return EpochResult(
            float(totals[0]) / max(count, 1),
            int(totals[1]),
            seconds,
            classification_metrics(confusion),
            remote.fraction(),
            label_entropy(confusion.sum(1)),
        )

    def epoch_sums(self) -> dict[str, torch.Tensor]:
        """This rank's running sums of the epoch in progress."""
        return {k: v.clone() for k, v in self.sums.items()}

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str) -> dict[str, float]:
        """Accuracy and macro-F1 over every worker's ``split`` seeds."""
        model.eval()
        confusion = torch.zeros((self.num_classes, self.num_classes), dtype=torch.int64)
        for batch in watchdog.batches(self.loaders[split], working="evaluating"):
            y = self._seed_labels(batch)
            pred = model(batch)[: len(y)].argmax(-1)
            labelled = y >= 0
            confusion += confusion_matrix(pred[labelled], y[labelled], self.num_classes)
        return classification_metrics(all_sum(confusion))

    def shutdown(self) -> None:
        for loader in self.loaders.values():
            loader.shutdown()
        self.loaders = {}  # and let go of them (see glt_compat.keep_with)
