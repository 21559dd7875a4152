"""Correct & Smooth (Huang et al. 2020) on one worker's rows, every propagation a collective.

Given the model's class probabilities Z of a worker's own nodes, its training nodes and their
labels Y, and Â = D^-1/2 A D^-1/2 (no self-loops, D the edges each node aggregates over, 0 for a
node without any, as PyG's ``LabelPropagation`` normalises with ``gcn_norm(add_self_loops=False)``):

1. correct: E0 = Y - Z on training nodes, 0 elsewhere; E <- (1 - a1) E0 + a1 Â E for s1 steps.
   autoscale: each step clamps E to [-1, 1]; the result is Z + s_i Ê_i with s_i = sigma / |Ê_i|_1
   and sigma the mean |E0_j|_1 over all training nodes (1 where that is infinite, undefined or
   above 1000). Fixed scale: each step resets the training rows to E0; the result is Z + scale Ê.
2. smooth: G0 = the corrected predictions with training rows set to Y; G <- (1 - a2) G0 + a2 Â G
   for s2 steps, each clamped to [0, 1].

These are PyG's ``CorrectAndSmooth`` steps (its post-step clamps included). The rows written are G
divided by their sum (a distribution again; the argmax is unchanged).

Â X needs every neighbour's row: :func:`ring_propagation` sums them over the full-graph ring
(:mod:`components.gnn.full_graph.aggregate`), each worker scaling its own rows by its own
D^-1/2 before and after, so no worker ever holds more than its rows and one fetched block.

:func:`correct_and_smooth_grid` runs several alpha pairs at once: the correction depends only on
its alpha and the smoothing on both, so the candidates' matrices sit side by side (n x A*C for A
correction alphas, n x A*S*C for the pairs), each column with its own alpha, and the ring makes
as many rounds as for one pair, over wider rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from components.config.inference import InferSpec
from components.gnn.full_graph.aggregate import aggregate
from components.gnn.full_graph.graph import FullGraph
from components.gnn.metrics import all_sum
from components.runtime import watchdog

Propagation = Callable[[torch.Tensor], torch.Tensor]  # (n, C) own rows -> (n, C) rows of Â X; collective


def ring_propagation(graph: FullGraph) -> Propagation:
    """Â X over ``graph``'s ring: D^-1/2 (sum over neighbours of D^-1/2 X); collective."""
    degree = graph.plan.degree
    norm = torch.where(degree > 0, degree.clamp(min=1).pow(-0.5), torch.zeros_like(degree)).unsqueeze(1)

    def propagate(x: torch.Tensor) -> torch.Tensor:
        return norm * aggregate(norm * x, graph.plan, "sum")

    return propagate


@dataclass(frozen=True)
class Smoothed:
    """(n, C) final scores (rows summing to 1) and the corrected predictions before smoothing."""

    probabilities: torch.Tensor
    corrected: torch.Tensor


@dataclass(frozen=True)
class SmoothedGrid:
    """Every (correction alpha, smoothing alpha) pair's result at once: ``probabilities`` (n, P, C),
    pair p = i * len(smoothing alphas) + j for correction alpha i and smoothing alpha j (rows
    summing to 1); ``corrected`` (n, len(correction alphas), C), the predictions before smoothing."""

    probabilities: torch.Tensor
    corrected: torch.Tensor


def _column_alphas(alphas: tuple[float, ...], classes: int) -> torch.Tensor:
    """(1, len(alphas) * classes): each alpha over its block of ``classes`` columns."""
    return torch.tensor(alphas, dtype=torch.float32).repeat_interleave(classes).unsqueeze(0)


