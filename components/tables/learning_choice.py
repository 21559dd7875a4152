"""What a proposed run learns with: the model type, the training mode and infer's smoothing.

The options are chosen on validation accuracy over several graphs by a rule fixed before the runs
(benchmarks/init_config_models.py; figures in benchmarks/RESULTS.md), all of them homogeneous
node-classification graphs with node features. So the chosen options are proposed only for such
graphs (and smoothing wherever node classification has edges between target nodes); any other
graph gets what works everywhere: graphsage, sampled training, no smoothing. A full-graph choice
would also need a size above which the proposal falls back to sampled training (full-graph
training is one CPU step over the whole graph an epoch); none is set, since none is chosen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from components.config import GraphSpec, TaskType
from components.config.inference import Smoothing
from components.config.steps import ModelType

TrainingMode = Literal["sampled", "full_graph"]

# The options that work on every graph and task: what is proposed where a chosen option does not apply.
FALLBACK_MODEL_TYPE: ModelType = "graphsage"
FALLBACK_TRAINING_MODE: TrainingMode = "sampled"
FALLBACK_SMOOTHING: Smoothing = "none"

# Today's options, kept until the rule's runs are complete: on seed 0 (four graphs) appnp/full_graph
# led by 0.015 mean validation accuracy, by the rule's own standard a contested lead that seeds 1
# and 2 must confirm, and gcnii/full_graph was not yet measured (RESULTS, issue 40).
PROPOSED_MODEL_TYPE: ModelType = "graphsage"
PROPOSED_TRAINING_MODE: TrainingMode = "sampled"
PROPOSED_SMOOTHING: Smoothing = "none"


@dataclass(frozen=True)
class LearningChoice:
    """The model type, training mode and smoothing a proposal asks for."""

    model_type: ModelType = PROPOSED_MODEL_TYPE
    training_mode: TrainingMode = PROPOSED_TRAINING_MODE
    smoothing: Smoothing = PROPOSED_SMOOTHING


def homogeneous_with_features(graph: GraphSpec) -> bool:
    """One node type that has features and one message edge type: the graphs the choice was made on."""
    messages = [e for e in graph.edges if e.role == "message"]
    return len(graph.nodes) == 1 and len(messages) == 1 and bool(graph.nodes[0].features)


def applicable(choice: LearningChoice, graph: GraphSpec, task: TaskType, target: str) -> LearningChoice:
    """``choice`` with each option this graph and task do not allow (or were not measured on) set
    back to its fallback."""
    measured = task == "node_classification" and homogeneous_with_features(graph)
    smoothable = task == "node_classification" and any(e.role == "message" and e.src_type == e.dst_type == target for e in graph.edges)
    return LearningChoice(
        model_type=choice.model_type if measured else FALLBACK_MODEL_TYPE,
        training_mode=choice.training_mode if measured else FALLBACK_TRAINING_MODE,
        smoothing=choice.smoothing if smoothable else FALLBACK_SMOOTHING,
    )


PROPOSED = LearningChoice()
