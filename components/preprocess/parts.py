"""Parquet parts written into a staged output, numbered per folder in write order."""

from __future__ import annotations

import io
from collections import defaultdict

import pyarrow as pa
import pyarrow.parquet as pq

from components.storage import OutputStaging


class PartWriter:
    """Writes each table it is given as the next ``part-NNNNN.parquet`` of its folder."""

    def __init__(self, staging: OutputStaging) -> None:
        self._staging = staging
        self._parts: dict[str, list[str]] = defaultdict(list)

    def write(self, folder: str, table: pa.Table) -> str:
        path = f"{folder}/part-{len(self._parts[folder]):05d}.parquet"
        buffer = io.BytesIO()
        pq.write_table(table, buffer, compression="zstd")
        self._staging.write_bytes(path, buffer.getvalue())
        self._parts[folder].append(path)
        return path

    def files(self, folder: str) -> list[str]:
        return list(self._parts[folder])
