"""``preprocess.engine: beam`` for serialize: every TFRecord shard written by a Beam worker.

A shard holds a fixed range of its type's rows (the ranges of the one-process engine), so each
worker reads only the Parquet parts that overlap its range and encodes them with the project's
numpy encoder: the shards are byte for byte those of the one-process engine. Workers write into
the staged generation; the pipeline's last step writes the shards' counts and checksums in a
result file, from which the launcher publishes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from components import storage
from components.beam_pipeline import put_result, run_pipeline, take_result
from components.config import GnnflowConfig
from components.serialize.output import STEP
from components.serialize.records import RecordLayout, encode_batch, log_clipped
from components.serialize.shards import TypeShards

log = logging.getLogger("gnnflow.serialize")


@dataclass(frozen=True)
class ShardTask:
    """One shard: its path, its global row range and the parts (path, first row, rows) it reads."""

    path: str
    start: int
    stop: int
    parts: list[tuple[str, int, int]]
    layout: RecordLayout
    folder: str  # the type's, naming its rows in errors


@dataclass(frozen=True)
class CopyTask:
    """One id-map part copied from the preprocessed output."""

    path: str


def shard_tasks(plan: TypeShards) -> list[ShardTask]:
    first, parts = 0, []
    for path, rows in zip(plan.parts, plan.part_rows):
        parts.append((path, first, rows))
        first += rows
    return [
        ShardTask(path, start, stop, [p for p in parts if p[1] < stop and p[1] + p[2] > start], plan.layout, plan.folder)
        for path, (start, stop) in zip(plan.shard_paths(), plan.shard_ranges())
    ]


def _rows_in_range(preprocessed: storage.PublishedOutput, task: ShardTask) -> Iterator[tuple[int, pa.RecordBatch]]:
    """(global first row, batch) of the task's rows, in order."""
    for path, first, _ in task.parts:
        row = first
        # The part whole, checked against the manifest (see shards.iter_part_batches).
        for batch in pq.ParquetFile(pa.BufferReader(preprocessed.read_bytes(path))).iter_batches(batch_size=8192):
            lo, hi = max(task.start, row), min(task.stop, row + batch.num_rows)
            if lo < hi:
                yield lo, batch.slice(lo - row, hi - lo)
            row += batch.num_rows
            if row >= task.stop:
                break


def run_task(task: ShardTask | CopyTask, preprocessed: storage.PublishedOutput, output: str, generation: str) -> tuple[str, int, list, int]:
    """Writes one shard (or copies one id map); returns (path, records, [size, crc32c], feature
    values clipped to the stored type)."""
    staging = storage.OutputStaging(storage.parse_uri(output), STEP, generation)
    if isinstance(task, CopyTask):
        storage.copy_file(preprocessed.uri(task.path), staging.uri(task.path))
        return task.path, 0, [], 0
    clipped = 0
    if task.stop == task.start:
        staging.write_bytes(task.path, b"")
    else:
        with staging.open_write(task.path) as writer:
            for first_row, batch in _rows_in_range(preprocessed, task):
                data, lost = encode_batch(batch, task.layout, first_row, task.folder)
                writer.write(data)
                clipped += lost
    entry = staging.entries[task.path]
    return task.path, task.stop - task.start, [entry.size, entry.crc32c], clipped


def _write_result(results: list[tuple[str, int, list, int]], output: str, generation: str) -> None:
    put_result(storage.OutputStaging(storage.parse_uri(output), STEP, generation), sorted(results))


def _known_part_rows(preprocessed: storage.PublishedOutput, plan: TypeShards) -> TypeShards:
    """Outputs of older releases list no rows per part: read them from the Parquet footers."""
    if len(plan.part_rows) == len(plan.parts):
        return plan
    rows = []
    for path in plan.parts:
        with storage.open_read(preprocessed.uri(path)) as f:
            rows.append(pq.ParquetFile(f).metadata.num_rows)
    return TypeShards(plan.folder, plan.parts, rows, plan.rows, plan.num_shards, plan.layout)


def write_with_beam(
    config: GnnflowConfig,
    preprocessed: storage.PublishedOutput,
    plans: dict[str, TypeShards],
    staging: storage.OutputStaging,
    image: str | None,
) -> dict[str, tuple[list[str], list[int]]]:
    """Writes every shard (and copies the id maps) on Beam; returns each folder's shards and counts."""
    plans = {folder: _known_part_rows(preprocessed, plan) for folder, plan in plans.items()}
    tasks: list[Any] = [task for plan in plans.values() for task in shard_tasks(plan)]
    tasks += [CopyTask(p) for p in preprocessed.manifest.files if p.startswith("id_maps/")]
    output, generation = str(staging.output), staging.generation
    log.info(
        "serialize: %d shard(s) and %d id-map part(s) to write",
        sum(isinstance(t, ShardTask) for t in tasks),
        sum(isinstance(t, CopyTask) for t in tasks),
    )

    def build(pipeline: Any) -> None:
        import apache_beam as beam

        (
            pipeline
            | "shards" >> beam.Create(tasks)
            | "spread" >> beam.Reshuffle()
            | "write shards" >> beam.Map(run_task, preprocessed, output, generation)
            | "all shards" >> beam.combiners.ToList()
            | "write result" >> beam.Map(_write_result, output, generation)
        )

    run_pipeline(build, config.preprocess.beam, STEP, image)
    results = {path: (count, entry, clipped) for path, count, entry, clipped in take_result(staging, STEP)}
    written = {}
    for folder, plan in plans.items():
        paths = plan.shard_paths()
        staging.add_entries({p: storage.FileEntry(*results[p][1]) for p in paths})
        written[folder] = (paths, [results[p][0] for p in paths])
        log_clipped(sum(results[p][2] for p in paths), f"serialize: {folder} ({len(paths)} shard(s))")
    return written
