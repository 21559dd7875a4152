"""Sparse optimizers of embedding rows: each step touches only the rows a batch read.

``row_adagrad``: Adagrad with one accumulator per row (the mean of the row's squared gradient),
as large-scale embedding trainers use (PyTorch-BigGraph, FBGEMM, DGL): state O(rows).
``sparse_adam``: Adam's moments per element, updated lazily for the rows in a batch, with each
row's own step count for the bias correction: state O(rows × hidden) twice.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class SparseRowOptimizer(ABC):
    """Updates rows of ``table`` ((n, hidden), in place) from their summed gradients."""

    def __init__(self, table: torch.Tensor, lr: float) -> None:
        self.table, self.lr = table, lr

    @abstractmethod
    def step(self, rows: torch.Tensor, grads: torch.Tensor) -> None:
        """rows: (m,) distinct row indices; grads: (m, hidden) their gradients."""

    @abstractmethod
    def state(self) -> dict[str, torch.Tensor]:
        """The tensors that hold the optimizer's state."""

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.state().items()}

    def load_state_dict(self, saved: dict[str, torch.Tensor]) -> None:
        for name, tensor in self.state().items():
            tensor.copy_(saved[name])

    def nbytes(self) -> int:
        return sum(v.numel() * v.element_size() for v in self.state().values())


class RowAdagrad(SparseRowOptimizer):
    def __init__(self, table: torch.Tensor, lr: float, eps: float = 1e-10) -> None:
        super().__init__(table, lr)
        self.eps = eps
        self.sum = torch.zeros(table.shape[0], dtype=torch.float32)

    def step(self, rows: torch.Tensor, grads: torch.Tensor) -> None:
        accumulated = self.sum[rows] + grads.pow(2).mean(dim=1)
        self.sum[rows] = accumulated
        self.table[rows] -= self.lr * grads / (accumulated.sqrt() + self.eps).unsqueeze(1)

    def state(self) -> dict[str, torch.Tensor]:
        return {"sum": self.sum}


class SparseAdam(SparseRowOptimizer):
    def __init__(self, table: torch.Tensor, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        super().__init__(table, lr)
        self.betas, self.eps = betas, eps
        self.exp_avg = torch.zeros_like(table)
        self.exp_avg_sq = torch.zeros_like(table)
        self.steps = torch.zeros(table.shape[0], dtype=torch.int64)

    def step(self, rows: torch.Tensor, grads: torch.Tensor) -> None:
        beta1, beta2 = self.betas
        steps = self.steps[rows] + 1
        self.steps[rows] = steps
        exp_avg = self.exp_avg[rows].mul_(beta1).add_(grads, alpha=1 - beta1)
        exp_avg_sq = self.exp_avg_sq[rows].mul_(beta2).addcmul_(grads, grads, value=1 - beta2)
        self.exp_avg[rows], self.exp_avg_sq[rows] = exp_avg, exp_avg_sq
        correction1 = (1 - beta1 ** steps.to(torch.float64)).to(torch.float32).unsqueeze(1)
        correction2 = (1 - beta2 ** steps.to(torch.float64)).to(torch.float32).unsqueeze(1)
        self.table[rows] -= self.lr * (exp_avg / correction1) / ((exp_avg_sq / correction2).sqrt() + self.eps)

    def state(self) -> dict[str, torch.Tensor]:
        return {"exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq, "steps": self.steps}


OPTIMIZERS = {"row_adagrad": RowAdagrad, "sparse_adam": SparseAdam}
# Without training.embedding_learning_rate: row_adagrad's step shrinks as its accumulator grows,
# and 0.1 learnt best on validation (benchmarks/link_defaults.py --embeddings; 0.01 trailed by
# 0.019); sparse_adam takes training.learning_rate, as the dense Adam does.
DEFAULT_LEARNING_RATE = {"row_adagrad": 0.1}


def sparse_optimizer(name: str, table: torch.Tensor, lr: float) -> SparseRowOptimizer:
    return OPTIMIZERS[name](table, lr)
