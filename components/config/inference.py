"""Section ``infer``: what step infer does after the model has run (node classification's smoothing)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from components.config.sections import _Section

Smoothing = Literal["none", "correct_and_smooth"]
AlphaSelection = Literal["validation", "fixed"]


class InferSpec(_Section):
    """Step infer: post-processing of the class probabilities (node classification).

    correct_and_smooth is Correct & Smooth (Huang et al. 2020, "Combining Label Propagation and
    Simple Models Out-performs Graph Neural Networks"): the training nodes' residuals are spread
    over the graph and added to the predictions (correct), then the corrected predictions, with the
    training nodes clamped to their labels, are spread again (smooth). Both propagate with
    D^-1/2 A D^-1/2 over the edges the model's messages flow along, without self-loops, as PyG's
    LabelPropagation does; it runs on the partitions, each worker holding only its own nodes' rows.
    """

    smoothing: Smoothing = Field(
        "none",
        description="none: the model's predictions as they are; correct_and_smooth: Correct & Smooth after inference "
        "(node classification only; the predictions and probabilities written are the smoothed ones, and infer's "
        "metrics report the accuracies before it as *_base).",
    )
    alpha_selection: AlphaSelection = Field(
        "validation",
        description="correct_and_smooth: validation: choose, per run, among the model's own predictions and a 3 x 3 grid "
        "of published correction x smoothing alphas (components/infer/alpha_selection.py) the one with the highest "
        "accuracy on the validation split (never the test split), all candidates propagated at once; correction_alpha "
        "and smoothing_alpha are then used only where the graph has no validation nodes. fixed: use correction_alpha "
        "and smoothing_alpha as configured.",
    )
    correction_alpha: float = Field(
        0.979,
        ge=0,
        le=1,
        description="correct_and_smooth: share each step keeps of the neighbours' residuals, E <- (1-a) E0 + a A E "
        "(0.979: the paper's ogbn-arxiv setting, also DGL's C&S example default; PyG's CorrectAndSmooth has none).",
    )
    correction_steps: int = Field(
        50,
        ge=0,
        description="correct_and_smooth: propagation steps of the residuals (50: the paper's and DGL's example default).",
    )
    smoothing_alpha: float = Field(
        0.756,
        ge=0,
        le=1,
        description="correct_and_smooth: share each step keeps of the neighbours' predictions, G <- (1-a) G0 + a A G "
        "(0.756: the paper's ogbn-arxiv setting, also DGL's C&S example default).",
    )
    smoothing_steps: int = Field(
        50,
        ge=0,
        description="correct_and_smooth: propagation steps of the predictions (50: the paper's and DGL's example default).",
    )
    autoscale: bool = Field(
        True,
        description="correct_and_smooth: true: scale each node's propagated residual to the mean absolute residual "
        "of the training nodes (the paper's autoscale, PyG's default); false: add scale times the propagated "
        "residual, the training nodes' residuals held fixed at every step (the paper's fixed-scale variant, FDiff-scale).",
    )
    scale: float = Field(
        1.0,
        gt=0,
        description="correct_and_smooth with autoscale false: the factor of the propagated residual (1.0: PyG's CorrectAndSmooth default).",
    )
