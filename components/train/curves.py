"""Training curves as a TensorBoard event file: in the published model, and for Vertex AI TensorBoard.

One scalar per numeric field of ``metrics.jsonl`` (``loss``, ``train_accuracy``,
``val_accuracy``, ``seconds``, ...), tagged with the field's name, at step = epoch. The file
is what TensorBoard's own writer produces (``Event`` protos of the pinned ``tensorboard``
package in TFRecord framing, first the ``brain.Event:2`` version record) but is built here in
memory: ``torch.utils.tensorboard.SummaryWriter`` imports TensorFlow when it is installed,
which cost rank 0 about 5 s and 545 MB of peak memory at the end of every training (measured
here). The bytes go through :mod:`components.storage`, so a ``gs://`` output works like a
local one:

- into the model output under ``tensorboard/`` (``tensorboard --logdir <model URI>``);
- to ``$AIP_TENSORBOARD_LOG_DIR`` when Vertex AI sets it (a CustomJob with a TensorBoard
  instance and a base output directory: ``resources.custom_job.tensorboard``), from where
  Vertex AI uploads it to that TensorBoard.

The curves are written once, when training ends (a resumed run's history includes the epochs
run before the restart), so they appear in TensorBoard with the model, not epoch by epoch.
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


def event_file(history: Sequence[Mapping[str, object]], wall_time: float | None = None) -> tuple[str, bytes]:
    """``history`` (one mapping per epoch, as ``metrics.jsonl``) as a TensorBoard event file.

    Returns:
        The file's name (``events.out.tfevents.<time>.<host>.<pid>.0``, which TensorBoard
        looks for) and its bytes. Booleans and non-numbers are left out; values are float32,
        as TensorBoard stores scalars.
    """
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary

    now = time.time() if wall_time is None else wall_time
    records = [Event(wall_time=now, file_version="brain.Event:2")]
    for line in history:
        values = [
            Summary.Value(tag=key, simple_value=float(value))
            for key, value in line.items()
            if key != "epoch" and isinstance(value, numbers.Real) and not isinstance(value, bool)
        ]
        records.append(Event(wall_time=now, step=int(line["epoch"]), summary=Summary(value=values)))  # type: ignore[call-overload]
    name = f"events.out.tfevents.{int(now):010d}.{socket.gethostname()}.{os.getpid()}.0"
    return name, b"".join(frame_record(record.SerializeToString()) for record in records)


def stage_curves(staging: storage.OutputStaging, history: Sequence[Mapping[str, object]]) -> None:
    """Adds the curves of ``history`` to the output being staged; copies them to ``$AIP_TENSORBOARD_LOG_DIR`` if set."""
    name, data = event_file(history)
    staging.write_bytes(f"{FOLDER}/{name}", data)
    vertex_dir = os.environ.get(VERTEX_LOG_DIR_ENV)
    if vertex_dir:
        target = storage.parse_uri(vertex_dir).join(name)
        storage.write_bytes(target, data)
        log.info("training curves (%d epochs) copied to %s for Vertex AI TensorBoard", len(history), target)
