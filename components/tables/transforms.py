"""Feature, label and split transforms: fitted once over a table, then applied chunk by chunk.

Fitting accumulates small statistics (sums, category counts, label values) chunk by chunk.
Applying is a pure function of (chunk, fitted state): no I/O, no global state, so the same
code can run inside a distributed data-processing job for tables beyond one machine.
"""

from __future__ import annotations

import fnmatch
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pyarrow as pa

from components.config import FeatureSpec, SplitSpec
from components.errors import GnnflowError
from components.schema import NO_LABEL, NO_SPLIT, SPLIT_CODES

if TYPE_CHECKING:
    from components.tables.reading import TableChunk

# Where a chunk's i-th row is, for an error ("file, row N", or a BigQuery row named by its id):
# ``TableChunk.row``.
RowName = Callable[[int], str]

NUMERIC_TRANSFORMS = ("standardize", "passthrough", "row_normalize")
OTHER_CATEGORY = "<other>"


def expand_columns(patterns: Sequence[str], header: Sequence[str], source: str) -> list[str]:
    """Header columns matching names or glob patterns, in header order, each once."""
    chosen: list[str] = []
    for pattern in patterns:
        matches = (
            [c for c in header if fnmatch.fnmatchcase(c, pattern)]
            if any(ch in pattern for ch in "*?[")
            else ([pattern] if pattern in header else [])
        )
        if not matches:
            raise GnnflowError(f"{source}: missing column '{pattern}' (no header column matches it)")
        chosen.extend(c for c in matches if c not in chosen)
    return chosen


@dataclass(frozen=True)
class FittedFeatures:
    """One feature group with its fitted statistics; JSON-serializable via ``asdict``."""

    spec: FeatureSpec
    columns: list[str]
    means: list[float] | None = None
    stds: list[float] | None = None
    categories: list[list[str]] | None = None
    # Numeric groups: each column's range after the transform (what int8 storage is fitted on).
    lows: list[float] | None = None
    highs: list[float] | None = None

    @property
    def is_numeric(self) -> bool:
        return self.spec.transform in NUMERIC_TRANSFORMS

    @property
    def output_names(self) -> list[str]:
        if self.spec.transform in NUMERIC_TRANSFORMS:
            return list(self.columns)
        if self.spec.transform == "one_hot":
            assert self.categories is not None
            return [f"{c}={v}" for c, cats in zip(self.columns, self.categories) for v in [*cats, OTHER_CATEGORY]]
        return [f"{c}#{b}" for c in self.columns for b in range(self.spec.num_buckets)]

    def to_dict(self) -> dict:
        return {**asdict(self), "spec": self.spec.model_dump(mode="json")}

    @staticmethod
    def from_dict(raw: dict) -> FittedFeatures:
        return FittedFeatures(**{**raw, "spec": FeatureSpec.model_validate(raw["spec"])})


def column_type(spec: FeatureSpec) -> pa.DataType:
    """The Arrow type a feature column is read as."""
    return pa.float64() if spec.transform in NUMERIC_TRANSFORMS else pa.string()


def _numeric_matrix(chunk: pa.Table, columns: Sequence[str]) -> np.ndarray:
    """(rows, len(columns)) float64; nulls become NaN."""
    out = np.empty((chunk.num_rows, len(columns)), dtype=np.float64)
    for j, name in enumerate(columns):
        out[:, j] = chunk.column(name).to_numpy(zero_copy_only=False)
    return out


def _check_missing(bad: np.ndarray, columns: Sequence[str], row_name: RowName, what: str) -> None:
    rows, cols = np.nonzero(bad)
    if len(rows):
        first = int(np.argmin(rows * len(columns) + cols))
        raise GnnflowError(
            f"{row_name(int(rows[first]))}, column '{columns[cols[first]]}': {what} "
            f"({int(bad.sum())} such cells in this chunk; set on_missing: fill to replace them)"
        )


def _strings(chunk: pa.Table, name: str) -> np.ndarray:
    return np.asarray(chunk.column(name).to_pylist(), dtype=object)


