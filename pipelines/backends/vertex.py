"""Vertex AI Pipelines: runs as ``PipelineJob`` (optionally in an Experiment), schedules as
``PipelineJobSchedule``."""

from __future__ import annotations

from typing import Any

from components.errors import GnnflowError
from pipelines import vertex_submit
from pipelines.run_request import (
    PreparedRun,
    RunRequest,
    SubmissionError,
    SubmittedRun,
    VertexTarget,
    api_message,
    check_pipeline_root,
    is_retryable,
)
from pipelines.schedule_spec import ScheduleInfo, ScheduleOptions
from pipelines.vertex_submit import init_vertex, vertex_call, vertex_credentials, vertex_pipeline_job


class VertexBackend:
    done_states = frozenset(vertex_submit.DONE_STATES)
    succeeded = vertex_submit.SUCCEEDED

    def __init__(self, target: VertexTarget) -> None:
        self.target = target

    def _check_root(self, what: str) -> None:
        if not self.target.pipeline_root:
            raise GnnflowError(f"Vertex AI needs --pipeline-root (a gs:// folder for the {what} artifacts)")

    def check_run(self, request: RunRequest) -> None:  # noqa: ARG002
        self._check_root("run's")

    def submit(self, request: RunRequest, prepared: PreparedRun, package: str) -> SubmittedRun:
        if self.target.check_pipeline_root:
            check_pipeline_root(self.target.pipeline_root or "")
        return vertex_submit.submit_vertex(self.target, request, prepared, package)

    def poll(self, run: SubmittedRun) -> tuple[str, str]:
        service = vertex_submit.pipeline_service(self.target)
        job = vertex_call(self.target, f"pipeline job {run.name}", lambda: service.get_pipeline_job(name=run.name))
        return job.state.name, job.error.message

    def check_schedule(self, request: RunRequest, options: ScheduleOptions) -> None:  # noqa: ARG002
        self._check_root("runs'")
        if self.target.experiment:
            raise GnnflowError("--experiment: a Vertex AI schedule cannot put its runs in an experiment (gnnflow submit can)")

    def create_schedule(self, request: RunRequest, prepared: PreparedRun, package: str, options: ScheduleOptions) -> ScheduleInfo:
        from google.cloud import aiplatform

        target = self.target
        if target.check_pipeline_root:
            check_pipeline_root(target.pipeline_root or "")
        init_vertex(target)
        job = vertex_pipeline_job(target, request, prepared, package)
        try:
            schedule = aiplatform.PipelineJobSchedule(
                pipeline_job=job,
                display_name=prepared.display_name,
                credentials=vertex_credentials(target),
                project=target.project,
                location=target.region,
            )
            # A schedule has no caller-chosen id: repeated only when the request never left this machine.
            vertex_call(
                target,
                f"schedule {prepared.display_name!r} in projects/{target.project}/locations/{target.region}",
                lambda: schedule.create(
                    cron=f"TZ={options.time_zone} {options.cron}",
                    # (annotated as str; the proto field takes a datetime, which is what the API is sent)
                    start_time=options.start_time,  # type: ignore[arg-type]
                    end_time=options.end_time,  # type: ignore[arg-type]
                    allow_queueing=options.allow_queueing,
                    max_run_count=options.max_run_count,
                    max_concurrent_run_count=options.max_concurrent_runs,
                    service_account=target.service_account,
                ),
                idempotent=False,
            )
        except SubmissionError:
            raise
        except ValueError as exc:
            raise GnnflowError(f"invalid Vertex AI schedule: {exc}") from exc
        except Exception as exc:  # noqa: BLE001
            raise SubmissionError(f"Vertex AI refused schedule {prepared.display_name!r}: {api_message(exc)}", is_retryable(exc)) from exc
        return _info(schedule)

    def list_schedules(self) -> list[ScheduleInfo]:
        from google.cloud import aiplatform

        target = self.target
        init_vertex(target)
        found = self._call(
            "list schedules",
            lambda: aiplatform.PipelineJobSchedule.list(
                project=target.project, location=target.region, credentials=vertex_credentials(target)
            ),
        )
        return [_info(s) for s in found]

    def pause(self, name: str) -> None:
        schedule = self._schedule(name)
        self._call(f"pause {schedule.resource_name}", schedule.pause)

    def resume(self, name: str, catch_up: bool) -> None:
        schedule = self._schedule(name)
        self._call(f"resume {schedule.resource_name}", lambda: schedule.resume(catch_up=catch_up))

    def delete(self, name: str) -> None:
        schedule = self._schedule(name)
        self._call(f"delete {schedule.resource_name}", schedule.delete)

    def _schedule(self, name: str) -> Any:
        from google.cloud import aiplatform

        target = self.target
        init_vertex(target)
        return self._call(
            f"get schedule {name}",
            lambda: aiplatform.PipelineJobSchedule.get(
                name, project=target.project, location=target.region, credentials=vertex_credentials(target)
            ),
        )

    def _call(self, what: str, call: Any) -> Any:
        from google.api_core import exceptions as api_exceptions

        where = f"projects/{self.target.project}/locations/{self.target.region}"
        # Reads, pauses, resumes and deletes: repeating one does no harm.
        try:
            return vertex_call(self.target, f"{what} in {where}", call)
        except SubmissionError:
            raise
        except api_exceptions.NotFound as exc:
            raise GnnflowError(f"cannot {what}: not found in projects/{self.target.project}/locations/{self.target.region}") from exc
        except ValueError as exc:  # the SDK's check of a malformed resource name
            raise GnnflowError(f"cannot {what}: {exc}") from exc
        except Exception as exc:  # noqa: BLE001
            raise SubmissionError(f"Vertex AI failed to {what}: {api_message(exc)}", is_retryable(exc)) from exc


def _info(schedule: Any) -> ScheduleInfo:
    resource = schedule.gca_resource
    return ScheduleInfo(resource.name, resource.display_name, resource.state.name, resource.cron)
