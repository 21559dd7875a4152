"""Where the steps run: workers, Vertex AI CustomJobs, task requests; and where a run writes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field, field_validator, model_validator

from components.config.sections import _Section
from components.errors import GnnflowError
from components.warehouse.table_ref import BigQueryDataset, parse_dataset

StepName = Literal["preprocess", "serialize", "partition", "train", "infer", "report", "export"]
MULTI_WORKER_STEPS: tuple[StepName, ...] = ("partition", "train", "infer")  # those that run world_size workers
# A replica on a fresh node first pulls the 8 GB step image (several minutes) while its peers
# already wait at the rendezvous: 15 minutes is the least that survives that, with room to spare.
DEFAULT_RENDEZVOUS_TIMEOUT_S = 1200.0
# Longer than any step spends between two marks of progress on a healthy worker (a batch, a shard,
# a round of a collective), short enough that a hung job is noticed within minutes, not hours.
DEFAULT_PROGRESS_TIMEOUT_S = 300.0
DEFAULT_RPC_TIMEOUT_S = 300.0  # GLT's RPC calls (feature and neighbour requests to peers)
# Long enough to ride out a service's brief outage or a slow first connection from a fresh node,
# short enough that a step pointed at the wrong endpoint fails within minutes, not hours.
DEFAULT_SERVICE_DEADLINE_S = 180.0
BootDiskType = Literal["pd-ssd", "pd-standard", "hyperdisk-balanced"]  # what Vertex AI's DiskSpec takes


@dataclass(frozen=True)
class WorkerTimeouts:
    """How long the workers of a multi-worker step wait, in seconds (``resources.*_timeout_s``)."""

    rendezvous_s: float = DEFAULT_RENDEZVOUS_TIMEOUT_S
    progress_s: float = DEFAULT_PROGRESS_TIMEOUT_S
    rpc_s: float = DEFAULT_RPC_TIMEOUT_S


DEFAULT_TIMEOUTS = WorkerTimeouts()


class TaskRequests(_Section):
    """What one pipeline task (the container that runs a step) asks of the cluster.

    KFP writes these into the compiled pipeline spec, so they take effect at compile time
    (``gnnflow compile --config``); in a run's config parameter they are read but not applied.
    Each value is set as both the Kubernetes request and limit (Vertex AI picks the machine
    from the limits).
    """

    cpu: str | None = Field(None, pattern=r"^([0-9]*[.])?[0-9]+m?$", description="CPUs, as Kubernetes writes them: '4', '0.5', '500m'.")
    memory: str | None = Field(
        None, pattern=r"^[0-9]+(E|Ei|P|Pi|T|Ti|G|Gi|M|Mi|K|Ki)?$", description="Memory, as Kubernetes writes it: '16G', '512Mi'."
    )
    accelerator_type: str | None = Field(
        None, min_length=1, description="Accelerator: 'NVIDIA_TESLA_T4', 'NVIDIA_L4' (Vertex AI) or 'nvidia.com/gpu' (KFP on Kubernetes)."
    )
    accelerator_count: int | None = Field(None, ge=1, description="Accelerators per task (1 when only accelerator_type is given).")

    @model_validator(mode="after")
    def _count_needs_type(self) -> TaskRequests:
        if self.accelerator_count is not None and self.accelerator_type is None:
            raise ValueError("accelerator_count needs accelerator_type")
        return self

    def overridden_by(self, other: TaskRequests) -> TaskRequests:
        """These requests with every field that ``other`` sets taken from ``other``."""
        return self.model_copy(update=other.model_dump(exclude_unset=True, exclude_none=True))


class CustomJobSpec(_Section):
    """How a multi-worker step (partition, train, infer) runs when ``resources.runner`` is vertex.

    The pipeline is compiled with the step as a Vertex AI CustomJob (google-cloud-pipeline-components'
    ``create_custom_training_job_from_component``), which Vertex AI Pipelines launches, tracks and
    cancels with the run, in the pipeline's project and region: ``world_size /
    processes_per_replica`` replicas of the step image (a chief pool of one replica, a worker pool
    of the rest). These fields shape the job, so they take effect at compile time
    (``gnnflow compile --config``; ``gnnflow submit`` compiles from the config it is given).
    """

    machine_type: str = Field("n1-standard-8", min_length=1, description="Compute Engine machine type of every replica.")
    accelerator_type: str | None = Field(None, min_length=1, description="Accelerator of every replica, e.g. NVIDIA_TESLA_T4; null: none.")
    accelerator_count: int = Field(1, ge=1, description="Accelerators per replica (with accelerator_type).")
    boot_disk_gb: int = Field(100, ge=10, description="Boot disk of every replica, in GB.")
    boot_disk_type: BootDiskType | None = Field(
        None,
        description="Boot disk type of every replica; default: pd-ssd, or hyperdisk-balanced on machine families that "
        "take only Hyperdisk (a3-ultragpu, a4, c4, n4, ...).",
    )
    service_account: str | None = Field(None, description="Service account the replicas run as; default: the Vertex AI default.")
    network: str | None = Field(None, description="VPC network to peer with (projects/N/global/networks/NAME); default: none.")
    timeout_s: int | None = Field(None, gt=0, description="Longest one step's job may run, in seconds; default: Vertex AI's (7 days).")
    max_wait_s: int | None = Field(
        None,
        ge=0,
        description="With resources.strategy flex_start: longest the job waits for capacity before it fails, in seconds "
        "(0: no limit); default: Vertex AI's (24 hours).",
    )
    restart_job_on_worker_restart: bool = Field(
        True,
        description="Restart every replica when one restarts (a distributed step cannot continue without a rank); "
        "train resumes from its checkpoint.",
    )
    tensorboard: str | None = Field(
        None,
        pattern=r"^projects/[^/]+/locations/[^/]+/tensorboards/[^/]+$",
        description="Vertex AI TensorBoard (projects/P/locations/L/tensorboards/ID) that train's CustomJob uploads its curves to; "
        "it gives train's job a per-run output directory, so train is then never taken from the cache. Default: none; "
        "needs service_account (Vertex AI uploads the curves as that account).",
    )

    @model_validator(mode="after")
    def _tensorboard_needs_account(self) -> CustomJobSpec:
        if self.tensorboard and not self.service_account:
            raise ValueError(
                "resources.custom_job.tensorboard needs resources.custom_job.service_account: Vertex AI refuses a CustomJob "
                "with a TensorBoard and no service account (give one that may write to the TensorBoard and the pipeline root)"
            )
        return self


class ThreadsSpec(_Section):
    """Overrides of the thread policy (components/runtime/threads.py); null: derived from the cores."""

    cores: int | None = Field(
        None, gt=0, description="Cores a replica's workers share; null: those the process may run on (CPU affinity, cgroup quota)."
    )
    compute: int | None = Field(
        None,
        gt=0,
        description="torch intra-op threads per worker; null: its share of the cores (cores / local workers), less one core "
        "for GLT's RPC thread with collocated sampling, less the sampling subprocesses with multiprocess sampling.",
    )
    faiss: int | None = Field(None, gt=0, description="faiss threads per infer worker (retrieval); null: its share of the cores.")
    readers: int | None = Field(
        None, gt=0, description="pyarrow's threads for reading and decoding tables, per worker; null: its share of the cores."
    )


DERIVED_THREADS = ThreadsSpec()  # every count derived from the cores


class ResourcesSpec(_Section):
    """Workers, where multi-worker steps run, and what each pipeline task requests."""

    world_size: int = Field(1, ge=1, description="Workers of the multi-worker steps (partition, train, infer).")
    processes_per_replica: int = Field(1, ge=1, description="On a cluster: worker processes per replica (machine).")
    runner: Literal["local", "vertex"] = Field(
        "local",
        description="Where a pipeline's multi-worker steps run (compile time): local: world_size processes inside the "
        "step's own task; vertex: a Vertex AI CustomJob of world_size / processes_per_replica replicas (see custom_job).",
    )
    strategy: Literal["standard", "spot", "flex_start"] = Field(
        "standard",
        description="With runner vertex: how the CustomJob replicas get their machines (Vertex AI scheduling.strategy): "
        "standard (on demand), spot (Spot VMs: cheaper, preemptible; every replica restarts after a preemption and "
        "train resumes from its checkpoint, so custom_job.restart_job_on_worker_restart must stay true) or flex_start "
        "(Dynamic Workload Scheduler: the job waits up to custom_job.max_wait_s for capacity).",
    )
    rendezvous_timeout_s: float = Field(
        DEFAULT_RENDEZVOUS_TIMEOUT_S,
        gt=0,
        description="How long the workers of a multi-worker step wait for each other to join (torch.distributed's "
        "rendezvous, also its collectives' timeout). The default, 20 minutes, covers replicas that first pull the "
        "multi-GB step image on a fresh node.",
    )
    progress_timeout_s: float = Field(
        DEFAULT_PROGRESS_TIMEOUT_S,
        gt=0,
        description="A worker of a multi-worker step that makes no progress (a batch, a shard, a collective) for this "
        "long fails the step, named with its host and phase, and every worker is stopped: a stopped or hung peer ends "
        "the job instead of leaving the others waiting. Waiting at the rendezvous counts against rendezvous_timeout_s.",
    )
    rpc_timeout_s: float = Field(
        DEFAULT_RPC_TIMEOUT_S,
        gt=0,
        description="GLT's RPC timeout (init_rpc and the sampling workers' options): how long a request to a peer "
        "(features, neighbours) may take before it fails.",
    )
    shm_size: str = Field(
        "8Gi",
        pattern=r"^[0-9]+(E|Ei|P|Pi|T|Ti|G|Gi|M|Mi|K|Ki)?$",
        description="Size of the in-memory volume the compiled pipeline mounts at /dev/shm for the multi-worker steps "
        "(partition, train, infer) on KFP (Kubernetes), as Kubernetes writes sizes: '8Gi'. A pod's own /dev/shm is "
        "64 MiB, too small for the feature tables, embedding shards and sampling channel a worker places there; "
        "each worker checks the free space of /dev/shm before loading and names the size it needs (compile time).",
    )
    service_deadline_s: float = Field(
        DEFAULT_SERVICE_DEADLINE_S,
        gt=0,
        description="How long a step keeps retrying a cloud service that does not answer (Cloud Storage, BigQuery "
        "REST and Storage Read, the Vertex AI and KFP APIs, a Beam job's service) before it fails naming the URI and "
        "the endpoint. The environment variable GNNFLOW_SERVICE_DEADLINE_S overrides it (and applies where no config "
        "is read yet, such as reading the config itself).",
    )
    reuse_freed_memory: bool = Field(
        True,
        description="Train and infer keep memory they free for their next batches instead of returning it to the OS "
        "(glibc: no mmap for large blocks, no heap trim) once their data is loaded: faster batches; RSS stays at its peak.",
    )
    threads: ThreadsSpec = Field(
        default_factory=ThreadsSpec, description="How a replica's cores are split between threads (derived; override here)."
    )
    requests: TaskRequests = Field(default_factory=TaskRequests, description="Requests of every pipeline task (compile time).")
    step_requests: dict[StepName, TaskRequests] = Field(
        default_factory=dict, description="Per step (preprocess, ..., report): requests that replace those in `requests` (compile time)."
    )
    custom_job: CustomJobSpec = Field(
        default_factory=CustomJobSpec, description="The Vertex AI CustomJob of multi-worker steps when runner is vertex."
    )

    @model_validator(mode="after")
    def _replicas_whole(self) -> ResourcesSpec:
        if self.runner == "vertex" and self.world_size % self.processes_per_replica:
            raise ValueError(
                f"world_size {self.world_size} is not a multiple of processes_per_replica {self.processes_per_replica}: "
                "a CustomJob needs a whole number of replicas"
            )
        if self.strategy != "standard" and self.runner != "vertex":
            raise ValueError(
                f"resources.strategy {self.strategy} applies to CustomJob replicas (resources.runner: vertex); "
                f"with runner {self.runner} the workers run inside the pipeline's own task"
            )
        if self.strategy == "spot" and not self.custom_job.restart_job_on_worker_restart:
            raise ValueError(
                "resources.strategy spot needs resources.custom_job.restart_job_on_worker_restart true: a preempted "
                "replica is a missing rank, and only a restart of every replica lets train resume from its checkpoint"
            )
        if self.custom_job.max_wait_s is not None and self.strategy != "flex_start":
            raise ValueError(f"resources.custom_job.max_wait_s applies to resources.strategy flex_start, not {self.strategy}")
        if self.runner == "vertex" and (steps := [s for s in MULTI_WORKER_STEPS if s in self.step_requests]):
            raise ValueError(
                f"step_requests.{steps[0]} does not apply with runner vertex: the replicas of {', '.join(steps)} "
                "run on custom_job.machine_type (and its accelerators), not in the pipeline task"
            )
        return self

    @property
    def worker_timeouts(self) -> WorkerTimeouts:
        return WorkerTimeouts(self.rendezvous_timeout_s, self.progress_timeout_s, self.rpc_timeout_s)

    @property
    def replica_count(self) -> int:
        """Machines of a multi-worker step's CustomJob."""
        return max(1, self.world_size // self.processes_per_replica)

    def requests_for(self, step: StepName) -> TaskRequests:
        """The requests of one step's pipeline task: ``requests``, then the step's own."""
        own = self.step_requests.get(step)
        return self.requests.overridden_by(own) if own is not None else self.requests

    def accelerator_requests(self) -> list[tuple[str, str]]:
        """(config key, accelerator type) of every accelerator this section asks for: the tasks'
        ``requests``, each step's ``step_requests`` and the CustomJob replicas'."""
        found = [("resources.requests.accelerator_type", self.requests.accelerator_type)]
        found += [(f"resources.step_requests.{step}.accelerator_type", own.accelerator_type) for step, own in self.step_requests.items()]
        found.append(("resources.custom_job.accelerator_type", self.custom_job.accelerator_type))
        return [(key, kind) for key, kind in found if kind is not None]


class OutputSpec(_Section):
    root: str = Field("runs", description="Run root: local path or gs:// URI under which each step writes its output.")
    bigquery: str | None = Field(
        None,
        description="BigQuery dataset (project.dataset) that step export writes the run's results to: a table per node "
        "type and kind (<type>_embeddings, <type>_predictions, <type>_candidates), keyed by the original ids, with a "
        "run_id column. The dataset must exist. Default (null): no BigQuery output.",
    )
    bigquery_write: Literal["replace", "append"] = Field(
        "replace",
        description="How export writes each table: replace (afterwards it holds this run's rows only) or append (this "
        "run's rows replace any earlier rows of the same run id, other runs' rows stay).",
    )
    vector_search: bool = Field(
        False,
        description="Step export also writes every embedding in Vertex AI Vector Search's batch input format (JSON lines "
        "with node_type and class restricts, one folder) for `gnnflow vector-index`.",
    )

    @field_validator("bigquery")
    @classmethod
    def _dataset_syntax(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            return str(parse_dataset(value))
        except GnnflowError as exc:
            raise ValueError(str(exc)) from None

    @property
    def bigquery_dataset(self) -> BigQueryDataset | None:
        """``bigquery`` as a typed dataset reference (None when unset)."""
        return parse_dataset(self.bigquery) if self.bigquery else None

    @property
    def exports(self) -> bool:
        """Whether a run has an export step (BigQuery tables or a Vector Search folder)."""
        return self.bigquery is not None or self.vector_search
