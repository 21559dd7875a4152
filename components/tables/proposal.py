"""``gnnflow init-config``: a starter config proposed from table headers and a sample of rows.

Every column that is not an id, label or split becomes a feature with a transform chosen from
the sample: 0/1 columns pass through, other numbers are standardized, few-valued text is
one-hot encoded, many-valued text is hashed, and near-unique text (names, free text) is left
out. Runs of columns like ``f0..f3702`` collapse to one glob pattern. Any number of typed node
and edge tables can be given (a heterogeneous graph; node types without feature columns get
learnt embeddings), with the task's target node type or relation.

Epochs and early-stopping patience are sized from the target's training rows (labelled nodes,
or edges; counted until there are enough): an epoch over a small label set is a single
optimizer step, so the per-epoch defaults would stop long before the model has learnt. The
constants below were chosen on validation accuracy over several graphs.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from components import storage
from components.config import (
    EdgeTableSpec,
    FeatureSpec,
    GnnflowConfig,
    GraphSpec,
    ModelSpec,
    NodeTableSpec,
    OutputSpec,
    PreprocessSpec,
    ResourcesSpec,
    SplitSpec,
    TaskSpec,
    TaskType,
    TrainingSpec,
)
from components.config.inference import InferSpec
from components.errors import GnnflowError
from components.tables import reading as tables
from components.tables.bigquery_tables import bigquery_chunks, read_bigquery_header_and_sample, start_table_read
from components.tables.learning_choice import PROPOSED, LearningChoice, applicable, fits_full_graph
from components.warehouse.table_ref import is_bigquery_uri, parse_table_uri

ONE_HOT_MAX_VALUES = 32
HASH_BUCKETS = 64
MULTI_HOT_MIN_COLUMNS = 16
MULTI_HOT_MAX_DENSITY = 0.1
# The three constants below decide what a proposed run learns. Each was chosen on validation
# accuracy over four graphs and three seeds (CiteSeer, the demo generator and two planted-structure
# variants of it; benchmarks/init_config_constants.py, figures in benchmarks/RESULTS.md), by one
# rule: the best mean, or a cheaper value within 0.005 of it.
#
# A proposed run takes at least this many optimizer steps before it ends or early stopping may
# end it (100 steps lose 0.006 mean validation accuracy, 400 gain nothing).
MIN_OPTIMIZER_STEPS = 200
# Layer width: ModelSpec's default. 128 was 0.0036 better on the mean (CiteSeer 0.010), within
# the margin, at twice the cost of every layer.
PROPOSED_HIDDEN_CHANNELS = 64
# Whether wide sparse 0/1 runs (a multi-hot vector: at least MULTI_HOT_MIN_COLUMNS columns, at
# most MULTI_HOT_MAX_DENSITY ones) are row-normalised. Off: it helped CiteSeer's validation
# accuracy (+0.021) and cost the planted graphs more (few labels -0.083, weak homophily -0.014);
# the mean is 0.019 better without it. It stays here as an option for that benchmark.
ROW_NORMALIZE_MULTI_HOT = False


@dataclass(frozen=True)
class ColumnChoice:
    """The transform proposed for one column, or ``None`` to leave the column out."""

    column: str
    transform: str | None
    has_missing: bool
    ones_fraction: float = 0.0


def choose_transform(column: str, values: pa.ChunkedArray) -> ColumnChoice:
    """Proposes a transform from a sample of one column's values."""
    has_missing = values.null_count > 0
    if pa.types.is_integer(values.type) or pa.types.is_floating(values.type) or pa.types.is_boolean(values.type):
        present = values.drop_null()
        numbers = present.cast(pa.float64())
        binary = len(present) > 0 and bool(pc.all(pc.is_in(numbers, pa.array([0.0, 1.0]))).as_py())
        if not binary:
            return ColumnChoice(column, "standardize", has_missing)
        return ColumnChoice(column, "passthrough", has_missing, ones_fraction=pc.mean(numbers).as_py())
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


