"""Failed attempts of the train step at one output, so that a retry loop cannot go on forever.

A rerun resumes from the checkpoint; that is right after a preemption or a killed machine, and
wrong after a failure that will happen again at the same point (a corrupt input, a bug). Each
failure is recorded with the checkpoint it had started from (``_checkpoints/failures.json``):
the second failure from the same checkpoint says so, and a third attempt from it is refused
before any worker starts, with what failed. A checkpoint that moves on clears the record.

A record that cannot be read is never taken for "no failures" (that would turn the guard off):
a run is refused, naming the file and what to do.
"""

from __future__ import annotations

import json
import logging

from components import storage
from components.errors import GnnflowError
from components.train.checkpoint import CHECKPOINT_FILE, POSITION_FILE

log = logging.getLogger("gnnflow.train")

FAILURES_FILE = "_checkpoints/failures.json"
ATTEMPTS_FROM_ONE_POINT = 2  # failures from the same checkpoint before a rerun is refused


def resume_point(output: storage.Uri) -> str:
    """The checkpoint a run at ``output`` would resume from: where it stands and its version
    (which changes with every checkpoint written), or "the start of training"."""
    uri = output.join(CHECKPOINT_FILE)
    if not storage.exists(uri):
        return "the start of training"
    where = storage.read_text(output.join(POSITION_FILE)) if storage.exists(output.join(POSITION_FILE)) else "a checkpoint"
    return f"{where} (checkpoint version {storage.version(uri)})"


class UnreadableRecord(GnnflowError):
    """``failures.json`` is there but is not a list of failed attempts."""


def _failures(output: storage.Uri) -> list[dict[str, str]]:
    uri = output.join(FAILURES_FILE)
    if not storage.exists(uri):
        return []
    try:
        failures = json.loads(storage.read_text(uri))
        if not isinstance(failures, list) or not all(isinstance(f, dict) and isinstance(f.get("point"), str) for f in failures):
            raise ValueError("expected a JSON list of {point, error} objects")
        return [{"point": f["point"], "error": str(f.get("error", "unknown"))} for f in failures]
    except ValueError as exc:  # JSON, UTF-8 or shape
        raise UnreadableRecord(
            f"{uri}, the record of failed train attempts that stops a retry loop, is unreadable ({exc}). "
            f"Not training: delete it to try again (delete {output.join('_checkpoints')} to train from the start)"
        ) from None


def refuse_a_looping_retry(output: storage.Uri) -> None:
    """Raises when the last attempts all failed from the checkpoint this run would resume from."""
    point = resume_point(output)
    same = [f for f in _failures(output) if f["point"] == point]
    if len(same) >= ATTEMPTS_FROM_ONE_POINT:
        raise GnnflowError(
            f"train failed {len(same)} times from the same point ({point}), last with: {same[-1]['error']}. "
            f"Not retrying: fix the cause, or delete {output.join(FAILURES_FILE)} to try again "
            f"(delete {output.join('_checkpoints')} to train from the start)"
        )


def record_failure(output: storage.Uri, point: str, error: BaseException) -> None:
    """Records a failed attempt that had started from ``point``; warns when it is not the first."""
    try:
        failures = [f for f in _failures(output) if f["point"] == point]  # another point's are history
    except UnreadableRecord:  # readable when this run began (it was checked): not the failure to report
        log.error("%s became unreadable during this run; it now records this failure alone", output.join(FAILURES_FILE))
        failures = []
    failures.append({"point": point, "error": f"{type(error).__name__}: {error}"[:2000]})
    storage.write_text(output.join(FAILURES_FILE), json.dumps(failures, indent=2))
    if len(failures) > 1:
        log.error(
            "train failed again from the same point as the previous attempt (%s); after %d such failures a rerun is refused",
            point,
            ATTEMPTS_FROM_ONE_POINT,
        )


def clear(output: storage.Uri) -> None:
    """Forgets the failures once the step has published."""
    if storage.exists(output.join(FAILURES_FILE)):
        storage.delete(output.join(FAILURES_FILE))
