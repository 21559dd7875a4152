"""``gnnflow local-job``: one CustomJob task of a compiled Vertex pipeline, run here as Vertex AI would start it.

Vertex AI's own local run covers single-replica jobs only; this starts every replica of the
task's worker pools (``--processes``, the default, or ``--containers`` of the step image) with
the environment and command Vertex AI would give them, so what runs is what would be submitted.
Artifacts live under ``--root`` (a local folder or ``gs://``): an input artifact defaults to
``ROOT/<producing task>/<its output name>`` and an output to ``ROOT/<task>/<output name>``, the
layout a chain of local jobs shares; ``--input``/``--output NAME=URI`` place one elsewhere.
A SIGTERM to the local job reaches every replica, as Vertex AI sends it to each replica's
container, and the job exits with their status: 75 when train was preempted and a rerun of the
same command resumes from its checkpoint (:mod:`pipelines.local_job.termination`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import Any

import yaml

from components import storage
from components.config import load_config, resolve_config
from components.errors import GnnflowError
from components.runtime import pipeline_task
from pipelines.arguments import key_value_pairs, parse_set
from pipelines.local_job.replicas import ContainerReplicas, ProcessReplicas, Replica, Runtime, run_replicas, vertex_environment
from pipelines.local_job.spec import JobTask, executor_input, read_job_task, replica_argv
from pipelines.local_job.termination import DEFAULT_GRACE_S

DEFAULT_SHM_SIZE = "2g"


@dataclass(frozen=True)
class LocalJobResult:
    """What the chief wrote as the task's executor output, and where the artifacts are."""

    task: str
    replicas: int
    outputs: dict[str, str]  # artifact name → URI
    metadata: dict[str, dict[str, Any]]  # artifact name → the metadata the chief put on it
    seconds: float


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "local-job",
        help="run one multi-replica (CustomJob) task of a compiled Vertex pipeline here, as Vertex AI would start its replicas",
    )
    parser.add_argument("pipeline", help="the compiled pipeline YAML (gnnflow compile with resources.runner: vertex)")
    parser.add_argument("--task", required=True, help="the task to run: partition, train or infer")
    parser.add_argument("--root", required=True, help="where the task's artifacts are (local folder or gs://)")
    parser.add_argument("--config", help="the pipeline's config parameter, from this file (relative table paths resolved)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="the overrides parameter (repeatable)")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="another pipeline parameter (repeatable)")
    parser.add_argument("--input", action="append", default=[], metavar="NAME=URI", help="an input artifact's URI (repeatable)")
    parser.add_argument("--output", action="append", default=[], metavar="NAME=URI", help="an output artifact's URI (repeatable)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--processes", dest="containers", action="store_false", help="replicas as local processes (default)")
    mode.add_argument("--containers", dest="containers", action="store_true", help="replicas as containers of the step image")
    parser.add_argument("--image", help="--containers: run this image instead of the one the spec names (a local build)")
    parser.add_argument("--engine", default="podman", help="--containers: podman (default) or docker")
    parser.add_argument("--shm-size", default=DEFAULT_SHM_SIZE, help=f"--containers: /dev/shm of each replica (default {DEFAULT_SHM_SIZE})")
    parser.add_argument("--env", action="append", default=[], metavar="NAME[=VALUE]", help="--containers: pass a variable (repeatable)")
    parser.add_argument("--timeout-s", type=float, help="stop the job after this long (default: the job's own timeout)")
    parser.add_argument(
        "--grace-s",
        type=float,
        default=DEFAULT_GRACE_S,
        help=f"on SIGTERM, how long the replicas have to exit after it is passed on before they are killed (default {DEFAULT_GRACE_S:g})",
    )
    parser.set_defaults(handler=_command, containers=False)


def _command(args: argparse.Namespace) -> None:
    parameters: dict[str, Any] = key_value_pairs(args.param, "--param")
    if args.config:
        parameters["config"] = load_config(args.config).to_yaml()
    if args.set:
        parameters["overrides"] = json.dumps(parse_set(args.set))
    result = run_local_job(
        args.pipeline,
        args.task,
        storage.parse_uri(args.root),
        parameters,
        inputs=key_value_pairs(args.input, "--input"),
        outputs=key_value_pairs(args.output, "--output"),
        containers=args.containers,
        image=args.image,
        engine=args.engine,
        shm_size=args.shm_size,
        environment=dict(_environment(args.env)),
        timeout_s=args.timeout_s,
        grace_s=args.grace_s,
    )
    print(summary(result))


def run_local_job(
    pipeline_uri: str,
    task: str,
    root: storage.Uri,
    parameters: dict[str, Any],
    *,
    inputs: dict[str, str] | None = None,
    outputs: dict[str, str] | None = None,
    containers: bool = False,
    image: str | None = None,
    engine: str = "podman",
    shm_size: str = DEFAULT_SHM_SIZE,
    environment: dict[str, str] | None = None,
    timeout_s: float | None = None,
    grace_s: float = DEFAULT_GRACE_S,
) -> LocalJobResult:
    """Runs every replica of ``task`` and waits for them; returns the chief's executor output.

    What can be known before a replica starts is checked first: the task, its parameters, the
    config and overrides (and that they ask for the layout compiled), and that every input
    artifact is a published output. A SIGTERM while the replicas run is passed on to them, who
    get ``grace_s`` to exit (``termination.ReplicasStopped`` then carries the job's status).
    """
    if grace_s < 0:
        raise GnnflowError(f"--grace-s must be 0 or more, got {grace_s:g}")
    try:
        pipeline = yaml.safe_load(storage.read_text(storage.parse_uri(pipeline_uri)))
    except yaml.YAMLError as exc:
        raise GnnflowError(f"{pipeline_uri} is not a pipeline YAML: {exc}") from None
    if not isinstance(pipeline, dict) or "root" not in pipeline:
        raise GnnflowError(f"{pipeline_uri} is not a compiled KFP pipeline (no root DAG)")
    run_id = f"local-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    placeholders = {
        "{{$.pipeline_root}}": str(root).rstrip("/"),
        "{{$.pipeline_job_uuid}}": run_id,
        "{{$.pipeline_job_name}}": run_id,
        "{{$.pipeline_google_cloud_project_id}}": "local",
        "{{$.pipeline_google_cloud_location}}": "local",
    }
    job = read_job_task(pipeline, task, parameters, placeholders)
    _check_parameters(job)
    unknown = sorted((set(inputs or {}) - set(job.inputs)) | {f"{n} (output)" for n in set(outputs or {}) - set(job.outputs)})
    if unknown:
        raise GnnflowError(
            f"task {task!r} has no artifact {', '.join(unknown)}: inputs {sorted(job.inputs)}, outputs {sorted(job.outputs)}"
        )
    input_uris = {name: (inputs or {}).get(name) or str(root.join(f"{ref.producer}/{ref.output_key}")) for name, ref in job.inputs.items()}
    for uri in input_uris.values():
        storage.open_published(uri)  # fails naming the URI when nothing was published there
    output_uris = {name: (outputs or {}).get(name) or str(root.join(f"{task}/{name}")) for name in job.outputs}
    base_output = job.base_output_directory or str(root.join(f"{task}/custom-job"))

    with tempfile.TemporaryDirectory(prefix="gnnflow-local-job-") as exchange:
        os.chmod(exchange, 0o777)  # container users write the executor output here
        names = [f"{pool.name}-{index}" for pool in job.pools for index in range(pool.replica_count)]
        runtime: Runtime
        if containers:
            runtime = ContainerReplicas(engine, f"gnnflow-{run_id}", exchange, shm_size, passed_environment=environment or {})
            _check_image(engine, image or job.pools[0].image_uri)
        else:
            runtime = ProcessReplicas()
        hosts = runtime.hosts(names, _free_port_pairs(len(names)))
        cluster: dict[str, list[str]] = {}
        position = 0
        for pool in job.pools:
            cluster[pool.name] = hosts[position : position + pool.replica_count]
            position += pool.replica_count
        output_file = os.path.join(exchange, "executor_output.json")
        executor = executor_input(job, input_uris, output_uris, output_file)
        replicas = [
            Replica(
                pool.name,
                index,
                cluster[pool.name][index],
                tuple(replica_argv(pool, executor)),
                vertex_environment(job, cluster, pool.name, index, base_output),
                image or pool.image_uri,
            )
            for pool in job.pools
            for index in range(pool.replica_count)
        ]
        how = "containers" if containers else "processes"
        print(f"local-job {task}: {len(replicas)} replica(s) as {how} ({', '.join(r.name for r in replicas)}), run {run_id}", flush=True)
        started = time.perf_counter()
        gcs_before = _gcs_folders()
        try:
            run_replicas(
                runtime, replicas, timeout_s if timeout_s is not None else job.timeout_s, label=f"local-job {task}", grace_s=grace_s
            )
        finally:
            _remove_new_empty_folders(gcs_before)
        if not os.path.exists(output_file):
            raise GnnflowError(f"task {task!r}: workerpool0 finished but wrote no executor output ({output_file})")
        with open(output_file) as file:
            written = json.load(file).get("artifacts", {})
    metadata = {name: dict(entry["artifacts"][0].get("metadata", {})) for name, entry in written.items()}
    return LocalJobResult(task, len(replicas), output_uris, metadata, time.perf_counter() - started)