def _group_transform(run: Sequence[ColumnChoice], row_normalize_multi_hot: bool) -> str:
    transform = run[0].transform
    assert transform is not None
    density = sum(c.ones_fraction for c in run) / len(run)
    multi_hot = len(run) >= MULTI_HOT_MIN_COLUMNS and density <= MULTI_HOT_MAX_DENSITY
    if transform == "passthrough" and multi_hot and row_normalize_multi_hot:
        return "row_normalize"
    return transform


def feature_groups(
    choices: Sequence[ColumnChoice], header: Sequence[str], row_normalize_multi_hot: bool = ROW_NORMALIZE_MULTI_HOT
) -> list[FeatureSpec]:
    """Consecutive columns with the same choice become one group."""
    groups: list[FeatureSpec] = []
    run: list[ColumnChoice] = []
    for choice in [*choices, None]:
        if run and (choice is None or (choice.transform, choice.has_missing) != (run[0].transform, run[0].has_missing)):
            first = run[0]
            groups.append(
                FeatureSpec(
                    columns=_pattern_for([c.column for c in run], header),
                    transform=_group_transform(run, row_normalize_multi_hot),
                    on_missing="fill" if first.has_missing else "error",
                    num_buckets=HASH_BUCKETS,
                )
            )
            run = []
        if choice is not None and choice.transform is not None:
            run.append(choice)
    return groups


SAMPLE_ROWS = 1000


def _sample(uri: str) -> tuple[list[str], pa.Table]:
    """The header and the first rows: of the first file, or of a ``bq://`` table (its schema, one read stream)."""
    if is_bigquery_uri(uri):
        return read_bigquery_header_and_sample(uri, SAMPLE_ROWS)
    first = storage.expand_files(uri)[0]
    fmt = tables.file_format(first)
    return tables.read_header(first, fmt), tables.read_sample(first, fmt, SAMPLE_ROWS)


def _check(uri: str, header: Sequence[str], columns: Sequence[str | None]) -> None:
    where = parse_table_uri(uri) if is_bigquery_uri(uri) else storage.parse_uri(uri)
    tables.check_columns(where, header, [c for c in columns if c])


def _canonical(uri: str) -> str:
    return str(parse_table_uri(uri)) if is_bigquery_uri(uri) else str(storage.parse_uri(uri))


def count_training_rows(
    uri: str, label_column: str | None, split_column: str | None, split: SplitSpec, reading: PreprocessSpec, *, enough: int
) -> float:
    """Training rows of a node table (labelled ones) or an edge table (every row), counted file by
    file until ``enough``: rows whose split column holds ``split.train_value``, or all of them times
    the random split's training fraction."""
    columns = {c: pa.string() for c in (label_column, split_column) if c}
    share = 1.0 if split_column else split.train
    chunks: Iterator[tables.TableChunk]
    if is_bigquery_uri(uri) and not columns:  # every row counts: the table's metadata has their number
        from components.warehouse.reading import table_metadata

        return share * (table_metadata(parse_table_uri(uri)).num_rows or 0)
    if is_bigquery_uri(uri):
        chunks = bigquery_chunks(start_table_read(parse_table_uri(uri), list(columns), None), columns, (), reading.parquet_batch_rows)
    else:
        files = storage.expand_files(uri)
        chunks = tables.iter_chunks(
            files, columns or None, tables.file_format(files[0]), block_bytes=reading.csv_block_bytes, batch_rows=reading.parquet_batch_rows
        )
    count = 0.0
    for chunk in chunks:
        keep = pa.array(np.ones(chunk.table.num_rows, dtype=bool))
        if label_column:
            keep = pc.and_(keep, pc.fill_null(pc.not_equal(chunk.table.column(label_column), ""), False))
        if split_column:
            keep = pc.and_(keep, pc.fill_null(pc.equal(chunk.table.column(split_column), split.train_value), False))
        count += share * (pc.sum(pc.cast(keep, pa.int64())).as_py() or 0)
        if count >= enough:
            break
    return count


