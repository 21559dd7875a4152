"""What the predictor is asked and answers: instances, predictions, the schema requests are
checked against, and the error that names a bad instance (re-exported by :mod:`.predictor`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from components.errors import GnnflowError


@dataclass(frozen=True)
class ExistingNode:
    """A node of the stored graph, by its original id (the id of the user's table)."""

    node_type: str
    node_id: str


@dataclass(frozen=True)
class NewEdge:
    """An edge of a new node to an existing one: ``out`` is new → ``node_id``, ``in`` is
    ``node_id`` → new. ``edge_type``: a relation name or ``src__relation__dst``."""

    edge_type: str
    node_id: str
    direction: Literal["out", "in"]


@dataclass(frozen=True)
class NewNode:
    """A node the graph does not hold: its raw column values (as in the node table) and edges."""

    node_type: str
    features: Mapping[str, object]
    edges: tuple[NewEdge, ...]


Instance = ExistingNode | NewNode


@dataclass(frozen=True)
class Prediction:
    """One instance's answer; ``embedding`` is what infer writes for the node (link prediction:
    in the decoder's space, where the inner product is the score)."""

    embedding: list[float]
    label: str | None = None  # node classification, target type
    probabilities: dict[str, float] | None = None
    candidates: list[dict[str, object]] | None = None  # link prediction: [{"node_type", "node_id", "score"}], best first


class InstanceError(GnnflowError):
    """A bad instance: the HTTP layer answers 400 naming its index and field."""

    def __init__(self, index: int, field: str, message: str) -> None:
        super().__init__(f"instance {index}, {field}: {message}")
        self.index, self.field, self.message = index, field, message


@dataclass(frozen=True)
class ServingSchema:
    """What requests are validated against before ``predict``."""

    node_types: tuple[str, ...]
    edge_types: tuple[str, ...]  # names accepted in instances: src__relation__dst, and relation names that are unique
    default_node_type: str | None  # set on a homogeneous graph (node_type may be left out)
    default_edge_type: str | None
    feature_columns: dict[str, dict[str, Literal["number", "category"]]]  # node type → raw column → kind
    task_type: str
    target: str
