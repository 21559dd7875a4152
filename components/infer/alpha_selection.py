"""``infer.alpha_selection``: which Correct & Smooth result a worker writes, chosen on validation.

With ``validation`` the candidates are the model's own predictions ("none") and every pair of
:mod:`.alpha_grid`, all propagated at once (:func:`~components.infer.smoothing.correct_and_smooth_grid`).
Each is scored by its correct validation predictions summed over every worker; the most wins, a
tie going to "none" first, then to the earlier pair in grid order. Only the training labels (to
correct and clamp) and the validation labels (to score) enter: the function never receives the
test nodes' labels, so the test split plays no part in the choice. Without validation nodes in the
whole graph (an inference-only run on fresh tables without a val split) the configured alphas are
used, as with ``fixed``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from components.config.inference import InferSpec
from components.gnn.metrics import all_sum
from components.infer.alpha_grid import CORRECTION_ALPHAS, SMOOTHING_ALPHAS, grid_pairs
from components.infer.smoothing import Propagation, correct_and_smooth, correct_and_smooth_grid
from components.schema import NO_LABEL, SPLIT_CODES

Pair = tuple[float, float]  # (correction alpha, smoothing alpha)
NO_VALIDATION = "fixed (no validation nodes)"


@dataclass(frozen=True)
class Selection:
    """The chosen (n, C) ``probabilities``; ``selected``: its pair, None for the model's own;
    ``how``: validation, fixed, or :data:`NO_VALIDATION`; ``candidates``: each candidate's
    validation accuracy (validation only, "none" first, then grid order)."""

    probabilities: torch.Tensor
    selected: Pair | None
    how: str
    candidates: tuple[tuple[Pair | None, float], ...] = ()

    def metrics(self) -> dict[str, object]:
        """``smoothing_alpha_selection``, ``smoothing_selected`` and ``smoothing_candidates`` for metrics.json."""
        return {
            "smoothing_alpha_selection": self.how,
            "smoothing_selected": describe(self.selected),
            "smoothing_candidates": [{"candidate": describe(pair), "val_accuracy": accuracy} for pair, accuracy in self.candidates],
        }


def describe(pair: Pair | None) -> object:
    """ "none", or {"correction_alpha": a, "smoothing_alpha": b}."""
    return "none" if pair is None else {"correction_alpha": pair[0], "smoothing_alpha": pair[1]}


def choose(correct: list[int]) -> int:
    """The index of the most correct candidate, the earliest on a tie (candidate 0 is "none")."""
    best = 0
    for index, count in enumerate(correct):
        if count > correct[best]:
            best = index
    return best


def labelled_rows(labels: torch.Tensor, splits: torch.Tensor, split: str) -> torch.Tensor:
    """(r,) rows of the labelled nodes of ``split``."""
    return torch.nonzero((splits == SPLIT_CODES[split]) & (labels != NO_LABEL)).reshape(-1)


def smooth_and_select(base: torch.Tensor, labels: torch.Tensor, splits: torch.Tensor, propagate: Propagation, spec: InferSpec) -> Selection:
    """Correct & Smooth of one worker's (n, C) ``base`` under ``spec.alpha_selection``; collective.
    ``labels``, ``splits``: (n,) its rows' classes and split codes; only the train and val rows'
    labels are read."""
    train, val = labelled_rows(labels, splits, "train"), labelled_rows(labels, splits, "val")
    train_labels, val_labels = labels[train], labels[val]  # the test rows' labels stop here
    val_total = int(all_sum(torch.tensor([len(val)], dtype=torch.int64))[0])
    if spec.alpha_selection == "fixed" or not val_total:
        smoothed = correct_and_smooth(base, train_labels, train, propagate, spec).probabilities
        how = "fixed" if spec.alpha_selection == "fixed" else NO_VALIDATION
        return Selection(smoothed, (spec.correction_alpha, spec.smoothing_alpha), how)
    grid = correct_and_smooth_grid(base, train_labels, train, propagate, spec, CORRECTION_ALPHAS, SMOOTHING_ALPHAS)
    truth = val_labels.to(torch.int64)
    own = [int((base[val].argmax(1) == truth).sum())]
    own += (grid.probabilities[val].argmax(2) == truth.unsqueeze(1)).sum(0).tolist()
    correct = [int(c) for c in all_sum(torch.tensor(own, dtype=torch.int64))]
    candidates: list[Pair | None] = [None, *grid_pairs()]
    best = choose(correct)
    chosen = base.to(torch.float32) if best == 0 else grid.probabilities[:, best - 1].contiguous()
    accuracies = tuple((pair, count / val_total) for pair, count in zip(candidates, correct, strict=True))
    return Selection(chosen, candidates[best], "validation", accuracies)