def size_epochs(training_rows: float, training: TrainingSpec, world_size: int, min_steps: int = MIN_OPTIMIZER_STEPS) -> TrainingSpec:
    """``training`` with epochs and patience raised so that a run takes at least ``min_steps``
    optimizer steps, early stopping included (full-graph training takes one step an epoch)."""
    steps_per_epoch = 1 if training.mode == "full_graph" else max(1, math.ceil(training_rows / (training.batch_size * world_size)))
    epochs = max(training.epochs, math.ceil(min_steps / steps_per_epoch))
    patience = training.early_stopping_patience
    if patience is not None:
        patience = max(patience, math.ceil(min_steps / steps_per_epoch))
    return training.model_copy(update={"epochs": epochs, "early_stopping_patience": patience})


def rows_keeping_defaults(training: TrainingSpec, world_size: int, min_steps: int = MIN_OPTIMIZER_STEPS) -> int:
    """Training rows from which :func:`size_epochs` leaves both epochs and patience as they are."""
    shortest = min(training.epochs, training.early_stopping_patience or training.epochs)
    return math.ceil(min_steps / shortest) * training.batch_size * world_size


@dataclass(frozen=True)
class NodeTable:
    """One node table to propose for: its type, where it is, and its id (label, split) columns."""

    type: str
    uri: str
    id_column: str
    label_column: str | None = None
    split_column: str | None = None


@dataclass(frozen=True)
class EdgeTable:
    """One edge table: its relation, where it is, its endpoint columns and their node types."""

    relation: str
    uri: str
    src_column: str
    dst_column: str
    src_type: str
    dst_type: str


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
    hidden_channels: int = PROPOSED_HIDDEN_CHANNELS,
    min_optimizer_steps: int = MIN_OPTIMIZER_STEPS,
    row_normalize_multi_hot: bool = ROW_NORMALIZE_MULTI_HOT,
    choice: LearningChoice = PROPOSED,
) -> GnnflowConfig:
    """A complete config for one node table and one edge table (``hidden_channels``,
    ``min_optimizer_steps``, ``row_normalize_multi_hot`` and ``choice``: the proposal's constants,
    varied by benchmarks/init_config_constants.py and benchmarks/init_config_models.py)."""
    return propose_graph_config(
        [NodeTable(node_type, nodes, id_column, label_column, split_column)],
        [EdgeTable(relation, edges, src_column, dst_column, node_type, node_type)],
        task=task,
        output_root=output_root,
        hidden_channels=hidden_channels,
        min_optimizer_steps=min_optimizer_steps,
        row_normalize_multi_hot=row_normalize_multi_hot,
        choice=choice,
    )


def _check_tables(nodes: Sequence[NodeTable], edges: Sequence[EdgeTable], task: TaskType, target: str | None) -> str:
    """The task's target (node type or relation), after the tables' types are checked to fit together."""
    types = [n.type for n in nodes]
    relations = [e.relation for e in edges]
    for kind, names in (("node type", types), ("relation", relations)):
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise GnnflowError(f"init-config: {kind} {repeated[0]!r} is given twice")
    for edge in edges:
        for end in (edge.src_type, edge.dst_type):
            if end not in types:
                raise GnnflowError(f"init-config: relation {edge.relation!r} names node type {end!r}, which no --nodes table has")
    candidates = types if task == "node_classification" else relations
    if target is None:
        if len(candidates) > 1:
            what = "node type" if task == "node_classification" else "relation"
            raise GnnflowError(f"init-config: {task} over several types needs --target, the {what}: one of {candidates}")
        target = candidates[0]
    if target not in candidates:
        raise GnnflowError(f"init-config: --target {target!r} is not one of {candidates}")
    if task == "node_classification" and not next(n for n in nodes if n.type == target).label_column:
        raise GnnflowError("node_classification needs --label-column")
    return target


