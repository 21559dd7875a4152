"""The Correct & Smooth alphas ``infer.alpha_selection: validation`` chooses among (no torch:
``gnnflow plan`` sizes the stacked candidates from it).

Every value is a published Correct & Smooth setting, none chosen from this project's metrics. The
rule, fixed before any run: the smallest published value, the paper's ogbn-arxiv default
(``InferSpec``'s), and a third published value that widens the range.

Correction alphas:

- 0.0: smoothing only. With alpha 0 the correction keeps the residuals on the training rows,
  which smoothing replaces with their labels anyway, so this is the authors' setting for a GAT
  base model on ogbn-arxiv, smoothing without correction (CUAI/CorrectAndSmooth,
  run_experiments.py, ``gat_dict``; their README: "the more complex and smooth your GNN is, the
  less likely it'll be that applying the Correct portion helps").
- 0.8: DGL's Correct & Smooth example, Linear + C&S on ogbn-arxiv (``--correction-alpha 0.8
  --smoothing-alpha 0.6``), the lowest published correction alpha with autoscale.
- 0.979: the paper's ogbn-arxiv MLP setting (run_experiments.py ``mlp_dict``: 0.9791632871592579),
  DGL's example default, ``InferSpec.correction_alpha``'s default.

Smoothing alphas:

- 0.6: DGL's example, Linear + C&S on ogbn-arxiv, the lowest published.
- 0.756: the paper's ogbn-arxiv MLP setting (``mlp_dict``: 0.7564990804200602), DGL's example
  default, ``InferSpec.smoothing_alpha``'s default.
- 0.9: the paper's ogbn-products Plain and Linear settings (run_experiments.py ``plain_dict``,
  ``linear_dict``), the highest published.
"""

from __future__ import annotations

CORRECTION_ALPHAS: tuple[float, ...] = (0.0, 0.8, 0.979)
SMOOTHING_ALPHAS: tuple[float, ...] = (0.6, 0.756, 0.9)


def grid_pairs() -> list[tuple[float, float]]:
    """The (correction, smoothing) candidates in grid order: correction alpha outer, smoothing inner."""
    return [(c, s) for c in CORRECTION_ALPHAS for s in SMOOTHING_ALPHAS]
