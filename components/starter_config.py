"""``gnnflow init-config``: a starter config proposed from table headers and a sample of rows.

Every column that is not an id, label or split becomes a feature with a transform chosen from
the sample: 0/1 columns pass through, other numbers are standardized, few-valued text is
one-hot encoded, many-valued text is hashed, and near-unique text (names, free text) is left
out. Runs of columns like ``f0..f3702`` collapse to one glob pattern.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from components import storage, tables
from components.config import (
    EdgeTableSpec,
    FeatureSpec,
    GnnflowConfig,
    GraphSpec,
    NodeTableSpec,
    OutputSpec,
    SplitSpec,
    TaskSpec,
    TaskType,
)
from components.errors import GnnflowError

ONE_HOT_MAX_VALUES = 32
HASH_BUCKETS = 64


@dataclass(frozen=True)
class ColumnChoice:
    """The transform proposed for one column, or ``None`` to leave the column out."""

    column: str
    transform: str | None
    has_missing: bool


def choose_transform(column: str, values: pa.ChunkedArray) -> ColumnChoice:
    """Proposes a transform from a sample of one column's values."""
    has_missing = values.null_count > 0
    if pa.types.is_integer(values.type) or pa.types.is_floating(values.type) or pa.types.is_boolean(values.type):
        present = values.drop_null()
        binary = len(present) > 0 and bool(pc.all(pc.is_in(present.cast(pa.float64()), pa.array([0.0, 1.0]))).as_py())
        return ColumnChoice(column, "passthrough" if binary else "standardize", has_missing)
    text = values.cast(pa.string())
    has_missing = has_missing or bool(pc.any(pc.equal(text, "")).as_py())
    distinct = len(pc.unique(text.drop_null()))
    if distinct <= ONE_HOT_MAX_VALUES:
        return ColumnChoice(column, "one_hot", has_missing)
    if distinct > 0.5 * max(len(text), 1):
        return ColumnChoice(column, None, has_missing)
    return ColumnChoice(column, "hashing", has_missing)


def _pattern_for(columns: Sequence[str], header: Sequence[str]) -> list[str]:
    """One glob when every column is ``<prefix><number>`` and the glob matches exactly them."""
    match = re.fullmatch(r"(.*?)\d+", columns[0]) if len(columns) > 2 else None
    if match:
        pattern = f"{match.group(1)}*"
        if [c for c in header if fnmatch.fnmatchcase(c, pattern)] == list(columns):
            return [pattern]
    return list(columns)


def feature_groups(choices: Sequence[ColumnChoice], header: Sequence[str]) -> list[FeatureSpec]:
    """Consecutive columns with the same choice become one group."""
    groups: list[FeatureSpec] = []
    run: list[ColumnChoice] = []
    for choice in [*choices, None]:
        if run and (choice is None or (choice.transform, choice.has_missing) != (run[0].transform, run[0].has_missing)):
            first = run[0]
            groups.append(
                FeatureSpec(
                    columns=_pattern_for([c.column for c in run], header),
                    transform=first.transform,
                    on_missing="fill" if first.has_missing else "error",
                    num_buckets=HASH_BUCKETS,
                )
            )
            run = []
        if choice is not None and choice.transform is not None:
            run.append(choice)
    return groups


def _sample(uri: str) -> tuple[list[str], pa.Table]:
    first = storage.expand_files(uri)[0]
    fmt = tables.file_format(first)
    return tables.read_header(first, fmt), tables.read_sample(first, fmt)


def _check(uri: str, header: Sequence[str], columns: Sequence[str | None]) -> None:
    tables.check_columns(storage.parse_uri(uri), header, [c for c in columns if c])


def propose_config(
    nodes: str,
    edges: str,
    *,
    id_column: str,
    src_column: str,
    dst_column: str,
    label_column: str | None = None,
    split_column: str | None = None,
    task: TaskType = "node_classification",
    node_type: str = "node",
    relation: str = "edge",
    output_root: str = "runs",
) -> GnnflowConfig:
    """A complete config for one node table and one edge table."""
    if task == "node_classification" and not label_column:
        raise GnnflowError("node_classification needs --label-column")
    node_header, node_sample = _sample(nodes)
    _check(nodes, node_header, [id_column, label_column, split_column])
    edge_header, edge_sample = _sample(edges)
    _check(edges, edge_header, [src_column, dst_column])
    reserved = {id_column, label_column, split_column}
    node_choices = [choose_transform(c, node_sample.column(c)) for c in node_header if c not in reserved]
    edge_choices = [choose_transform(c, edge_sample.column(c)) for c in edge_header if c not in (src_column, dst_column)]
    graph = GraphSpec(
        nodes=[
            NodeTableSpec(
                type=node_type,
                uri=str(storage.parse_uri(nodes)),
                id_column=id_column,
                label_column=label_column,
                split_column=split_column,
                features=feature_groups(node_choices, node_header),
            )
        ],
        edges=[
            EdgeTableSpec(
                type=relation,
                uri=str(storage.parse_uri(edges)),
                src_column=src_column,
                dst_column=dst_column,
                src_type=node_type,
                dst_type=node_type,
                features=feature_groups(edge_choices, edge_header),
            )
        ],
    )
    split = SplitSpec()
    if split_column:
        # Values the sample holds besides train/val/test are proposed as 'no split': the user
        # sees them in the config, and any other value stops preprocess (a typo, not a split).
        seen = {v if v is not None else "" for v in node_sample.column(split_column).cast(pa.string()).to_pylist()}
        others = seen - {split.train_value, split.val_value, split.test_value}
        split = SplitSpec(none_values=sorted(set(split.none_values) | others))
    return GnnflowConfig(graph=graph, task=TaskSpec(type=task, split=split), output=OutputSpec(root=output_root))


def render(config: GnnflowConfig, sources: str) -> str:
    """The YAML a user edits: a comment on where it came from, then every field."""
    return (
        f"# gnnflow config proposed by `gnnflow init-config` from {sources}.\n"
        "# Every field is shown with its value; see README.md (Configuration) for what each means.\n" + config.to_yaml()
    )
