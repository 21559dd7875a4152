"""Training curves as a TensorBoard event file, written while training runs and published with the model.

One scalar per numeric field of ``metrics.jsonl`` (``loss``, ``train_accuracy``,
``val_accuracy``, ``seconds``, ...), tagged with the field's name, at step = epoch, stamped with
the wall time the epoch ended. The file is what TensorBoard's own writer produces (``Event``
protos of the pinned ``tensorboard`` package in TFRecord framing, first the ``brain.Event:2``
version record) but is built here in memory: ``torch.utils.tensorboard.SummaryWriter`` imports
TensorFlow when it is installed, which cost rank 0 about 5 s and 545 MB of peak memory
(measured here). The bytes go through :mod:`components.storage`, so ``gs://`` works like a
local folder. The file goes

- into the generation of the model output being staged, under ``tensorboard/``: while training
  runs it is rewritten there after an epoch (``tensorboard --logdir <model URI>`` follows the
  run), and once the model is published it is the published curves;
- to ``$AIP_TENSORBOARD_LOG_DIR`` when Vertex AI sets it (a CustomJob with a TensorBoard
  instance and a base output directory: ``resources.custom_job.tensorboard``), from where
  Vertex AI uploads it to that TensorBoard as it grows.

Object stores cannot append, so each write replaces the whole file; every write extends the
bytes of the one before (same name, same per-epoch wall times, both kept in the checkpoint), so
readers that continue from an offset, TensorBoard's and Vertex AI's uploader, see one growing
file, across a preempted and resumed run too. Writes come at most every ``LIVE_INTERVAL_S``
(like ``SummaryWriter``'s ``flush_secs``, which defaults to 120 s), after the first epoch of an
attempt, and when training ends, which keeps the bytes written per run small for runs of many
short epochs.
"""

from __future__ import annotations

import logging
import numbers
import os
import socket
import time
from collections.abc import Mapping, Sequence

from components import storage
from components.tfrecord.framing import frame_record

log = logging.getLogger("gnnflow.train")

FOLDER = "tensorboard"  # below the published model
VERTEX_LOG_DIR_ENV = "AIP_TENSORBOARD_LOG_DIR"
LIVE_INTERVAL_S = 10.0


def file_name(started: float) -> str:
    """The event file's name (``events.out.tfevents.<time>.<host>.<pid>.0``, which TensorBoard looks for)."""
    return f"events.out.tfevents.{int(started):010d}.{socket.gethostname()}.{os.getpid()}.0"


def event_bytes(history: Sequence[Mapping[str, object]], wall_times: Sequence[float], started: float) -> bytes:
    """``history`` (one mapping per epoch, as ``metrics.jsonl``) as the bytes of a TensorBoard event file.

    Args:
        history: the epochs so far; booleans and non-numbers are left out, values are float32, as
            TensorBoard stores scalars.
        wall_times: when each epoch of ``history`` ended (seconds since the epoch); epochs
            without one are stamped ``started``.
        started: when the run began: the version record's time.
    """
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary

    records = [Event(wall_time=started, file_version="brain.Event:2")]
    for index, line in enumerate(history):
        values = [
            Summary.Value(tag=key, simple_value=float(value))
            for key, value in line.items()
            if key != "epoch" and isinstance(value, numbers.Real) and not isinstance(value, bool)
        ]
        when = wall_times[index] if index < len(wall_times) else started
        records.append(Event(wall_time=when, step=int(line["epoch"]), summary=Summary(value=values)))  # type: ignore[call-overload]
    return b"".join(frame_record(record.SerializeToString()) for record in records)


class LiveCurves:
    """Rank 0's writer of one run's event file into ``folders`` (the staged generation's
    ``tensorboard/``, and Vertex AI's log folder when set).

    Args:
        staged: the generation folder of the model output being staged.
        name: the file's name, the same for every attempt of the run (see :func:`file_name`).
        started: when the run began.
    """

    def __init__(self, staged: storage.Uri, name: str, started: float) -> None:
        vertex_dir = os.environ.get(VERTEX_LOG_DIR_ENV)
        self.folders = [staged.join(FOLDER)] + ([storage.parse_uri(vertex_dir)] if vertex_dir else [])
        self.name, self.started = name, started
        self.last_write: float | None = None
        self.epochs_written = 0

    def update(self, history: Sequence[Mapping[str, object]], wall_times: Sequence[float]) -> None:
        """Rewrites the file with ``history`` after an epoch, unless it was written less than
        ``LIVE_INTERVAL_S`` ago in this attempt."""
        if self.last_write is not None and time.monotonic() - self.last_write < LIVE_INTERVAL_S:
            return
        self.write(history, wall_times)

    def write(self, history: Sequence[Mapping[str, object]], wall_times: Sequence[float]) -> bytes:
        """Writes the file with ``history`` to every folder; returns its bytes."""
        data = event_bytes(history, wall_times, self.started)
        for folder in self.folders:
            storage.write_bytes(folder.join(self.name), data)
        if self.last_write is None and len(self.folders) > 1:
            log.info("training curves go to %s as they grow, for Vertex AI TensorBoard", self.folders[1])
        self.last_write, self.epochs_written = time.monotonic(), len(history)
        return data


def stage_curves(
    staging: storage.OutputStaging, live: LiveCurves, history: Sequence[Mapping[str, object]], wall_times: Sequence[float]
) -> None:
    """Writes the whole run's curves a last time and records them in the output being staged
    (the live file already lies in its generation, under ``tensorboard/``)."""
    data = live.write(history, wall_times)
    staging.add_entries({f"{FOLDER}/{live.name}": storage.FileEntry.of(data)})
