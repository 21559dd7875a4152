"""`gnnflow schedule`: Vertex AI schedules and KFP recurring runs, through the real clients,
against a local recording endpoint (inputs on the GCS emulator)."""

from __future__ import annotations

import datetime

import pytest

from components import storage
from components.errors import GnnflowError
from pipelines.cli import main as gnnflow
from pipelines.schedule import ScheduleOptions, validate_cron
from tests.recording_server import RecordingServer

STEPS = {"preprocess", "serialize", "partition", "train", "infer", "report"}
LOCATION = "projects/demo-project/locations/us-central1"
SCHEDULES = f"/v1/{LOCATION}/schedules"


# The session's GCS emulator also points metadata, gRPC proxy and GCE lookups at a closed
# loopback port (conftest's _GCS_TEST_ENVIRONMENT): nothing here can leave the machine.
pytestmark = pytest.mark.usefixtures("gcs_emulator")


def vertex(recorder: RecordingServer) -> list[str]:
    return ["--project", "demo-project", "--region", "us-central1", "--api-endpoint", recorder.url]


def test_vertex_schedule_carries_cron_zone_limits_account_labels_and_the_config_uri(recorder, gcs_bucket, config_uri, package, capsys):
    assert (
        gnnflow(
            [
                "schedule",
                "create",
                "--config",
                config_uri,
                "--package",
                package,
                "--cron",
                "0 3 * * MON-FRI",
                "--time-zone",
                "Europe/Berlin",
                "--max-concurrent-runs",
                "2",
                "--max-run-count",
                "30",
                "--start-time",
                "2030-01-01T06:00",
                "--end-time",
                "2030-06-30T00:00:00Z",
                "--allow-queueing",
                "--display-name",
                "weekday-training",
                "--set",
                "training.epochs=7",
                "--label",
                "team=graphs",
                "--pipeline-root",
                f"gs://{gcs_bucket}/root",
                "--service-account",
                "runner@demo-project.iam.gserviceaccount.com",
                *vertex(recorder),
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.strip() == f"{LOCATION}/schedules/1"

    [post] = recorder.seen("POST", SCHEDULES)
    schedule = post.json
    assert schedule["displayName"] == "weekday-training"
    assert schedule["cron"] == "TZ=Europe/Berlin 0 3 * * MON-FRI"
    assert schedule["maxConcurrentRunCount"] == "2" and schedule["maxRunCount"] == "30"
    assert schedule["allowQueueing"] is True
    assert schedule["startTime"] == "2030-01-01T05:00:00Z"  # 06:00 in Berlin
    assert schedule["endTime"] == "2030-06-30T00:00:00Z"
    request = schedule["createPipelineJobRequest"]
    assert request["parent"] == LOCATION
    job = request["pipelineJob"]
    assert job["serviceAccount"] == "runner@demo-project.iam.gserviceaccount.com"
    assert job["labels"] == {"team": "graphs"}
    assert job["runtimeConfig"]["gcsOutputDirectory"] == f"gs://{gcs_bucket}/root"
    assert job["runtimeConfig"]["parameterValues"] == {
        "config": config_uri,
        "overrides": '{"training.epochs": 7}',
        "data_version": "",
        "infer_mode": "auto",
    }
    tasks = job["pipelineSpec"]["root"]["dag"]["tasks"]
    assert set(tasks) == STEPS and job["pipelineSpec"]["pipelineInfo"]["name"] == "gnnflow"
    # the parameters never change between scheduled runs, so caching is off unless asked for
    assert [t["cachingOptions"] for t in tasks.values()] == [{"enableCache": False}] * 6


def test_embedded_config_and_cache_on_request(recorder, gcs_bucket, config_uri, package):
    assert (
        gnnflow(
            [
                "schedule",
                "create",
                "--config",
                config_uri,
                "--package",
                package,
                "--cron",
                "*/30 * * * *",
                "--embed-config",
                "--cache",
                "--pipeline-root",
                f"gs://{gcs_bucket}/root",
                *vertex(recorder),
            ]
        )
        == 0
    )
    job = recorder.seen("POST", SCHEDULES)[0].json["createPipelineJobRequest"]["pipelineJob"]
    assert job["runtimeConfig"]["parameterValues"]["config"].startswith("graph:\n")
    assert {t["cachingOptions"]["enableCache"] for t in job["pipelineSpec"]["root"]["dag"]["tasks"].values()} == {True}
    assert recorder.seen("POST", SCHEDULES)[0].json["cron"] == "TZ=UTC */30 * * * *"


def test_vertex_list_pause_resume_delete_hit_the_schedule(recorder, gcs_bucket, config_uri, package, capsys):
    assert (
        gnnflow(
            [
                "schedule",
                "create",
                "--config",
                config_uri,
                "--package",
                package,
                "--cron",
                "0 3 * * *",
                "--display-name",
                "nightly",
                "--pipeline-root",
                f"gs://{gcs_bucket}/root",
                *vertex(recorder),
            ]
        )
        == 0
    )
    capsys.readouterr()
    name = f"{LOCATION}/schedules/1"

    assert gnnflow(["schedule", "pause", "1", *vertex(recorder)]) == 0
    assert recorder.seen("POST", f"/v1/{name}:pause")
    assert gnnflow(["schedule", "list", *vertex(recorder)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{name}\tnightly\tPAUSED\tTZ=UTC 0 3 * * *"]
    assert recorder.seen("GET", SCHEDULES)

    assert gnnflow(["schedule", "resume", name, *vertex(recorder)]) == 0
    [resume] = recorder.seen("POST", f"/v1/{name}:resume")
    assert not (resume.json or {}).get("catchUp")
    assert gnnflow(["schedule", "list", *vertex(recorder)]) == 0
    assert "\tACTIVE\t" in capsys.readouterr().out

    assert gnnflow(["schedule", "delete", name, *vertex(recorder)]) == 0
    assert recorder.seen("DELETE", f"/v1/{name}")
    assert gnnflow(["schedule", "list", *vertex(recorder)]) == 0
    assert capsys.readouterr().out == ""
    assert gnnflow(["schedule", "pause", "1", *vertex(recorder)]) == 2
    assert f"cannot get schedule 1: not found in {LOCATION}" in capsys.readouterr().err


def test_kfp_recurring_run_and_its_lifecycle(recorder, config_uri, package, capsys):
    kfp = ["--kfp-host", recorder.url, "--experiment", "nightly"]
    assert (
        gnnflow(
            [
                "schedule",
                "create",
                "--config",
                config_uri,
                "--package",
                package,
                "--cron",
                "15 2 * * 0",
                "--max-concurrent-runs",
                "3",
                "--start-time",
                "2030-01-01T00:00:00+00:00",
                "--display-name",
                "weekly",
                "--service-account",
                "pipeline-runner",
                *kfp,
            ]
        )
        == 0
    )
    recurring_id = capsys.readouterr().out.split()[-1]
    assert recurring_id.startswith("recurring-")
    [experiment] = recorder.seen("POST", "/apis/v2beta1/experiments")
    assert experiment.json["display_name"] == "nightly"
    [post] = recorder.seen("POST", "/apis/v2beta1/recurringruns")
    body = post.json
    assert body["display_name"] == "weekly" and body["mode"] == "ENABLE"
    assert body["trigger"]["cron_schedule"]["cron"] == "0 15 2 * * 0"  # KFP's cron starts with seconds
    assert body["trigger"]["cron_schedule"]["start_time"].startswith("2030-01-01T00:00:00")
    assert body["max_concurrency"] == 3 and body["no_catchup"] is True
    assert body["service_account"] == "pipeline-runner"
    assert body["experiment_id"] == experiment.json.get("experiment_id", "experiment-1")
    assert set(body["pipeline_spec"]["pipeline_spec"]["root"]["dag"]["tasks"]) == STEPS  # then the platform spec (/dev/shm)
    assert body["runtime_config"]["parameters"]["config"] == config_uri
    assert body["runtime_config"]["parameters"]["data_version"] == ""

    assert gnnflow(["schedule", "pause", recurring_id, *kfp]) == 0
    assert recorder.seen("POST", f"/apis/v2beta1/recurringruns/{recurring_id}:disable")
    assert gnnflow(["schedule", "list", *kfp]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{recurring_id}\tweekly\tDISABLED\t0 15 2 * * 0"]
    assert gnnflow(["schedule", "resume", recurring_id, *kfp]) == 0
    assert recorder.seen("POST", f"/apis/v2beta1/recurringruns/{recurring_id}:enable")
    assert gnnflow(["schedule", "delete", recurring_id, *kfp]) == 0
    assert recorder.seen("DELETE", f"/apis/v2beta1/recurringruns/{recurring_id}")
    assert gnnflow(["schedule", "delete", recurring_id, *kfp]) == 2
    assert f"cannot delete recurring run {recurring_id}: not found" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--cron", "0 3 * *"], "has 4 fields; expected 5"),
        (["--cron", "0 0 3 * * *"], "has 6 fields; expected 5"),
        (["--cron", "61 3 * * *"], "minute value '61' is outside 0-59"),
        (["--cron", "0 3 * * MON-FOO"], "day of week value 'FOO' is outside 0-6"),
        (["--cron", "0 3 * * 5-1"], "day of week range '5-1' runs backwards"),
        (["--cron", "*/0 3 * * *"], "minute field '*/0' is not"),
        (["--cron", "TZ=UTC 0 3 * * *"], "give the time zone with --time-zone"),
        (["--cron", "0 3 * * *", "--time-zone", "Mars/Olympus"], "'Mars/Olympus' is not an IANA time zone"),
        (["--cron", "0 3 * * *", "--start-time", "2030-02-01T00:00Z", "--end-time", "2030-01-01T00:00Z"], "is not after --start-time"),
        (["--cron", "0 3 * * *", "--max-concurrent-runs", "0"], "--max-concurrent-runs must be at least 1"),
        (["--cron", "0 3 * * *", "--set", "model.layers=3"], "key 'model.layers' does not name a config field"),
    ],
)
def test_bad_schedules_fail_before_sending_anything(recorder, gcs_bucket, config_uri, package, capsys, extra, message):
    assert (
        gnnflow(
            [
                "schedule",
                "create",
                "--config",
                config_uri,
                "--package",
                package,
                *extra,
                "--pipeline-root",
                f"gs://{gcs_bucket}/root",
                *vertex(recorder),
            ]
        )
        == 2
    )
    assert message in capsys.readouterr().err
    assert not recorder.seen("POST")


def test_schedule_arguments_the_target_cannot_honour_are_errors(recorder, gcs_bucket, config_uri, package, tmp_path, capsys):
    kfp = ["--kfp-host", recorder.url]
    base = ["schedule", "create", "--config", config_uri, "--package", package, "--cron", "0 3 * * *"]
    assert gnnflow([*base, "--time-zone", "Asia/Tokyo", *kfp]) == 2
    assert "KFP recurring runs do not support --time-zone" in capsys.readouterr().err
    assert gnnflow([*base, "--max-run-count", "4", *kfp]) == 2
    assert "do not support --max-run-count" in capsys.readouterr().err
    assert gnnflow([*base, *vertex(recorder)]) == 2
    assert "Vertex AI needs --pipeline-root" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # argparse's own usage error
        gnnflow([*base, "--start-time", "next tuesday", *kfp])
    assert exit_info.value.code == 2
    assert "'next tuesday' is not an ISO 8601 time" in capsys.readouterr().err
    local = tmp_path / "config.yaml"
    local.write_text(storage.read_text(config_uri))
    assert gnnflow(["schedule", "create", "--config", str(local), "--package", package, "--cron", "0 3 * * *", *kfp]) == 2
    assert "a run that reads its config by URI needs a gs:// URI" in capsys.readouterr().err
    assert not recorder.seen("POST")


def test_cron_validation_and_naive_times_in_the_schedule_zone():
    assert validate_cron("  0   3 * *  1-5 ") == "0 3 * * 1-5"
    assert validate_cron("*/15 0-6/2 1,15 JAN-MAR,dec sun") == "*/15 0-6/2 1,15 JAN-MAR,dec sun"
    with pytest.raises(GnnflowError, match="a step needs \\* or a range"):
        validate_cron("5/10 * * * *")
    options = ScheduleOptions(cron="0 3 * * *", time_zone="America/New_York", start_time=datetime.datetime(2030, 7, 1, 9))
    assert options.start_time.astimezone(datetime.UTC).hour == 13