def propose_graph_config(
    nodes: Sequence[NodeTable],
    edges: Sequence[EdgeTable],
    *,
    task: TaskType = "node_classification",
    target: str | None = None,
    output_root: str = "runs",
    hidden_channels: int = PROPOSED_HIDDEN_CHANNELS,
    min_optimizer_steps: int = MIN_OPTIMIZER_STEPS,
    row_normalize_multi_hot: bool = ROW_NORMALIZE_MULTI_HOT,
    choice: LearningChoice = PROPOSED,
) -> GnnflowConfig:
    """A complete config for any number of typed node and edge tables: a transform per column,
    the task's target, the model, training mode and smoothing of ``choice`` where the graph allows
    them, and epochs sized from the target's training rows (labelled nodes, or edges)."""
    target = _check_tables(nodes, edges, task, target)
    node_specs, samples = [], {}
    for node in nodes:
        header, sample = _sample(node.uri)
        _check(node.uri, header, [node.id_column, node.label_column, node.split_column])
        samples[node.type] = sample
        reserved = {node.id_column, node.label_column, node.split_column}
        choices = [choose_transform(c, sample.column(c)) for c in header if c not in reserved]
        node_specs.append(
            NodeTableSpec(
                type=node.type,
                uri=_canonical(node.uri),
                id_column=node.id_column,
                label_column=node.label_column,
                split_column=node.split_column,
                features=feature_groups(choices, header, row_normalize_multi_hot),
            )
        )
    edge_specs = []
    for edge in edges:
        header, sample = _sample(edge.uri)
        _check(edge.uri, header, [edge.src_column, edge.dst_column])
        choices = [choose_transform(c, sample.column(c)) for c in header if c not in (edge.src_column, edge.dst_column)]
        edge_specs.append(
            EdgeTableSpec(
                type=edge.relation,
                uri=_canonical(edge.uri),
                src_column=edge.src_column,
                dst_column=edge.dst_column,
                src_type=edge.src_type,
                dst_type=edge.dst_type,
                features=feature_groups(choices, header, row_normalize_multi_hot),
            )
        )
    split = SplitSpec()
    labelled = next((n for n in nodes if n.type == target), None) if task == "node_classification" else None
    if labelled is not None and labelled.split_column:
        # Values the sample holds besides train/val/test are proposed as 'no split': the user
        # sees them in the config, and any other value stops preprocess (a typo, not a split).
        column = samples[labelled.type].column(labelled.split_column).cast(pa.string())
        seen = {v if v is not None else "" for v in column.to_pylist()}
        others = seen - {split.train_value, split.val_value, split.test_value}
        split = SplitSpec(none_values=sorted(set(split.none_values) | others))
    several = len(nodes) > 1 or len(edges) > 1
    graph = GraphSpec(nodes=node_specs, edges=edge_specs)
    fits = fits_full_graph(choice, graph, task, target, hidden_channels, ResourcesSpec().world_size)
    chosen = applicable(choice, graph, task, target, fits_full_graph=fits)
    config = GnnflowConfig(
        graph=graph,
        task=TaskSpec(type=task, target=target if several else None, split=split),
        model=ModelSpec(type=chosen.model_type, hidden_channels=hidden_channels, **chosen.regularisation.model_fields(chosen.model_type)),
        training=TrainingSpec(
            mode=chosen.training_mode,
            weight_decay=chosen.regularisation.weight_decay,
            weight_decay_scope=chosen.regularisation.weight_decay_scope,
        ),
        infer=InferSpec(smoothing=chosen.smoothing),
        output=OutputSpec(root=output_root),
    )
    enough = rows_keeping_defaults(config.training, config.resources.world_size, min_optimizer_steps)
    if labelled is not None:
        training_rows = count_training_rows(
            labelled.uri, labelled.label_column, labelled.split_column, split, config.preprocess, enough=enough
        )
    else:
        target_edges = next(e for e in edges if e.relation == target)
        training_rows = count_training_rows(target_edges.uri, None, None, split, config.preprocess, enough=enough)
    training = size_epochs(training_rows, config.training, config.resources.world_size, min_optimizer_steps)
    return config.model_copy(update={"training": training})


def render(config: GnnflowConfig, sources: str) -> str:
    """The YAML a user edits: a comment on where it came from, then every field."""
    exact = (
        "# training.mode is full_graph: infer computes the same way, exactly (`--infer-mode auto`, the default, picks exact).\n"
        if config.training.mode == "full_graph"
        else ""
    )
    return (
        f"# gnnflow config proposed by `gnnflow init-config` from {sources}.\n"
        "# Every field is shown with its value; see README.md (Configuration) for what each means.\n" + exact + config.to_yaml()
    )