class FeatureFitter:
    """Accumulates one feature group's statistics over chunks, checking values on the way."""

    def __init__(self, spec: FeatureSpec, columns: list[str]) -> None:
        self.spec, self.columns = spec, columns
        self._count = np.zeros(len(columns))
        self._sum = np.zeros(len(columns))
        self._sumsq = np.zeros(len(columns))
        self._categories: list[Counter[str]] = [Counter() for _ in columns]
        # Range of the values as the transform leaves them, but before standardizing (applied in finish).
        self._low = np.full(len(columns), np.inf)
        self._high = np.full(len(columns), -np.inf)

    def update(self, chunk: pa.Table, row_name: RowName) -> None:
        if self.spec.transform in NUMERIC_TRANSFORMS:
            x = _numeric_matrix(chunk, self.columns)
            bad = ~np.isfinite(x)
            if self.spec.on_missing == "error":
                _check_missing(bad, self.columns, row_name, "missing, NaN or infinite value")
            x[bad] = self.spec.fill_value
            self._count += len(x)
            self._sum += x.sum(axis=0)
            self._sumsq += np.square(x).sum(axis=0)
            if len(x):
                shown = _row_normalized(x) if self.spec.transform == "row_normalize" else x
                self._low = np.minimum(self._low, shown.min(axis=0))
                self._high = np.maximum(self._high, shown.max(axis=0))
            return
        for j, name in enumerate(self.columns):
            values = pd.Series(_strings(chunk, name))
            missing = values.isna() | (values == "")
            if self.spec.on_missing == "error" and missing.any():
                row = int(np.flatnonzero(missing.to_numpy())[0])
                raise GnnflowError(f"{row_name(row)}, column '{name}': missing category value")
            if self.spec.transform == "one_hot":
                self._categories[j].update(values[~missing].value_counts().to_dict())

    def merge(self, other: FeatureFitter) -> None:
        """Adds the statistics ``other`` accumulated (over other rows) to these."""
        self._count += other._count
        self._sum += other._sum
        self._sumsq += other._sumsq
        self._low = np.minimum(self._low, other._low)
        self._high = np.maximum(self._high, other._high)
        for mine, theirs in zip(self._categories, other._categories):
            mine.update(theirs)

    def finish(self) -> FittedFeatures:
        if self.spec.transform == "standardize":
            n = np.maximum(self._count, 1)
            mean = self._sum / n
            std = np.sqrt(np.maximum(self._sumsq / n - mean**2, 0.0))
            std = np.where(std > 0, std, 1.0)
            lows, highs = _finite_range((self._low - mean) / std, (self._high - mean) / std)  # std > 0: order kept
            return FittedFeatures(self.spec, self.columns, means=mean.tolist(), stds=std.tolist(), lows=lows, highs=highs)
        if self.spec.transform == "one_hot":
            # Most frequent first, ties by name, so the fitted vocabulary is deterministic.
            cats = [sorted(sorted(counter), key=lambda v: -counter[v])[: self.spec.max_categories] for counter in self._categories]
            return FittedFeatures(self.spec, self.columns, categories=[sorted(c) for c in cats])
        if self.spec.transform in NUMERIC_TRANSFORMS:
            lows, highs = _finite_range(self._low, self._high)
            return FittedFeatures(self.spec, self.columns, lows=lows, highs=highs)
        return FittedFeatures(self.spec, self.columns)


def _finite_range(low: np.ndarray, high: np.ndarray) -> tuple[list[float], list[float]]:
    """Per-column (low, high) lists; a column that saw no value (an empty table) gets [0, 0]."""
    seen = np.isfinite(low) & np.isfinite(high)
    return np.where(seen, low, 0.0).tolist(), np.where(seen, high, 0.0).tolist()


def feature_ranges(groups: Sequence[FittedFeatures]) -> tuple[np.ndarray, np.ndarray] | None:
    """(low, high), each (output width,): the range of every output column of ``groups`` after
    the transform (one-hot and hashing slots: [0, 1]); None if a numeric group was fitted by an
    older gnnflow, which kept no ranges."""
    lows: list[np.ndarray] = [np.zeros(0)]
    highs: list[np.ndarray] = [np.zeros(0)]
    for group in groups:
        if group.is_numeric:
            if group.lows is None or group.highs is None:
                return None
            lows.append(np.asarray(group.lows, dtype=np.float64))
            highs.append(np.asarray(group.highs, dtype=np.float64))
        else:
            width = len(group.output_names)
            lows.append(np.zeros(width))
            highs.append(np.ones(width))
    return np.concatenate(lows), np.concatenate(highs)


