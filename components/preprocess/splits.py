"""Which table the task's split applies to: the target node type (classification) or the
target edge type and its label edge tables (link prediction); every other table gets no split."""

from __future__ import annotations

from components.config import EdgeTableSpec, GnnflowConfig, SplitSpec


def node_split(config: GnnflowConfig, node_type: str) -> SplitSpec | None:
    task = config.task
    return task.split if task.type == "node_classification" and node_type == config.task_target else None


def edge_split(config: GnnflowConfig, spec: EdgeTableSpec) -> SplitSpec | None:
    task = config.task
    # Label edge tables (positive and negative pairs of the target) are split like the target.
    return task.split if task.type == "link_prediction" and (spec.name == config.task_target or spec.role != "message") else None
