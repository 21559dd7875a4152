"""Metrics over all workers: counts and scores are reduced across ranks, never rank 0's alone."""

from __future__ import annotations

import torch
import torch.distributed as dist

from components.runtime import watchdog


def confusion_matrix(pred: torch.Tensor, target: torch.Tensor, num_classes: int) -> torch.Tensor:
    """(num_classes, num_classes) int64 counts, rows: true class, columns: predicted class; on
    the host whatever the inputs' device (counts are summed over workers by gloo)."""
    index = target.to(torch.int64) * num_classes + pred.to(torch.int64)
    return torch.bincount(index, minlength=num_classes * num_classes).reshape(num_classes, num_classes).cpu()


def label_entropy(class_counts: torch.Tensor) -> float:
    """(classes,) label counts → the cross-entropy (nats) of predicting their shares for every
    example: the training loss of the best constant model ("chance")."""
    counts = class_counts.to(torch.float64)
    shares = counts[counts > 0] / counts.sum().clamp(min=1)
    return float(-(shares * shares.log()).sum())


def all_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum of ``t`` over every worker (``t`` unchanged when there is no process group)."""
    if dist.is_initialized():
        t = t.clone()
        with watchdog.phase("all-reduce"):
            dist.all_reduce(t)
    return t


def classification_metrics(confusion: torch.Tensor) -> dict[str, float]:
    """Accuracy and macro-F1 from a confusion matrix (classes absent from both sides count as F1 0)."""
    c = confusion.to(torch.float64)
    total = c.sum()
    tp = c.diag()
    precision_den, recall_den = c.sum(0), c.sum(1)
    f1 = torch.where(precision_den + recall_den > 0, 2 * tp / (precision_den + recall_den).clamp(min=1), torch.zeros_like(tp))
    return {"accuracy": float(tp.sum() / total) if total > 0 else 0.0, "macro_f1": float(f1.mean()), "count": int(total)}


def all_gather_cat(t: torch.Tensor) -> torch.Tensor:
    """Concatenation of ``t`` from every worker in rank order (first dimensions may differ)."""
    if not dist.is_initialized():
        return t
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, torch.tensor([len(t)], dtype=torch.int64))
    longest = int(max(s.item() for s in sizes))
    padded = torch.zeros((longest, *t.shape[1:]), dtype=t.dtype)
    padded[: len(t)] = t
    gathered = [torch.zeros_like(padded) for _ in sizes]
    dist.all_gather(gathered, padded)
    return torch.cat([g[: int(s.item())] for g, s in zip(gathered, sizes)])


# Logit histograms summed over workers give ROC-AUC in constant memory per worker, whatever the
# number of scored pairs: exact up to pairs whose logits fall in the same 0.001-wide bin
# (counted half, as ties are), and logits beyond +-50 (sigmoid 1 or 0 in float32 anyway).
AUC_BINS, AUC_LOGIT_RANGE = 100_000, 50.0


def score_histogram(scores: torch.Tensor) -> torch.Tensor:
    """(AUC_BINS,) int64 counts of the logits ``scores`` (m,) in equal bins over +-AUC_LOGIT_RANGE,
    on the host whatever the device of ``scores``."""
    scaled = (scores.detach().to(torch.float64) + AUC_LOGIT_RANGE) / (2 * AUC_LOGIT_RANGE) * AUC_BINS
    return torch.bincount(scaled.floor().clamp(0, AUC_BINS - 1).to(torch.int64), minlength=AUC_BINS).cpu()


def histogram_auc(positive: torch.Tensor, negative: torch.Tensor) -> float:
    """ROC-AUC from (AUC_BINS,) counts of positive and negative logits: the chance a positive
    outscores a negative, pairs in the same bin counting half."""
    pos, neg = positive.to(torch.float64), negative.to(torch.float64)
    if pos.sum() == 0 or neg.sum() == 0:
        return float("nan")
    below = torch.cumsum(neg, 0) - neg  # negatives in lower bins
    return float((pos * (below + neg / 2)).sum() / (pos.sum() * neg.sum()))