class PerFileFitters:
    """Feature statistics of a table, accumulated file by file and added up in file order.

    Float sums depend on the order of the additions; summing each file on its own and then the
    files in order gives the same bits whether one process reads every file or each file is
    read by another worker (the beam engine), so both engines fit the same statistics.
    """

    def __init__(self, specs: Sequence[FeatureSpec], groups: Sequence[list[str]]) -> None:
        self._specs, self._groups = list(specs), [list(g) for g in groups]
        self.total = self.new_file()
        self._file: list[FeatureFitter] | None = None

    def new_file(self) -> list[FeatureFitter]:
        return [FeatureFitter(spec, columns) for spec, columns in zip(self._specs, self._groups)]

    def update(self, chunk: TableChunk) -> None:
        if chunk.first_row == 1:
            self._fold()
            self._file = self.new_file()
        assert self._file is not None, "a file's first chunk must start at row 1"
        for fitter in self._file:
            fitter.update(chunk.table, chunk.row)

    def add_file(self, fitters: Sequence[FeatureFitter]) -> None:
        """Adds one whole file's statistics (the next file in order)."""
        for total, part in zip(self.total, fitters):
            total.merge(part)

    def _fold(self) -> None:
        if self._file is not None:
            self.add_file(self._file)
            self._file = None

    def finish(self) -> list[FittedFeatures]:
        self._fold()
        return [fitter.finish() for fitter in self.total]


def encode_numeric(x: np.ndarray, group: FittedFeatures, row_name: RowName) -> np.ndarray:
    """A numeric group's block: ``x`` (rows, its columns) float64, NaN where missing (changed in place)."""
    spec = group.spec
    bad = ~np.isfinite(x)
    if spec.on_missing == "error":
        _check_missing(bad, group.columns, row_name, "missing, NaN or infinite value")
    x[bad] = spec.fill_value
    if spec.transform == "standardize":
        x = (x - np.asarray(group.means)) / np.asarray(group.stds)
    elif spec.transform == "row_normalize":
        x = _row_normalized(x)
    return x.astype(np.float32)


def _row_normalized(x: np.ndarray) -> np.ndarray:
    """Each row of (rows, columns) ``x`` divided by its sum of absolute values (all-zero rows stay zero)."""
    norm = np.abs(x).sum(axis=1, keepdims=True)
    return x / np.where(norm > 0, norm, 1.0)


def encode_features(chunk: pa.Table, groups: Sequence[FittedFeatures], row_name: RowName) -> np.ndarray:
    """Feature matrix of a chunk: (rows, sum of group widths) float32; ``row_name`` names a row in errors."""
    parts = [np.zeros((chunk.num_rows, 0), dtype=np.float32)]
    for group in groups:
        spec = group.spec
        if group.is_numeric:
            parts.append(encode_numeric(_numeric_matrix(chunk, group.columns), group, row_name))
            continue
        for j, name in enumerate(group.columns):
            values = pd.Series(_strings(chunk, name))
            present = ~(values.isna() | (values == "")).to_numpy()
            if spec.on_missing == "error" and not present.all():
                row = int(np.flatnonzero(~present)[0])
                raise GnnflowError(f"{row_name(row)}, column '{name}': missing category value")
            if spec.transform == "one_hot":
                cats = group.categories[j]  # type: ignore[index]
                slot = pd.Categorical(values, categories=cats).codes.astype(np.int64)
                slot[slot < 0] = len(cats)  # unseen values share the trailing 'other' slot
                width = len(cats) + 1
            else:
                width = spec.num_buckets
                slot = (pd.util.hash_array(values.fillna("").astype(str).to_numpy(dtype=object)) % np.uint64(width)).astype(np.int64)
            block = np.zeros((chunk.num_rows, width), dtype=np.float32)
            rows = np.flatnonzero(present)
            block[rows, slot[rows]] = 1.0
            parts.append(block)
    return np.concatenate(parts, axis=1)


