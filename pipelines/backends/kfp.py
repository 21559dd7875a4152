"""A KFP endpoint: runs through the KFP client, schedules as recurring runs."""

from __future__ import annotations

from typing import Any

from components.errors import GnnflowError
from pipelines import kfp_submit
from pipelines.kfp_submit import kfp_call, kfp_client
from pipelines.run_request import KfpTarget, PreparedRun, RunRequest, SubmissionError, SubmittedRun, api_message, is_retryable
from pipelines.schedule_spec import ScheduleInfo, ScheduleOptions


class KfpBackend:
    done_states = frozenset(kfp_submit.DONE_STATES)
    succeeded = kfp_submit.SUCCEEDED

    def __init__(self, target: KfpTarget) -> None:
        self.target = target

    def check_run(self, request: RunRequest) -> None:
        if request.labels:
            raise GnnflowError("labels are a Vertex AI feature; KFP runs have none (drop --label)")

    def submit(self, request: RunRequest, prepared: PreparedRun, package: str) -> SubmittedRun:
        return kfp_submit.submit_kfp(self.target, request, prepared, package)

    def poll(self, run: SubmittedRun) -> tuple[str, str]:
        subject = f"KFP run {run.name}"
        client = kfp_client(self.target, subject)
        got = kfp_call(self.target, subject, lambda: client.get_run(run.name))
        return str(got.state), (got.error.message if got.error else "") or ""

    def check_schedule(self, request: RunRequest, options: ScheduleOptions) -> None:
        unsupported = [
            flag
            for flag, used in (
                ("--time-zone", options.time_zone != "UTC"),
                ("--max-run-count", options.max_run_count),
                ("--allow-queueing", options.allow_queueing),
                ("--label", request.labels),
            )
            if used
        ]
        if unsupported:
            raise GnnflowError(f"KFP recurring runs do not support {', '.join(unsupported)} (Vertex AI schedules do; KFP crons run in UTC)")

    def create_schedule(self, request: RunRequest, prepared: PreparedRun, package: str, options: ScheduleOptions) -> ScheduleInfo:
        target = self.target
        subject = f"KFP recurring run {prepared.display_name!r} (experiment {target.experiment!r})"
        client = kfp_client(target, subject)
        try:
            experiment = kfp_call(target, subject, lambda: client.create_experiment(target.experiment, namespace=target.namespace))
            # A recurring run has no caller-chosen id: repeated only when the request never left this machine.
            created = kfp_call(target, subject, lambda: client.create_recurring_run(
                experiment_id=experiment.experiment_id,
                job_name=prepared.display_name,
                description=f"gnnflow, config {request.config}",
                start_time=options.start_time,
                end_time=options.end_time,
                cron_expression=f"0 {options.cron}",  # KFP's cron has a leading seconds field
                max_concurrency=options.max_concurrent_runs,
                no_catchup=not options.catch_up,
                params=prepared.parameters,
                pipeline_package_path=package,
                pipeline_root=target.pipeline_root,
                enable_caching=request.enable_caching,
                service_account=target.service_account,
            ), idempotent=False)  # fmt: skip
        except SubmissionError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise SubmissionError(
                f"KFP endpoint {target.host} refused recurring run {prepared.display_name!r}: {api_message(exc)}", is_retryable(exc)
            ) from exc
        return _info(created)

    def list_schedules(self) -> list[ScheduleInfo]:
        client = kfp_client(self.target, "KFP recurring runs")
        infos: list[ScheduleInfo] = []
        token = ""
        while True:
            page = self._call(
                "list recurring runs",
                lambda token=token: client.list_recurring_runs(page_token=token, page_size=100, namespace=self.target.namespace),
            )
            infos.extend(_info(r) for r in page.recurring_runs or [])
            token = page.next_page_token or ""
            if not token:
                return infos

    def pause(self, name: str) -> None:
        client = kfp_client(self.target, f"KFP recurring run {name}")
        self._call(f"disable recurring run {name}", lambda: client.disable_recurring_run(name))

    def resume(self, name: str, catch_up: bool) -> None:  # noqa: ARG002 (a recurring run's catch-up is set when it is created)
        client = kfp_client(self.target, f"KFP recurring run {name}")
        self._call(f"enable recurring run {name}", lambda: client.enable_recurring_run(name))

    def delete(self, name: str) -> None:
        client = kfp_client(self.target, f"KFP recurring run {name}")
        self._call(f"delete recurring run {name}", lambda: client.delete_recurring_run(name))

    def _call(self, what: str, call: Any) -> Any:
        try:
            return kfp_call(self.target, f"KFP: {what}", call)  # reads, enables, disables, deletes: safe to repeat
        except SubmissionError:
            raise
        except Exception as exc:  # noqa: BLE001
            if getattr(exc, "status", None) == 404:
                raise GnnflowError(f"cannot {what}: not found on {self.target.host}") from exc
            raise SubmissionError(f"KFP endpoint {self.target.host} failed to {what}: {api_message(exc)}", is_retryable(exc)) from exc


def _info(recurring: Any) -> ScheduleInfo:
    cron = recurring.trigger.cron_schedule.cron if recurring.trigger and recurring.trigger.cron_schedule else ""
    return ScheduleInfo(recurring.recurring_run_id, recurring.display_name or "", str(recurring.status or recurring.mode), cron)