def summary(result: LocalJobResult) -> str:
    lines = [f"local-job {result.task}: {result.replicas} replica(s) done in {result.seconds:.1f} s"]
    for name, uri in result.outputs.items():
        lines.append(f"  {name:<10} {uri}")
        numbers = {
            k: v for k, v in sorted(result.metadata.get(name, {}).items()) if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        if numbers:
            lines.append("             " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in numbers.items()))
    return "\n".join(lines)


def _check_parameters(job: JobTask) -> None:
    """The config and overrides resolve, and ask for the replicas the task was compiled with."""
    for needed in ("config", "overrides", "replicas"):
        if needed not in job.parameters:
            raise GnnflowError(f"task {job.task!r} has no {needed!r} parameter: is this a pipeline gnnflow compiled?")
    config = resolve_config(str(job.parameters["config"]), str(job.parameters["overrides"]))
    pipeline_task.check_compiled_layout(job.task, config, int(job.parameters["replicas"]))


def _check_image(engine: str, image: str) -> None:
    import subprocess

    found = subprocess.run([engine, "image", "exists", image], capture_output=True, check=False)
    if found.returncode:
        raise GnnflowError(f"--containers: {engine} has no image {image!r} here: build it (containers/check_image.sh) or give --image")


def _free_port_pairs(count: int) -> list[int]:
    """``count`` ports free now whose next port is free too (GLT's RPC listens on the master's + 1).

    They lie below the kernel's ephemeral range: the replicas bind them only after their imports,
    seconds later, and a port of that range may meanwhile become the local end of any outgoing
    connection on this machine (seen: "Address already in use" on a busy one). Below it, only an
    explicit bind takes a port.
    """
    low = _ephemeral_low()
    pool = list(range(max(_FIRST_UNPRIVILEGED, low - _PORTS_BELOW_EPHEMERAL), low - 1))
    random.SystemRandom().shuffle(pool)  # parallel local jobs start from different ports
    ports: list[int] = []
    for port in pool:
        if len(ports) == count:
            break
        if port in ports or port + 1 in ports or port - 1 in ports:
            continue
        if _bindable(port) and _bindable(port + 1):
            ports.append(port)
    if len(ports) < count:
        raise GnnflowError(f"no {count} free port pair(s) on 127.0.0.1 below the ephemeral range (from {low})")
    return ports


_FIRST_UNPRIVILEGED = 1024
_PORTS_BELOW_EPHEMERAL = 8000


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default 32768)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as file:
            return max(int(file.read().split()[0]), _FIRST_UNPRIVILEGED + 100)
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _gcs_folders() -> set[str]:
    """Folders under /gcs now: KFP's executor makes folders there for gs:// outputs (Vertex AI mounts Cloud Storage there)."""
    return {path for path, _, _ in os.walk("/gcs")} if os.path.isdir("/gcs") else set()


def _remove_new_empty_folders(before: set[str]) -> None:
    for path in sorted(_gcs_folders() - before, key=len, reverse=True):
        try:
            os.rmdir(path)
        except OSError:
            pass  # not empty: something was written there, leave it


def _environment(items: list[str]) -> list[tuple[str, str]]:
    """``--env NAME=VALUE``, or ``--env NAME`` for this environment's value."""
    found = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            if name not in os.environ:
                raise GnnflowError(f"--env {name}: not set here; give --env {name}=VALUE")
            value = os.environ[name]
        found.append((name, value))
    return found