def count_unseen_categories(chunk: pa.Table, groups: Sequence[FittedFeatures]) -> dict[str, int]:
    """Per one-hot column, how many of the chunk's values are outside the fitted vocabulary (they
    land in the trailing 'other' slot); only columns with any. Hashing has no vocabulary: every
    value has a bucket, seen or not."""
    unseen: dict[str, int] = {}
    for group in groups:
        if group.spec.transform != "one_hot":
            continue
        for j, name in enumerate(group.columns):
            values = pd.Series(_strings(chunk, name))
            present = ~(values.isna() | (values == "")).to_numpy()
            codes = pd.Categorical(values, categories=group.categories[j]).codes  # type: ignore[index]
            if count := int(((codes < 0) & present).sum()):
                unseen[name] = count
    return unseen


def fit_label_vocabulary(values: set[str]) -> list[str]:
    """Class names in a stable order: numeric-aware sort so 'class_10' follows 'class_9'."""

    def key(v: str) -> tuple:
        return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", v))

    return sorted(values, key=key)


def label_values(chunk: pa.Table, column: str) -> set[str]:
    return {v for v in chunk.column(column).to_pylist() if v not in (None, "")}


def encode_labels(chunk: pa.Table, column: str, vocabulary: Sequence[str], row_name: RowName) -> np.ndarray:
    """Class indices (rows,) int64; unlabeled rows get -1, a label outside the vocabulary is an error."""
    values = pd.Series(_strings(chunk, column))
    missing = (values.isna() | (values == "")).to_numpy()
    codes = pd.Categorical(values, categories=list(vocabulary)).codes.astype(np.int64)
    unknown = (codes < 0) & ~missing
    if unknown.any():
        row = int(np.flatnonzero(unknown)[0])
        raise GnnflowError(f"{row_name(row)}, column '{column}': label {values[row]!r} is not in the fitted vocabulary {list(vocabulary)}")
    codes[missing] = NO_LABEL
    return codes


def _unit_hash(ids: np.ndarray, seed: int) -> np.ndarray:
    """A uniform number in [0, 1) per id, fixed by (id, seed): splitmix64's finalizer."""
    with np.errstate(over="ignore"):
        z = ids.astype(np.uint64) + np.uint64((seed * 0x9E3779B97F4A7C15) % 2**64)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def encode_splits(
    ids: np.ndarray,
    spec: SplitSpec,
    column: pa.ChunkedArray | None,
    eligible: np.ndarray | None,
    where: tuple[RowName, str] | None = None,
) -> np.ndarray:
    """Split codes (rows,) int8: 0 train, 1 val, 2 test, -1 none.

    From the split column when there is one (``where``: how to name a row, and the column's
    name, for the error on a value that is neither a split nor one of ``none_values``); otherwise a seeded
    random split where each row's split depends only on its id, so it is the same however the
    table is chunked. Rows not ``eligible`` (e.g. unlabeled nodes) get no split.
    """
    if column is not None:
        values = np.asarray([v if v is not None else "" for v in column.to_pylist()], dtype=object)
        codes = np.full(len(values), NO_SPLIT, dtype=np.int8)
        for name, value in (("train", spec.train_value), ("val", spec.val_value), ("test", spec.test_value)):
            codes[values == value] = SPLIT_CODES[name]
        unknown = (codes == NO_SPLIT) & ~np.isin(values, np.asarray(spec.none_values, dtype=object))
        if unknown.any():
            row = int(np.flatnonzero(unknown)[0])
            row_name, name = where or ((lambda i: f"row {i + 1}"), "")
            raise GnnflowError(
                f"{row_name(row)}, column '{name}': split value {values[row]!r} is not one of "
                f"{[spec.train_value, spec.val_value, spec.test_value]} nor of task.split.none_values {spec.none_values} "
                f"({int(unknown.sum())} such rows in this chunk)"
            )
        return codes
    u = _unit_hash(ids, spec.seed)
    codes = np.full(len(ids), NO_SPLIT, dtype=np.int8)
    codes[u < spec.train + spec.val + spec.test] = SPLIT_CODES["test"]
    codes[u < spec.train + spec.val] = SPLIT_CODES["val"]
    codes[u < spec.train] = SPLIT_CODES["train"]
    if eligible is not None:
        codes[~eligible] = NO_SPLIT
    return codes
