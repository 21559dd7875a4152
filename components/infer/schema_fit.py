"""Whether a model fits the data of the partitions it is asked to embed: the same node types,
relations, feature columns and widths, and class vocabulary as the data it was trained on.

The model's side is the ``graph_schema.json`` that train copied from its preprocess run; the
data's side is the partitions' schema. Models published before models carried their schema
are checked as before (by rebuilding the module and loading its weights).

A feature name is ``<column>`` (numeric), ``<column>=<category>`` (one-hot) or
``<column>#<bucket>`` (hashing): a column's width is the number of names it gave.
"""

from __future__ import annotations

import re

from components import storage
from components.errors import GnnflowError
from components.schema import GraphSchema
from components.train.output import GRAPH_SCHEMA_FILE

_HASH_BUCKET = re.compile(r"^(.*)#\d+$")


def feature_column(name: str) -> str:
    """The input column a feature name came from."""
    if "=" in name:
        return name.split("=", 1)[0]
    bucket = _HASH_BUCKET.match(name)
    return bucket.group(1) if bucket else name


def column_widths(feature_names: list[str]) -> dict[str, int]:
    """Column → the number of features it gave, in the order of the features."""
    widths: dict[str, int] = {}
    for name in feature_names:
        column = feature_column(name)
        widths[column] = widths.get(column, 0) + 1
    return widths


def trained_schema(model: storage.PublishedOutput) -> GraphSchema | None:
    """The schema of the data the model was trained on (None: a model published before models carried it)."""
    if GRAPH_SCHEMA_FILE not in model.manifest.files:
        return None
    return GraphSchema.from_json(model.read_bytes(GRAPH_SCHEMA_FILE).decode(), str(model.uri(GRAPH_SCHEMA_FILE)))


def _features(what: str, trained: list[str], data: list[str]) -> str | None:
    """Why the data's features of ``what`` do not fit the trained ones (None: they do)."""
    if trained == data:
        return None
    theirs, ours = column_widths(trained), column_widths(data)
    missing = [c for c in theirs if c not in ours]
    if missing:
        extra = [c for c in ours if c not in theirs]
        instead = f" (the data has {', '.join(map(repr, extra))} instead)" if extra else ""
        return f"feature column {missing[0]!r} of {what} is missing from the data{instead}"
    extra = [c for c in ours if c not in theirs]
    if extra:
        return f"the data has feature column {extra[0]!r} of {what}, which the model was not trained with"
    for column, width in theirs.items():
        if ours[column] != width:
            return f"{what}, feature column {column!r}: the model was trained on width {width}, the data has width {ours[column]}"
    if list(theirs) != list(ours):
        return f"the feature columns of {what} come in another order ({', '.join(ours)}) than the model's ({', '.join(theirs)})"
    return f"the features of {what} are encoded otherwise (other categories) than the model's"


def misfit(trained: GraphSchema, data: GraphSchema) -> str | None:
    """Why data of schema ``data`` does not fit a model trained on ``trained`` (None: it fits)."""
    for name in trained.node_types:
        if name not in data.node_types:
            return f"node type {name!r} is gone: the model was trained on it, the data has {', '.join(map(repr, data.node_types))}"
    for name in data.node_types:
        if name not in trained.node_types:
            return f"the data has node type {name!r}, which the model was not trained on"
    for name, edge in trained.edge_types.items():
        if name not in data.edge_types:
            return f"relation {name!r} ({edge.src_type} -{edge.relation}-> {edge.dst_type}) is gone: the model was trained on it"
    for name in data.edge_types:
        if name not in trained.edge_types:
            return f"the data has relation {name!r}, which the model was not trained on"
    for name, node in trained.node_types.items():
        reason = _features(f"node type {name!r}", node.feature_names, data.node_types[name].feature_names)
        if reason:
            return reason
    for name, edge in trained.edge_types.items():
        reason = _features(f"relation {name!r}", edge.feature_names, data.edge_types[name].feature_names)
        if reason:
            return reason
    target = trained.node_types.get(trained.target)  # a node type under node classification
    if target is not None and target.label_vocabulary != data.node_types[trained.target].label_vocabulary:
        return f"the classes of {trained.target!r} differ: the model predicts {target.label_vocabulary}"
    return None


def check_model_fits(model: storage.PublishedOutput, data: GraphSchema, partitions: storage.Uri) -> None:
    """An error naming the first way the partitions' data does not fit the model."""
    trained = trained_schema(model)
    if trained is None:
        return
    reason = misfit(trained, data)
    if reason:
        raise GnnflowError(f"{model.root} does not fit the data of {partitions}: {reason}")
