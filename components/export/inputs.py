"""What export reads: a published infer output, its Parquet files checked against infer's contract.

Infer publishes ``embeddings/<node type>/part-*.parquet`` (``node_id`` string, ``embedding``
list of floats, and for the classification target ``prediction`` string and ``probability``
float) and, for link prediction with retrieval, ``retrieval/candidates/part-*.parquet``
(``node_id``, ``candidate_id`` strings, ``score`` float, ``rank`` integer) of the target edge's
source type. Only file footers are read here; a file that breaks the contract is an error
naming it and the column before anything is written anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from components import storage
from components.errors import GnnflowError
from components.infer.output import CANDIDATES_FOLDER, EMBEDDINGS_FOLDER
from components.infer.output import STEP as INFER_STEP

RESOLVED_CONFIG = "config.resolved.yaml"  # infer writes the config it ran with beside its shards


def _is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _is_float_list(t: pa.DataType) -> bool:
    return (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_floating(t.value_type)


# Column → (check, what the contract says): the columns of each kind of file, in infer's order.
_EMBEDDING_COLUMNS = {"node_id": (_is_string, "string"), "embedding": (_is_float_list, "list<float>")}
_PREDICTION_COLUMNS = {"prediction": (_is_string, "string"), "probability": (pa.types.is_floating, "float")}
_COLD_COLUMNS = {"cold": (pa.types.is_boolean, "bool")}  # infer's shards since models carry their id maps
_CANDIDATE_COLUMNS = {
    "node_id": (_is_string, "string"),
    "candidate_id": (_is_string, "string"),
    "score": (pa.types.is_floating, "float"),
    "rank": (pa.types.is_integer, "integer"),
}


@dataclass(frozen=True)
class ResultFiles:
    """The Parquet files of one node type and source (embedding shards or candidate shards)."""

    node_type: str
    paths: tuple[str, ...]  # relative to the infer output's generation, sorted
    columns: tuple[str, ...]  # every file's columns, in file order
    rows: int  # summed from the footers


@dataclass(frozen=True)
class InferResults:
    """A published infer output, checked (the files are listed and their footers read, no rows)."""

    output: storage.PublishedOutput
    embeddings: dict[str, ResultFiles]  # node type → its shards
    candidates: ResultFiles | None  # retrieval candidates of the target edge's source type

    @property
    def generation(self) -> str:
        return self.output.manifest.generation

    def has_predictions(self, node_type: str) -> bool:
        return "prediction" in self.embeddings[node_type].columns


def _footer(output: storage.PublishedOutput, path: str) -> tuple[pa.Schema, int]:
    uri = output.uri(path)
    try:
        with storage.open_read(uri) as stream:
            metadata = pq.ParquetFile(stream).metadata
            return metadata.schema.to_arrow_schema(), metadata.num_rows
    except (pa.ArrowInvalid, OSError) as exc:
        raise GnnflowError(f"{uri} is not a readable Parquet file: {exc}") from None


def _check_columns(uri: storage.Uri, schema: pa.Schema, expected: dict) -> None:
    for name, (fits, wanted) in expected.items():
        if name not in schema.names:
            raise GnnflowError(f"{uri} has no column {name!r} (it has {', '.join(schema.names)}): expected {wanted}")
        if not fits(schema.field(name).type):
            raise GnnflowError(f"{uri}: column {name!r} is {schema.field(name).type}, expected {wanted}")


def _files(output: storage.PublishedOutput, node_type: str, paths: list[str], kind: str) -> ResultFiles:
    """The footers of ``paths``, each checked; every file of one type must have the same columns."""
    columns: tuple[str, ...] | None = None
    rows = 0
    for path in paths:
        schema, count = _footer(output, path)
        uri = output.uri(path)
        if kind == "candidates":
            expected = _CANDIDATE_COLUMNS
        else:
            expected = {**_EMBEDDING_COLUMNS, **(_PREDICTION_COLUMNS if "prediction" in schema.names else {})}
            expected |= _COLD_COLUMNS if "cold" in schema.names else {}
        _check_columns(uri, schema, expected)
        extra = [name for name in schema.names if name not in expected]
        if extra:
            raise GnnflowError(f"{uri} has column {extra[0]!r}, which infer's {kind} files do not have")
        if columns is not None and tuple(schema.names) != columns:
            raise GnnflowError(
                f"{uri} has columns {', '.join(schema.names)}; the other {node_type!r} {kind} files have {', '.join(columns)}"
            )
        columns = tuple(schema.names)
        rows += count
    assert columns is not None  # paths is never empty
    return ResultFiles(node_type, tuple(paths), columns, rows)


def _candidate_type(output: storage.PublishedOutput) -> str:
    """The source node type of the link-prediction target, from the config infer ran with."""
    where = output.uri(RESOLVED_CONFIG)
    try:
        raw = yaml.safe_load(output.read_bytes(RESOLVED_CONFIG))
        graph, task = raw["graph"], raw.get("task") or {}
        messages = [e for e in graph["edges"] if e.get("role", "message") == "message"]
        target = task.get("target") or messages[0]["type"]
        edge = next(e for e in messages if target in (e["type"], f"{e['src_type']}__{e['type']}__{e['dst_type']}"))
        return str(edge["src_type"])
    except (yaml.YAMLError, KeyError, TypeError, IndexError, StopIteration) as exc:
        raise GnnflowError(f"{where} does not name the link-prediction target's source node type: {exc!r}") from None


def read_infer_results(uri: storage.Uri | str) -> InferResults:
    """The published infer output at ``uri``, every file's footer checked; errors name the file."""
    try:
        output = storage.open_published(uri, step=INFER_STEP)
    except GnnflowError as exc:
        raise GnnflowError(f"the embeddings: {exc}") from None
    by_type: dict[str, list[str]] = {}
    for path in output.files_under(EMBEDDINGS_FOLDER):
        parts = path.split("/")
        if len(parts) != 3 or not parts[2].endswith(".parquet"):
            raise GnnflowError(f"{output.root} lists {path!r}, not an embedding shard ({EMBEDDINGS_FOLDER}/<node type>/part-*.parquet)")
        by_type.setdefault(parts[1], []).append(path)
    if not by_type:
        raise GnnflowError(f"{output.root} lists no embedding shards ({EMBEDDINGS_FOLDER}/<node type>/part-*.parquet) in its manifest")
    embeddings = {t: _files(output, t, paths, "embeddings") for t, paths in sorted(by_type.items())}
    candidate_paths = [p for p in output.files_under(CANDIDATES_FOLDER) if p.endswith(".parquet")]
    candidates = None
    if candidate_paths:
        candidate_type = _candidate_type(output)
        if candidate_type not in embeddings:
            raise GnnflowError(f"{output.root} holds candidates of node type {candidate_type!r} but no embeddings of it")
        candidates = _files(output, candidate_type, candidate_paths, "candidates")
    return InferResults(output, embeddings, candidates)
