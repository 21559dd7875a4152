"""Beam pipeline options from ``preprocess.beam``: FnApiRunner processes here, or a Dataflow job."""

from __future__ import annotations

import datetime as dt

from components.config import BeamSpec
from components.errors import GnnflowError


def job_name(prefix: str, step: str, now: dt.datetime | None = None) -> str:
    """A Dataflow job name (lower case, digits, dashes; unique per second)."""
    now = now or dt.datetime.now(dt.UTC)
    return f"{prefix}-{step}-{now:%Y%m%d-%H%M%S}"


def pipeline_options(spec: BeamSpec, step: str, image: str | None = None) -> dict[str, object]:
    """Keyword arguments for ``PipelineOptions``.

    Args:
        spec: the Beam section of the config.
        step: the step the pipeline belongs to (names the Dataflow job).
        image: the step image, used as Dataflow's SDK container when the config names none.
    """
    common: dict[str, object] = {"save_main_session": False, "pickle_library": "cloudpickle"}
    if spec.runner == "local":
        # One worker runs inside this process: no worker process to start, and what this
        # process set up (the BigQuery emulator endpoints) holds for the worker as well.
        mode = "in_memory" if spec.num_workers == 1 else "multi_processing"
        from components.beam_pipeline.bigquery_endpoints import worker_plugins  # loads the BigQuery clients

        return common | {"direct_num_workers": spec.num_workers, "direct_running_mode": mode, "beam_plugins": worker_plugins()}
    flow = spec.dataflow
    container = flow.sdk_container_image or image
    if not container or "/" not in container:
        raise GnnflowError(
            f"{step}: preprocess.beam.runner is dataflow, but no worker image is known ({container!r}): set "
            "preprocess.beam.dataflow.sdk_container_image to the step image (REGISTRY/PATH/gnnflow:TAG), "
            "or run the step from a pipeline compiled with --image"
        )
    assert flow.project is not None and flow.temp_location is not None  # BeamSpec validates these
    temp = flow.temp_location.rstrip("/")
    options: dict[str, object] = common | {
        "runner": "DataflowRunner",
        "project": flow.project,
        "region": flow.region,
        "job_name": job_name(flow.job_name_prefix, step),
        "temp_location": temp,
        "staging_location": (flow.staging_location or f"{temp}/staging").rstrip("/"),
        "machine_type": flow.machine_type,
        "max_num_workers": flow.max_num_workers,
        "sdk_container_image": container,
        # The image already holds gnnflow and the pinned lock: nothing is staged or installed.
        "sdk_location": "container",
        "use_public_ips": flow.use_public_ips,
    }
    optional = {
        "num_workers": flow.num_workers,
        "disk_size_gb": flow.disk_size_gb,
        "service_account_email": flow.service_account,
        "network": flow.network,
        "subnetwork": flow.subnetwork,
        "dataflow_endpoint": flow.dataflow_endpoint,
    }
    if (flow.dataflow_endpoint or "").startswith("http://"):
        # A plain-HTTP endpoint is a local stand-in (a test recorder): no Google credentials,
        # as for the Vertex AI and GCS clients.
        options["no_auth"] = True
    return options | {k: v for k, v in optional.items() if v is not None}