def _spread(
    start: torch.Tensor, alpha: torch.Tensor, steps: int, propagate: Propagation, after_step: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """X <- (1 - alpha) X0 + alpha Â X, ``steps`` times, ``after_step`` applied to each result;
    ``alpha``: (1, columns), each column its own (the candidates side by side share each ring round)."""
    anchor = (1 - alpha) * start
    out = start
    for _ in range(steps):
        out = after_step(alpha * propagate(out) + anchor)
        watchdog.touch()
    return out


def _correct(
    probabilities: torch.Tensor,
    truth: torch.Tensor,
    train: torch.Tensor,
    propagate: Propagation,
    spec: InferSpec,
    alphas: tuple[float, ...],
) -> torch.Tensor:
    """(n, len(alphas), C): the predictions corrected with each correction alpha."""
    n, classes = probabilities.shape
    error = torch.zeros_like(probabilities)
    error[train] = truth - probabilities[train]
    start, alpha = error.repeat(1, len(alphas)), _column_alphas(alphas, classes)
    if spec.autoscale:
        spread = _spread(start, alpha, spec.correction_steps, propagate, lambda x: x.clamp_(-1.0, 1.0)).view(n, len(alphas), classes)
        # The mean residual over every worker's training nodes.
        totals = all_sum(torch.tensor([float(error[train].abs().sum()), float(len(train))], dtype=torch.float64))
        sigma = float(totals[0] / totals[1]) if totals[1] > 0 else 0.0
        scale = sigma / spread.abs().sum(dim=2, keepdim=True)
        scale[~torch.isfinite(scale) | (scale > 1000)] = 1.0  # 0 / 0 too: such a row's residual is 0
        return probabilities.unsqueeze(1) + scale * spread
    fixed = start[train]

    def hold(x: torch.Tensor) -> torch.Tensor:
        x[train] = fixed
        return x

    spread = _spread(start, alpha, spec.correction_steps, propagate, hold).view(n, len(alphas), classes)
    return probabilities.unsqueeze(1) + spec.scale * spread


@torch.no_grad()
def correct_and_smooth_grid(
    probabilities: torch.Tensor,
    labels: torch.Tensor,
    train: torch.Tensor,
    propagate: Propagation,
    spec: InferSpec,
    correction_alphas: tuple[float, ...],
    smoothing_alphas: tuple[float, ...],
) -> SmoothedGrid:
    """Correct & Smooth of one worker's (n, C) ``probabilities`` for every pair of the two alpha
    lists, in one correction pass over (n, len(correction_alphas) * C) and one smoothing pass over
    (n, pairs * C): as many ring rounds as a single pair; collective (every worker calls it, with
    its own rows). ``train``: (t,) rows of the training nodes, ``labels``: (t,) their classes."""
    probabilities = probabilities.to(torch.float32)
    n, classes = probabilities.shape
    truth = torch.nn.functional.one_hot(labels.to(torch.int64), classes).to(torch.float32)
    corrected = _correct(probabilities, truth, train, propagate, spec, correction_alphas)
    start = corrected.clone()
    start[train] = truth.unsqueeze(1)
    pairs = len(correction_alphas) * len(smoothing_alphas)
    start = start.repeat_interleave(len(smoothing_alphas), dim=1).view(n, pairs * classes)
    alpha = _column_alphas(smoothing_alphas * len(correction_alphas), classes)
    smoothed = _spread(start, alpha, spec.smoothing_steps, propagate, lambda x: x.clamp_(0.0, 1.0)).view(n, pairs, classes)
    total = smoothed.sum(dim=2, keepdim=True)
    return SmoothedGrid(torch.where(total > 0, smoothed / total.clamp(min=1e-30), smoothed), corrected)


def correct_and_smooth(
    probabilities: torch.Tensor, labels: torch.Tensor, train: torch.Tensor, propagate: Propagation, spec: InferSpec
) -> Smoothed:
    """Correct & Smooth with ``spec``'s own alphas (:func:`correct_and_smooth_grid` of one pair); collective."""
    grid = correct_and_smooth_grid(probabilities, labels, train, propagate, spec, (spec.correction_alpha,), (spec.smoothing_alpha,))
    return Smoothed(grid.probabilities[:, 0], grid.corrected[:, 0])
