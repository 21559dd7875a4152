"""The exit status a step ends with, one rule for every way a step runs.

``python -m components.<step>`` (:func:`components.runtime.entrypoint.run_cli`) and the KFP
component a compiled pipeline runs (:func:`components.runtime.pipeline_task.running`, on Vertex
AI's replicas and KFP's pods) both turn a :class:`~components.errors.GnnflowError` into the status
below, so a scheduler or Vertex AI's restart reads the same status from either:

- ``exit_code`` of the error when it has one: 75 (sysexits' EX_TEMPFAIL) for
  :class:`components.gnn.interruption.Preempted`, a train stopped by SIGTERM after writing a
  checkpoint that its rerun resumes from;
- otherwise 2: bad input or config, a missing or damaged file, and a worker that failed or that
  the progress watchdog stopped (``WorkerFailed``, one line naming the rank).

A launcher whose workers died of SIGTERM, or did not stop within its grace, raises
``SystemExit(143)`` itself; that is no ``GnnflowError`` and keeps its status on both paths.
"""

from __future__ import annotations

EXIT_USER_ERROR = 2
# sysexits' EX_TEMPFAIL: a temporary failure, to be retried. Vertex AI and schedulers see
# "preempted, run me again"; the rerun resumes from the checkpoint written on the way out.
EXIT_PREEMPTED = 75
EXIT_INTERRUPTED = 130  # Ctrl-C: as a shell reports a process that died of SIGINT


def exit_status(error: BaseException) -> int:
    """The status a step ends with when ``error`` (a ``GnnflowError``) stops it: its own
    ``exit_code`` (an int from 1 to 255), else :data:`EXIT_USER_ERROR`."""
    code = getattr(error, "exit_code", EXIT_USER_ERROR)
    if isinstance(code, bool) or not isinstance(code, int) or not 0 < code < 256:
        return EXIT_USER_ERROR
    return code
