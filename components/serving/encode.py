"""A new node's raw column values → its feature row, with the transforms preprocess fitted.

The values go through the same code preprocess runs (``tables.transforms.encode_numeric`` on
one block of a micro-batch's numbers, ``encode_features`` on a small Arrow table of its
categories), so a served row equals the row the node would get in the next batch run. Before that, each value is checked and a bad one is an
:class:`InstanceError` naming the instance and ``features.<column>``: a column the model does
not read, a needed column missing (unless its group fills missing values), a value of the wrong
kind (a number column takes JSON numbers; a category column takes strings, or integers, read as
their decimal string, as a CSV reader would), and a non-finite number where missing values are
errors.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
import pyarrow as pa

from components.errors import GnnflowError
from components.serving.instances import InstanceError
from components.tables.transforms import FittedFeatures, encode_features, encode_numeric

Kind = Literal["number", "category"]


class FeatureEncoder:
    """The fitted feature groups of every node type (from a model's ``transform_state.json``)."""

    def __init__(self, state: dict, node_types: Sequence[str]) -> None:
        saved = state.get("node_types", {})
        self.groups = {t: [FittedFeatures.from_dict(f) for f in saved.get(t, {}).get("features", [])] for t in node_types}
        self.columns: dict[str, dict[str, Kind]] = {
            t: {c: ("number" if g.is_numeric else "category") for g in groups for c in g.columns} for t, groups in self.groups.items()
        }
        self._fills = {t: {c: g.spec.on_missing == "fill" for g in groups for c in g.columns} for t, groups in self.groups.items()}
        self._numbers = {t: [c for c, kind in columns.items() if kind == "number"] for t, columns in self.columns.items()}
        self._categories = {t: [c for c, kind in columns.items() if kind == "category"] for t, columns in self.columns.items()}
        # Each numeric group's columns, as positions in the type's (rows, number columns) block.
        self._number_at = {t: {c: j for j, c in enumerate(numbers)} for t, numbers in self._numbers.items()}

    def _value(self, node_type: str, column: str, value: object, index: int) -> object:
        kind, fills = self.columns[node_type][column], self._fills[node_type][column]
        field = f"features.{column}"
        if value is None:
            if not fills:
                raise InstanceError(index, field, "a value is needed (the model's transforms do not fill missing values)")
            return None
        if isinstance(value, bool):
            raise InstanceError(index, field, f"expected a {kind}, got a boolean")
        if kind == "number":
            if not isinstance(value, (int, float)):
                raise InstanceError(index, field, f"expected a number, got {type(value).__name__} {value!r}")
            if not math.isfinite(float(value)) and not fills:
                raise InstanceError(index, field, f"expected a finite number, got {value!r}")
            return float(value)
        if isinstance(value, int):
            return str(value)
        if not isinstance(value, str):
            raise InstanceError(index, field, f"expected a category (a string), got {type(value).__name__} {value!r}")
        if not value and not fills:
            raise InstanceError(index, field, "a category is needed (the model's transforms do not fill missing values)")
        return value

    def check(self, node_type: str, features: Mapping[str, object], index: int) -> dict[str, object]:
        """The checked values of one new node's columns (every column the model reads)."""
        known = self.columns[node_type]
        if not features.keys() <= known.keys():
            for column in features:
                if column not in known:
                    names = ", ".join(known) if len(known) <= 8 else f"{', '.join(list(known)[:8])}, ... ({len(known)} columns)"
                    reads = f"it reads {names}" if known else f"node type {node_type!r} has no feature columns"
                    raise InstanceError(index, f"features.{column}", f"the model does not read this column ({reads})")
        plain = self._plain(node_type, features)
        if plain is not None:
            return plain
        values = {}
        for column in known:
            if column not in features and not self._fills[node_type][column]:
                raise InstanceError(index, f"features.{column}", "missing: the model needs this column")
            values[column] = self._value(node_type, column, features.get(column), index)
        return values

    def _plain(self, node_type: str, features: Mapping[str, object]) -> dict[str, object] | None:
        """The checked values when every column holds an ordinary value (finite numbers, non-empty
        strings): what :meth:`_value` returns for them, found without its per-cell checks. None:
        something needs those checks (a missing value, a boolean, an integer category, ...)."""
        numbers = [features.get(c) for c in self._numbers[node_type]]
        if not all(type(v) is float or type(v) is int for v in numbers):
            return None
        floats = [float(v) for v in numbers]  # type: ignore[arg-type]
        if not np.isfinite(np.asarray(floats, dtype=np.float64)).all():
            return None
        categories = [features.get(c) for c in self._categories[node_type]]
        if not all(type(v) is str and v for v in categories):
            return None
        found = dict(zip(self._numbers[node_type], floats)) | dict(zip(self._categories[node_type], categories))
        return {c: found[c] for c in self.columns[node_type]}

    def encode(self, node_type: str, rows: Sequence[dict[str, object]], indices: Sequence[int]) -> np.ndarray:
        """(len(rows), feature_dim) float32 of checked rows (see :meth:`check`), instance ``indices[i]`` in row i.

        Numeric groups go straight to ``encode_numeric`` as one (rows, columns) block; category
        groups through ``encode_features`` on an Arrow table of their columns: both are the code
        preprocess runs."""
        numbers, at = self._numbers[node_type], self._number_at[node_type]
        block = np.array([[np.nan if r[c] is None else r[c] for c in numbers] for r in rows], dtype=np.float64).reshape(len(rows), -1)

        def row_name(i: int) -> str:
            return f"instance {indices[i]}"

        parts = [np.zeros((len(rows), 0), dtype=np.float32)]
        try:
            for group in self.groups[node_type]:
                if group.is_numeric:
                    parts.append(encode_numeric(block[:, [at[c] for c in group.columns]], group, row_name))
                    continue
                table = pa.Table.from_arrays([pa.array([r[c] for r in rows], pa.string()) for c in group.columns], names=group.columns)
                parts.append(encode_features(table, [group], row_name))
        except GnnflowError as exc:  # a value only the transform itself refuses
            raise InstanceError(int(indices[0]), "features", str(exc)) from None
        return np.concatenate(parts, axis=1)
