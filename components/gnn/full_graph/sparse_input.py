"""Sparse node features for the first layer of a full-graph pass.

Bag-of-words features (CiteSeer: 3,703 binary columns, 0.9% non-zero) make the first layer's
(n, in) @ (in, hidden) product and its dropout mask the bulk of a full-graph epoch when they are
dense: on CiteSeer one worker spent 112 ms a step on the product and its weight gradient and
450 ms on a (3,327, 3,703) dropout mask, against 5 ms and 2 ms over the non-zeros alone. When the
encoder's first operation on the features is a linear map (every encoder but GraphSAGE with max
aggregation or a widening first layer), a worker whose features are mostly zero keeps them as a
CSR matrix: the product sums the same non-zero terms (only their order differs) and dropout
draws :func:`~.node_dropout.node_keep`'s masks at the non-zeros only, the same units.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from components.gnn.full_graph.node_dropout import dropout_key, node_dropout, node_keep_at

# Below this share of non-zeros the CSR product is the faster one: on CiteSeer's shapes (3,327 x
# 3,703 @ 3,703 x 64, one thread) the CSR product cost as much as the dense one at about 15%
# non-zeros (2.3 ms at 0.9%, 49 ms dense); a third of that leaves room for the gradient's
# transposed product and denser rows.
SPARSE_FEATURE_DENSITY = 0.05


def _csr(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return torch.sparse_csr_tensor(crow, col, values, size)


@dataclass(frozen=True)
class SparseFeatures:
    """(n, width) features as CSR: ``crow``/``col``/``values`` (CSR order), ``rows`` the (nnz,)
    row of each value; ``t_crow``/``t_col``/``t_order`` the transpose's CSR, its values being
    ``values[t_order]`` (for the weight gradient)."""

    crow: torch.Tensor
    col: torch.Tensor
    values: torch.Tensor
    rows: torch.Tensor
    t_crow: torch.Tensor
    t_col: torch.Tensor
    t_order: torch.Tensor
    shape: tuple[int, int]

    def with_values(self, values: torch.Tensor) -> SparseFeatures:
        return SparseFeatures(self.crow, self.col, values, self.rows, self.t_crow, self.t_col, self.t_order, self.shape)

    def matrix(self) -> torch.Tensor:
        return _csr(self.crow, self.col, self.values, self.shape)

    def transposed(self) -> torch.Tensor:
        return _csr(self.t_crow, self.t_col, self.values[self.t_order], (self.shape[1], self.shape[0]))


def sparse_features(x: torch.Tensor, max_density: float = SPARSE_FEATURE_DENSITY) -> torch.Tensor | SparseFeatures:
    """``x`` as :class:`SparseFeatures` when at most ``max_density`` of it is non-zero (and it is a
    2-D floating-point matrix), else ``x`` itself."""
    if x.dim() != 2 or not x.is_floating_point() or x.numel() == 0:
        return x
    rows, cols = torch.nonzero(x, as_tuple=True)  # row-major: CSR order
    if len(rows) > max_density * x.numel():
        return x
    n, width = x.shape
    crow = torch.zeros(n + 1, dtype=torch.int64)
    crow[1:] = torch.cumsum(torch.bincount(rows, minlength=n), 0)
    t_order = torch.argsort(cols, stable=True)  # by column, rows ascending within one
    t_crow = torch.zeros(width + 1, dtype=torch.int64)
    t_crow[1:] = torch.cumsum(torch.bincount(cols, minlength=width), 0)
    return SparseFeatures(crow, cols, x[rows, cols], rows, t_crow, rows[t_order], t_order, (n, width))


class _SparseLinear(torch.autograd.Function):
    """(n, width) sparse features @ weight.T: the weight's gradient is the transpose's product."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, x: SparseFeatures) -> torch.Tensor:
        ctx.x = x
        return x.matrix() @ weight.t().contiguous()

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        return (ctx.x.transposed() @ grad_out.contiguous()).t(), None


def linear(x: torch.Tensor | SparseFeatures, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear for dense or sparse features."""
    if not isinstance(x, SparseFeatures):
        return F.linear(x, weight, bias)
    out = _SparseLinear.apply(weight, x)
    return out + bias if bias is not None else out


def input_dropout(
    x: torch.Tensor | SparseFeatures, ids: torch.Tensor, p: float, training: bool, key: int | None, layer: int
) -> torch.Tensor | SparseFeatures:
    """:func:`~.node_dropout.node_dropout` for dense or sparse features (sparse: the same masks,
    drawn at the non-zeros; without a key, torch's generator draws them)."""
    if not isinstance(x, SparseFeatures):
        return node_dropout(x, ids, p, training, key, layer)
    if not training or p == 0:
        return x
    if key is None:
        return x.with_values(F.dropout(x.values, p, training=True))
    keep = node_keep_at(ids, x.rows, x.col, x.shape[1], dropout_key(key, layer), p)
    return x.with_values(x.values * (keep.to(x.values.dtype) * (1 / (1 - p))))
