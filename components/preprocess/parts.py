"""Parquet parts written into a staged output, numbered per folder in write order."""

from __future__ import annotations

import io
from collections import defaultdict

import pyarrow as pa
import pyarrow.parquet as pq

from components.storage import OutputStaging


def part_path(folder: str, number: int) -> str:
    return f"{folder}/part-{number:05d}.parquet"


def write_part(staging: OutputStaging, folder: str, number: int, table: pa.Table) -> str:
    """Writes ``table`` as part ``number`` of ``folder``; returns its path in the output."""
    path = part_path(folder, number)
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="zstd")
    staging.write_bytes(path, buffer.getvalue())
    return path


class PartWriter:
    """Writes each table it is given as the next ``part-NNNNN.parquet`` of its folder."""

    def __init__(self, staging: OutputStaging) -> None:
        self._staging = staging
        self._parts: dict[str, list[str]] = defaultdict(list)

    def write(self, folder: str, table: pa.Table) -> str:
        path = write_part(self._staging, folder, len(self._parts[folder]), table)
        self._parts[folder].append(path)
        return path

    def files(self, folder: str) -> list[str]:
        return list(self._parts[folder])
