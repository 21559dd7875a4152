"""What one node or edge type's TFRecords hold, and encoding a Parquet batch into them.

A record carries only what a reader cannot know without it:

- ``features`` is absent when the type has none (an empty list per record cost 16 bytes);
- an int column whose value is the same in every row by construction (``split`` of a type with
  no split: every row is ``NO_SPLIT``, a 10-byte varint) is absent too, and the layout names it
  under ``constant`` with its value;
- a type whose ``feature_storage`` is not float32 gets its rows encoded by the type's
  :class:`~components.feature_storage.codec.FeatureCodec` here, once, and written as one
  ``bytes_list`` value per record: the row's stored values, little-endian (bfloat16 as its raw
  2-byte bits), marked ``"features_encoding": "stored_bytes"``. Values the stored type cannot
  hold are clipped here and counted for the log; later steps read the stored rows as they are.

The layout is the ``record_format`` entry of ``graph_metadata.json``::

    {"int64": {key: width}, "float": {"features": d} | {},
     ["features_encoding": "stored_bytes",] ["constant": {key: value},]}

``float`` gives the feature width in values, whatever the encoding: with ``stored_bytes`` a
record's value holds ``d * bytes per stored value`` bytes. Outputs of older releases have
neither marker (every key in every record, features as float32): readers treat the absent keys
as an empty ``constant`` and float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from components.errors import GnnflowError
from components.schema import NO_SPLIT
from components.serialize.output import STORED_BYTES
from components.tfrecord import encode_examples

if TYPE_CHECKING:
    from components.feature_storage.codec import FeatureCodec


@dataclass(frozen=True)
class RecordLayout:
    """The keys of one type's records and how its features are written."""

    int_columns: list[str]  # written per record; "edge_id" is the row's position in its type
    dim: int  # features per row (0: no ``features`` key)
    codec: FeatureCodec | None = None  # set: features written as stored bytes of this codec
    constants: dict[str, int] = field(default_factory=dict)  # int columns left out, with their one value

    @property
    def record_format(self) -> dict[str, Any]:
        layout: dict[str, Any] = {"int64": {c: 1 for c in self.int_columns}, "float": {"features": self.dim} if self.dim else {}}
        if self.codec is not None:
            layout["features_encoding"] = STORED_BYTES
        if self.constants:
            layout["constant"] = dict(self.constants)
        return layout


def record_layout(int_columns: Sequence[str], dim: int, entity: Any, split_sizes: dict[str, int], source: str) -> RecordLayout:
    """The layout of a schema type (``entity``: its node or edge type schema) whose records would
    hold ``int_columns`` and ``dim`` features. Preprocess writes ``split_sizes`` empty exactly when
    the type has no split, every row then being ``NO_SPLIT``."""
    constants = {} if split_sizes else {"split": NO_SPLIT}
    codec = None
    if dim and entity.feature_storage != "float32":
        from components.feature_storage.codec import codec_of  # noqa: PLC0415 - torch, only for types that need it

        codec = codec_of(entity, source)
    return RecordLayout([c for c in int_columns if c not in constants], dim, codec, constants)


def _features(batch: pa.RecordBatch, dim: int) -> np.ndarray:
    """(rows, dim) float32 from a fixed-size-list column."""
    column = batch.column(batch.schema.get_field_index("features"))
    values = column.flatten().to_numpy(zero_copy_only=False).reshape(batch.num_rows, dim)  # flatten honours slices
    return np.ascontiguousarray(values, dtype=np.float32)  # what the stored type is encoded from, as partition did


def _stored(codec: FeatureCodec, rows: np.ndarray) -> tuple[np.ndarray, int]:
    """float32 rows → (their stored values as a numpy array, bfloat16 as raw int16 bits; values clipped)."""
    import torch  # noqa: PLC0415 - only with a codec, which imported it already

    stored, clipped = codec.encode(torch.from_numpy(rows if rows.flags.writeable else rows.copy()))  # Arrow's are read-only
    return (stored.view(torch.int16) if stored.dtype == torch.bfloat16 else stored).numpy(), clipped


def encode_batch(batch: pa.RecordBatch, layout: RecordLayout, first_row: int, source: str) -> tuple[bytes, int]:
    """The records of one batch (its first row is row ``first_row`` of its type) and how many
    feature values were clipped to the stored type; ``source`` names the rows in errors."""
    ints = {
        name: np.arange(first_row, first_row + batch.num_rows, dtype=np.int64)
        if name == "edge_id"
        else batch.column(batch.schema.get_field_index(name)).to_numpy().astype(np.int64)
        for name in layout.int_columns
    }
    for name, value in layout.constants.items():
        column = batch.column(batch.schema.get_field_index(name)).to_numpy()
        if column.size and (column != value).any():
            row = first_row + int(np.flatnonzero(column != value)[0])
            raise GnnflowError(f"{source}: row {row}, column '{name}': {column[row - first_row]} where the schema implies {value}")
    if not layout.dim:
        return encode_examples(ints, {}), 0
    rows = _features(batch, layout.dim)
    if layout.codec is None:
        return encode_examples(ints, {"features": rows}), 0
    stored, clipped = _stored(layout.codec, rows)
    return encode_examples(ints, {}, {"features": stored}), clipped


def log_clipped(clipped: int, what: str) -> None:
    """The codec's clip warning (:func:`components.feature_storage.codec.log_clipped`), imported
    only where values were clipped: the codec imports torch."""
    if clipped:
        from components.feature_storage.codec import log_clipped as warn  # noqa: PLC0415

        warn(clipped, what)
