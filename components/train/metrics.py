"""Metrics over all workers: counts and scores are reduced across ranks, never rank 0's alone."""

from __future__ import annotations

import torch
import torch.distributed as dist


def confusion_matrix(pred: torch.Tensor, target: torch.Tensor, num_classes: int) -> torch.Tensor:
    """(num_classes, num_classes) int64 counts, rows: true class, columns: predicted class."""
    index = target.to(torch.int64) * num_classes + pred.to(torch.int64)
    return torch.bincount(index, minlength=num_classes * num_classes).reshape(num_classes, num_classes)


def all_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum of ``t`` over every worker (``t`` unchanged when there is no process group)."""
    if dist.is_initialized():
        t = t.clone()
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


def roc_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve: the chance a positive outscores a negative (ties count half)."""
    scores = scores.to(torch.float64)
    pos, neg = int(labels.sum()), int((1 - labels).sum())
    if pos == 0 or neg == 0:
        return float("nan")
    order = torch.argsort(scores)
    ranks = torch.empty_like(scores)
    sorted_scores = scores[order]
    # Average ranks over ties so equal scores split the credit.
    _, inverse, counts = torch.unique_consecutive(sorted_scores, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).to(torch.float64)
    average = ends - (counts.to(torch.float64) - 1) / 2
    ranks[order] = average[inverse]
    return float((ranks[labels.bool()].sum() - pos * (pos + 1) / 2) / (pos * neg))


def ranking_metrics(positive: torch.Tensor, negatives: torch.Tensor, ks: tuple[int, ...] = (10, 50)) -> dict[str, float]:
    """positive: (m,) scores; negatives: (m, k) scores of sampled negatives for the same source.

    The rank of a positive is 1 + the negatives scoring at least as high (pessimistic on ties).
    """
    if len(positive) == 0:
        return {"mrr": float("nan"), **{f"hits@{k}": float("nan") for k in ks}}
    rank = 1 + (negatives >= positive[:, None]).sum(dim=1).to(torch.float64)
    return {"mrr": float((1 / rank).mean()), **{f"hits@{k}": float((rank <= k).to(torch.float64).mean()) for k in ks}}
