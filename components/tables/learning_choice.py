"""What a proposed run learns with: the model type, the training mode, infer's smoothing and the regularisation.

The options are chosen on validation accuracy over several graphs by a rule fixed before the runs
(benchmarks/init_config_models.py; figures in benchmarks/RESULTS.md), all of them homogeneous
node-classification graphs with node features. So the chosen options are proposed only for such
graphs (and smoothing wherever node classification has edges between target nodes); any other
graph gets what works everywhere: graphsage, sampled training, no smoothing.

Full-graph training holds every row of a worker's partition at once, with one activation and
its gradient per layer or propagation step, and the choices were measured on graphs of 1,500 to
3,327 nodes. So a full-graph choice is proposed only where its predicted memory per worker
(:func:`full_graph_bytes_per_row` times the worker's share of the nodes) stays within
:data:`FULL_GRAPH_WORKER_BYTES`; a larger graph gets the fallback model and mode together, since
the rule chose model and mode as one (appnp trained sampled measured worst of all six).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from components.config import GraphSpec, TaskType
from components.config.inference import Smoothing
from components.config.steps import ModelSpec, ModelType, TrainingSpec
from components.tables.row_counts import count_table, feature_width

TrainingMode = Literal["sampled", "full_graph"]
WeightDecayScope = Literal["all", "input_layer"]


@dataclass(frozen=True)
class Regularisation:
    """What weight decay applies to and how much, and the MLP depth (appnp's ``model.num_layers``;
    None: the model's own default; other types keep theirs, a stack's depth or gcnii's layers)."""

    weight_decay_scope: WeightDecayScope
    weight_decay: float
    num_layers: int | None = None

    def model_fields(self, model_type: ModelType) -> dict[str, int]:
        """The ``model`` section's values it sets for ``model_type`` (none where it keeps its default depth)."""
        return {"num_layers": self.num_layers} if self.num_layers is not None and model_type == "appnp" else {}


# The options that work on every graph and task: what is proposed where a chosen option does not apply.
FALLBACK_MODEL_TYPE: ModelType = "graphsage"
FALLBACK_TRAINING_MODE: TrainingMode = "sampled"
FALLBACK_SMOOTHING: Smoothing = "none"
FALLBACK_REGULARISATION = Regularisation(TrainingSpec().weight_decay_scope, TrainingSpec().weight_decay)

# The rule's outcome over four graphs and seeds 0-2 (benchmarks/init_config_models.py; RESULTS, issue
# 40): appnp/full_graph, the cheapest within 0.005 mean validation accuracy of gcnii/full_graph (and
# 0.014 over graphsage/sampled), and no smoothing (Correct & Smooth added 0.0013, within the margin).
PROPOSED_MODEL_TYPE: ModelType = "appnp"
PROPOSED_TRAINING_MODE: TrainingMode = "full_graph"
PROPOSED_SMOOTHING: Smoothing = "none"
# Step 4 of the rule, on appnp/full_graph (benchmarks/init_config_regularisation.py; RESULTS): the
# APPNP paper's recipe, weight decay 5e-3 on the input layer only and one hidden layer, mean
# validation accuracy 0.8956 against 0.8884 with 5e-4 on every parameter and two layers; 5e-2 on the
# input layer scored 0.8968, within the margin.
PROPOSED_REGULARISATION = Regularisation("input_layer", 5e-3, 1)

# A full-graph worker's budget for its rows' features and activations: a quarter of the default
# train replica's memory (n1-standard-8, 30 GB), which leaves the rest to the process itself, its
# peer blocks (training.full_graph_block_rows) and the partition's edges. With the proposal's
# appnp (64 wide, 1 layer, 10 steps) and 128 features that is about 1.1 million rows a worker.
FULL_GRAPH_WORKER_BYTES = 7.5 * 2**30
FLOAT32 = 4
COUNT_EXACT_UP_TO = 64 << 20  # as the checks before a run count: larger CSV files are estimated from their start


@dataclass(frozen=True)
class LearningChoice:
    """The model type, training mode, smoothing and regularisation a proposal asks for (the
    regularisation was chosen for the proposed model type and mode)."""

    model_type: ModelType = PROPOSED_MODEL_TYPE
    training_mode: TrainingMode = PROPOSED_TRAINING_MODE
    smoothing: Smoothing = PROPOSED_SMOOTHING
    regularisation: Regularisation = PROPOSED_REGULARISATION


def homogeneous_with_features(graph: GraphSpec) -> bool:
    """One node type that has features and one message edge type: the graphs the choice was made on."""
    messages = [e for e in graph.edges if e.role == "message"]
    return len(graph.nodes) == 1 and len(messages) == 1 and bool(graph.nodes[0].features)


def full_graph_bytes_per_row(feature_width: int, model: ModelSpec) -> int:
    """Bytes one node costs a full-graph worker: its features, and per layer or propagation step (and
    the task's head and input) one ``hidden_channels`` activation kept for backward plus its gradient."""
    steps = model.num_layers + (model.propagation_steps if model.type == "appnp" else 0) + 2
    return FLOAT32 * (feature_width + 2 * model.hidden_channels * steps)


def full_graph_fits(nodes: float, world_size: int, feature_width: int, model: ModelSpec, budget: float = FULL_GRAPH_WORKER_BYTES) -> bool:
    """Whether a worker's share of ``nodes`` rows fits ``budget`` bytes in full-graph training."""
    return nodes / world_size * full_graph_bytes_per_row(feature_width, model) <= budget


def fits_full_graph(choice: LearningChoice, graph: GraphSpec, task: TaskType, target: str, hidden_channels: int, world_size: int) -> bool:
    """Whether the target's nodes fit full-graph training on ``world_size`` workers; True where the
    choice cannot train full-graph anyway (counted from the files' footers or newlines, a CSV file
    over COUNT_EXACT_UP_TO bytes estimated from its start, a BigQuery table from its metadata)."""
    if choice.training_mode != "full_graph" or task != "node_classification":
        return True
    table = next(n for n in graph.nodes if n.type == target)
    width, _ = feature_width(table)
    model = ModelSpec(type=choice.model_type, hidden_channels=hidden_channels)
    rows = count_table(table, exact_up_to=COUNT_EXACT_UP_TO).rows
    return full_graph_fits(rows, world_size, width, model, FULL_GRAPH_WORKER_BYTES)


def applicable(choice: LearningChoice, graph: GraphSpec, task: TaskType, target: str, *, fits_full_graph: bool = True) -> LearningChoice:
    """``choice`` with each option this graph and task do not allow (or were not measured on) set
    back to its fallback; ``fits_full_graph`` False: the graph is too large for full-graph training,
    so a full-graph choice falls back to the fallback model and mode."""
    measured = task == "node_classification" and homogeneous_with_features(graph)
    if choice.training_mode == "full_graph" and not fits_full_graph:
        measured = False
    smoothable = task == "node_classification" and any(e.role == "message" and e.src_type == e.dst_type == target for e in graph.edges)
    return LearningChoice(
        model_type=choice.model_type if measured else FALLBACK_MODEL_TYPE,
        training_mode=choice.training_mode if measured else FALLBACK_TRAINING_MODE,
        smoothing=choice.smoothing if smoothable else FALLBACK_SMOOTHING,
        regularisation=choice.regularisation if measured else FALLBACK_REGULARISATION,
    )


PROPOSED = LearningChoice()
FALLBACK = LearningChoice(FALLBACK_MODEL_TYPE, FALLBACK_TRAINING_MODE, FALLBACK_SMOOTHING, FALLBACK_REGULARISATION)
