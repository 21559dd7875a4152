"""Where a pipeline runs: Vertex AI Pipelines or a KFP endpoint, behind one protocol that the
``submit`` and ``schedule`` commands (and the Pub/Sub trigger) call without asking which."""

from __future__ import annotations

from typing import Protocol

from pipelines.run_request import KfpTarget, PreparedRun, RunRequest, SubmittedRun, Target
from pipelines.schedule_spec import ScheduleInfo, ScheduleOptions


class Backend(Protocol):
    """One service's runs and schedules. Each method raises ``GnnflowError`` for what the user can
    fix and ``SubmissionError`` (retryable or not) for what the service answered."""

    done_states: frozenset[str]
    succeeded: str

    def check_run(self, request: RunRequest) -> None:
        """Refuses, before anything is prepared, what this service cannot run."""

    def submit(self, request: RunRequest, prepared: PreparedRun, package: str) -> SubmittedRun: ...

    def poll(self, run: SubmittedRun) -> tuple[str, str]:
        """The run's state and error message now."""
        ...

    def check_schedule(self, request: RunRequest, options: ScheduleOptions) -> None:
        """Refuses, before anything is prepared, what this service cannot schedule."""

    def create_schedule(self, request: RunRequest, prepared: PreparedRun, package: str, options: ScheduleOptions) -> ScheduleInfo: ...

    def list_schedules(self) -> list[ScheduleInfo]: ...

    def pause(self, name: str) -> None: ...

    def resume(self, name: str, catch_up: bool) -> None: ...

    def delete(self, name: str) -> None: ...


def backend_for(target: Target) -> Backend:
    """The backend that serves ``target``: the one place that tells the services apart."""
    from pipelines.backends.kfp import KfpBackend
    from pipelines.backends.vertex import VertexBackend

    return KfpBackend(target) if isinstance(target, KfpTarget) else VertexBackend(target)
