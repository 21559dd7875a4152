"""The run configuration: one YAML file validated into frozen, typed sections.

Every field has a default (documented in its ``description``); unknown keys and wrong types
are errors that name the key and the file. Relative local table paths are resolved against
the folder of the config file, so a config travels with its data.
"""

from __future__ import annotations

import json
import os
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from components import storage
from components.errors import GnnflowError

TaskType = Literal["node_classification", "link_prediction"]
Transform = Literal["standardize", "passthrough", "one_hot", "hashing"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FeatureSpec(_Section):
    """A group of columns that become features with one transform."""

    columns: list[str] = Field(min_length=1, description="Column names or glob patterns (`f*`).")
    transform: Transform = Field(
        "passthrough",
        description="standardize: (x - mean) / std with fitted statistics; passthrough: the number as is; "
        "one_hot: one slot per category seen in the data (up to max_categories, rest in an 'other' slot); "
        "hashing: num_buckets slots chosen by a stable hash of the value.",
    )
    on_missing: Literal["error", "fill"] = Field(
        "error", description="What an empty cell, NaN or inf does: stop with an error naming file, row and column, or take fill_value."
    )
    fill_value: float = Field(0.0, description="Value for missing numbers (before standardizing).")
    max_categories: int = Field(64, gt=0, description="one_hot: most frequent categories kept.")
    num_buckets: int = Field(32, gt=0, description="hashing: number of buckets.")


class NodeTableSpec(_Section):
    """One node type, read from one file or every file below a prefix."""

    type: str = Field("node", description="Node type name.")
    uri: str = Field(description="CSV, gzipped CSV or Parquet file, or a folder/prefix of such files; local or gs://.")
    format: Literal["auto", "csv", "parquet"] = Field("auto", description="auto: from the file extension.")
    id_column: str = Field("node_id", description="Column with the node id (any type; enumerated to 0..n-1).")
    label_column: str | None = Field(None, description="Class label column (empty cells: unlabeled).")
    split_column: str | None = Field(None, description="Column naming each node's split; random split when absent.")
    features: list[FeatureSpec] = Field(default_factory=list, description="Feature column groups, in output order.")


class EdgeTableSpec(_Section):
    """One edge type (source type, relation, destination type)."""

    type: str = Field("edge", description="Relation name.")
    uri: str = Field(description="CSV, gzipped CSV or Parquet file, or a folder/prefix of such files; local or gs://.")
    format: Literal["auto", "csv", "parquet"] = Field("auto", description="auto: from the file extension.")
    src_column: str = Field("src", description="Column with the source node id.")
    dst_column: str = Field("dst", description="Column with the destination node id.")
    src_type: str = Field("node", description="Node type of the sources.")
    dst_type: str = Field("node", description="Node type of the destinations.")
    undirected: bool = Field(True, description="Each row stands for both directions.")
    split_column: str | None = Field(None, description="Link prediction: column naming each edge's split.")
    on_unknown_endpoint: Literal["error", "drop"] = Field(
        "error", description="An endpoint missing from the node table: stop with an error naming the row, or drop the edge and count it."
    )
    features: list[FeatureSpec] = Field(default_factory=list, description="Edge feature column groups.")
    role: Literal["message", "positive_label", "negative_label"] = Field(
        "message",
        description="message: the edges messages flow over. positive_label / negative_label (link prediction): pairs "
        "(anchor, candidate) of the target's node types that supervise instead: positives to learn and score (their split "
        "column, or the random split; validation and test positives never carry messages) and hard negatives of their "
        "anchor (training.negatives: hard, and evaluation). Label tables are directed and have no features.",
    )

    @property
    def name(self) -> str:
        return f"{self.src_type}__{self.type}__{self.dst_type}"


class GraphSpec(_Section):
    nodes: list[NodeTableSpec] = Field(min_length=1, description="One entry per node type.")
    edges: list[EdgeTableSpec] = Field(min_length=1, description="One entry per edge type.")

    @model_validator(mode="after")
    def _types_consistent(self) -> "GraphSpec":
        names = [n.type for n in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError(f"node types must be unique, got {names}")
        for e in self.edges:
            for end in (e.src_type, e.dst_type):
                if end not in names:
                    raise ValueError(f"edge type {e.type!r} refers to node type {end!r}, not among {names}")
        edge_names = [e.name for e in self.edges]
        if len(set(edge_names)) != len(edge_names):
            raise ValueError(f"edge types must be unique, got {edge_names}")
        return self


class SplitSpec(_Section):
    """How nodes (classification) or edges (link prediction) are split."""

    train_value: str = Field("train", description="Split column value for training rows.")
    val_value: str = Field("val", description="Split column value for validation rows.")
    test_value: str = Field("test", description="Split column value for test rows.")
    none_values: list[str] = Field(
        default_factory=lambda: ["", "none"],
        description="Split column values that mean 'in no split' (an empty cell is ''); any other value outside "
        "train/val/test_value is an error naming file, row and value (a typo such as 'trian' is not silently unsplit).",
    )
    train: float = Field(0.8, ge=0, le=1, description="Random split: training fraction.")
    val: float = Field(0.1, ge=0, le=1, description="Random split: validation fraction.")
    test: float = Field(0.1, ge=0, le=1, description="Random split: test fraction.")
    seed: int = Field(42, description="Random split: seed (the split of a row depends only on it and the row's id).")

    @model_validator(mode="after")
    def _fractions(self) -> "SplitSpec":
        if self.train + self.val + self.test > 1.0 + 1e-9:
            raise ValueError(f"split fractions sum to {self.train + self.val + self.test:g} > 1")
        return self


class TaskSpec(_Section):
    type: TaskType = Field("node_classification", description="node_classification or link_prediction.")
    target: str | None = Field(None, description="Node type (classification) or relation (link prediction); default: the first.")
    split: SplitSpec = Field(default_factory=SplitSpec, description="Split column values, or random split fractions.")


class DataflowSpec(_Section):
    """The Dataflow job of a data step (preprocess, serialize) when ``preprocess.beam.runner`` is dataflow.

    Workers run the step image as their SDK container, so they hold exactly the pinned packages.
    """

    project: str | None = Field(None, min_length=1, description="Google Cloud project of the job (required for dataflow).")
    region: str = Field("us-central1", min_length=1, description="Dataflow region.")
    temp_location: str | None = Field(None, pattern=r"^gs://[^/]+", description="gs:// prefix for the job's temporary files (required for dataflow).")
    staging_location: str | None = Field(None, pattern=r"^gs://[^/]+", description="gs:// prefix for staged job files; default: <temp_location>/staging.")
    machine_type: str = Field("n1-standard-4", min_length=1, description="Compute Engine machine type of every worker.")
    num_workers: int | None = Field(None, ge=1, description="Workers to start with; default: Dataflow's choice.")
    max_num_workers: int = Field(10, ge=1, description="Most workers autoscaling may use.")
    disk_size_gb: int | None = Field(None, ge=10, description="Boot disk of every worker, in GB; default: Dataflow's.")
    service_account: str | None = Field(None, description="Service account the workers run as; default: the Compute Engine default.")
    network: str | None = Field(None, description="VPC network of the workers; default: 'default'.")
    subnetwork: str | None = Field(None, description="Subnetwork (regions/REGION/subnetworks/NAME or a full URL).")
    use_public_ips: bool = Field(True, description="false: workers get private IPs only (needs Private Google Access).")
    sdk_container_image: str | None = Field(
        None, description="Worker image; default: the pipeline's step image (a pipeline task) — required when a step runs on its own."
    )
    job_name_prefix: str = Field("gnnflow", pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$", description="Job names are <prefix>-<step>-<time>.")
    dataflow_endpoint: str | None = Field(None, description="Dataflow API endpoint; default: Google's.")


class BeamSpec(_Section):
    """The Apache Beam pipeline behind ``preprocess.engine: beam`` (steps preprocess and serialize)."""

    runner: Literal["local", "dataflow"] = Field(
        "local", description="local: Beam's portable FnApiRunner with num_workers processes on this machine; dataflow: a Dataflow job (see dataflow)."
    )
    num_workers: int = Field(2, ge=1, description="local: worker processes (Beam's direct_num_workers).")
    join_buckets: int | None = Field(
        None, ge=1, description="Buckets that node ids are hashed into for duplicate checks and the edge-endpoint join; "
        "default: about one per 32 MiB of input, at least 4 per worker. A bucket's ids must fit one worker."
    )
    dataflow: DataflowSpec = Field(default_factory=DataflowSpec, description="The Dataflow job when runner is dataflow.")

    @model_validator(mode="after")
    def _dataflow_complete(self) -> "BeamSpec":
        if self.runner == "dataflow":
            missing = [name for name in ("project", "temp_location") if getattr(self.dataflow, name) is None]
            if missing:
                raise ValueError(f"runner dataflow needs preprocess.beam.dataflow.{' and .'.join(missing)}")
        return self


class PreprocessSpec(_Section):
    csv_block_bytes: int = Field(16 << 20, gt=0, description="CSV bytes parsed per chunk (bounds memory).")
    parquet_batch_rows: int = Field(65_536, gt=0, description="Parquet rows read per chunk (bounds memory).")
    engine: Literal["local", "beam"] = Field(
        "local", description="How preprocess and serialize run: local: in this process; beam: an Apache Beam pipeline "
        "(many processes here, or Dataflow) for tables beyond one machine. Both publish the same outputs."
    )
    beam: BeamSpec = Field(default_factory=BeamSpec, description="The Beam pipeline when engine is beam.")


class SerializeSpec(_Section):
    num_shards: int | None = Field(None, gt=0, description="Shards per node/edge type; default: from target_shard_bytes.")
    target_shard_bytes: int = Field(64 << 20, gt=0, description="Approximate bytes per shard when num_shards is unset.")


class PartitionSpec(_Section):
    edge_assignment: Literal["src", "dst"] = Field(
        "src", description="Which endpoint's partition holds an edge: src for sampling out-edges, dst for in-edges."
    )
    load_in_parallel: bool = Field(
        True, description="Load node and edge shards in parallel subprocesses; false loads them one after another (edges first), lowering peak memory."
    )
    seed: int = Field(0, description="Seed of the hash that assigns nodes to partitions.")
    method: Literal["hash", "label_propagation"] = Field(
        "hash",
        description="How nodes are assigned: hash (balanced, ignores edges) or label_propagation (starts from the hash and "
        "moves nodes towards their neighbours' partitions, run across the partition workers: fewer cut edges, fewer remote fetches).",
    )
    refine_rounds: int = Field(10, ge=1, le=100, description="label_propagation: rounds of refinement (stops early once no node moves).")
    balance_slack: float = Field(
        0.05, ge=0.0, le=1.0, description="label_propagation: a partition holds at most (1 + slack) * nodes / partitions of each type."
    )


StepName = Literal["preprocess", "serialize", "partition", "train", "infer", "report"]


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
    def _count_needs_type(self) -> "TaskRequests":
        if self.accelerator_count is not None and self.accelerator_type is None:
            raise ValueError("accelerator_count needs accelerator_type")
        return self

    def overridden_by(self, other: "TaskRequests") -> "TaskRequests":
        """These requests with every field that ``other`` sets taken from ``other``."""
        return self.model_copy(update=other.model_dump(exclude_unset=True, exclude_none=True))


class CustomJobSpec(_Section):
    """How a multi-worker step (partition, train, infer) runs when ``resources.runner`` is vertex.

    The step's pipeline task submits one Vertex AI CustomJob of ``world_size /
    processes_per_replica`` replicas of the step image (a chief pool of one replica, a worker
    pool of the rest), all running ``python -m components.<step>`` with the same arguments,
    and waits for it. Read at run time from the config parameter.
    """

    project: str | None = Field(None, description="Google Cloud project; default: the project of the credentials (the pipeline's own on Vertex AI).")
    location: str = Field("us-central1", min_length=1, description="Vertex AI region of the CustomJob.")
    machine_type: str = Field("n1-standard-8", min_length=1, description="Compute Engine machine type of every replica.")
    accelerator_type: str | None = Field(None, min_length=1, description="Accelerator of every replica, e.g. NVIDIA_TESLA_T4; null: none.")
    accelerator_count: int = Field(1, ge=1, description="Accelerators per replica (with accelerator_type).")
    boot_disk_gb: int = Field(100, ge=10, description="Boot disk of every replica, in GB.")
    service_account: str | None = Field(None, description="Service account the replicas run as; default: the Vertex AI default.")
    network: str | None = Field(None, description="VPC network to peer with (projects/N/global/networks/NAME); default: none.")
    staging_bucket: str | None = Field(
        None, pattern=r"^gs://[^/]+/?", description="gs:// bucket for the job's own files; default: the bucket of the step's output."
    )
    timeout_s: int | None = Field(None, gt=0, description="Longest the job may run, in seconds; default: Vertex AI's (7 days).")
    restart_job_on_worker_restart: bool = Field(
        True, description="Restart every replica when one restarts (a distributed step cannot continue without a rank); train resumes from its checkpoint."
    )
    api_endpoint: str | None = Field(None, description="Vertex AI API endpoint; default: <location>-aiplatform.googleapis.com.")


class ResourcesSpec(_Section):
    """Workers, where multi-worker steps run, and what each pipeline task requests."""

    world_size: int = Field(1, ge=1, description="Workers of the multi-worker steps (partition, train, infer).")
    processes_per_replica: int = Field(1, ge=1, description="On a cluster: worker processes per replica (machine).")
    runner: Literal["local", "vertex"] = Field(
        "local", description="Where a pipeline's multi-worker steps run: local: world_size processes inside the step's own task; "
        "vertex: a Vertex AI CustomJob of world_size / processes_per_replica replicas (see custom_job)."
    )
    requests: TaskRequests = Field(default_factory=TaskRequests, description="Requests of every pipeline task (compile time).")
    step_requests: dict[StepName, TaskRequests] = Field(
        default_factory=dict, description="Per step (preprocess, ..., report): requests that replace those in `requests` (compile time)."
    )
    custom_job: CustomJobSpec = Field(default_factory=CustomJobSpec, description="The Vertex AI CustomJob of multi-worker steps when runner is vertex.")

    @model_validator(mode="after")
    def _replicas_whole(self) -> "ResourcesSpec":
        if self.runner == "vertex" and self.world_size % self.processes_per_replica:
            raise ValueError(
                f"world_size {self.world_size} is not a multiple of processes_per_replica {self.processes_per_replica}: "
                "a CustomJob needs a whole number of replicas"
            )
        return self

    @property
    def replica_count(self) -> int:
        """Machines of a multi-worker step's CustomJob."""
        return max(1, self.world_size // self.processes_per_replica)

    def requests_for(self, step: StepName) -> TaskRequests:
        """The requests of one step's pipeline task: ``requests``, then the step's own."""
        own = self.step_requests.get(step)
        return self.requests.overridden_by(own) if own is not None else self.requests


ModelType = Literal["graphsage", "gat", "rgcn"]


class ModelSpec(_Section):
    type: ModelType = Field(
        "graphsage",
        description="graphsage: mean/max/sum of neighbours (SAGEConv); gat: attention over neighbours (GATv2Conv), "
        "using edge features where a type has them; rgcn: one weight per relation (R-GCN, GraphConv per edge type). "
        "Each works for both tasks, on homogeneous and heterogeneous graphs; infer --mode exact needs graphsage on a homogeneous graph.",
    )
    hidden_channels: int = Field(64, gt=0, description="Width of every layer; also the embedding size.")
    num_layers: int = Field(2, gt=0, description="Message-passing layers (hops); must equal the length of every training.fan_outs list.")
    attention_heads: int = Field(1, gt=0, description="gat: attention heads per layer (concatenated; must divide hidden_channels).")
    dropout: float = Field(0.5, ge=0, lt=1, description="Dropout between layers.")
    aggregation: Literal["mean", "max", "sum"] = Field("mean", description="graphsage, rgcn: how a node aggregates its neighbours.")
    decoder: Literal["dot", "mlp"] = Field("dot", description="Link prediction: score an edge by a dot product or an MLP of the two embeddings.")


class TrainingSpec(_Section):
    epochs: int = Field(50, gt=0, description="Maximum epochs.")
    batch_size: int = Field(512, gt=0, description="Seed nodes (or seed edges) per mini-batch and worker.")
    eval_batch_size: int = Field(1024, gt=0, description="Seeds per batch when evaluating and inferring.")
    fan_outs: list[int] | dict[str, list[int]] = Field(
        default_factory=lambda: [15, 10],
        description="Neighbours sampled per hop, one per layer: a list for every edge type, or a mapping from edge type "
        "(its name src__relation__dst or its relation) to a list; key 'default' covers the types not named. "
        "An undirected type's reverse direction samples with its own type's list.",
    )
    learning_rate: float = Field(0.01, gt=0, description="Adam learning rate.")
    weight_decay: float = Field(5e-4, ge=0, description="Adam weight decay.")
    seed: int = Field(0, description="Seed of model initialisation and sampling: same config and world size, same result.")
    early_stopping_patience: int | None = Field(10, gt=0, description="Stop after this many epochs without a better validation metric; null: never.")
    sampling: Literal["collocated", "multiprocess"] = Field(
        "collocated", description="Sample in the trainer process, or in separate GLT sampling subprocesses."
    )
    sampling_workers: int = Field(1, gt=0, description="multiprocess: sampling subprocesses per trainer.")
    negative_ratio: float = Field(1.0, gt=0, description="Link prediction: random negative pairs per positive (negatives: random), "
                                  "and other positives of the batch scored per positive (negatives: in_batch), rounded up.")
    negatives: list[Literal["random", "hard", "in_batch"]] = Field(
        default_factory=lambda: ["random"], min_length=1,
        description="Link prediction, combinable: random (uniform destination pairs), hard (the negative_label table's pairs "
        "of each anchor), in_batch (each positive's anchor against the destinations of other positives in its batch).",
    )


class RetrievalSpec(_Section):
    """Step infer, link prediction: the top-k destination candidates of every source node of the
    target edge type, scored by the inner product of their embeddings (the dot decoder's logit)."""

    enabled: bool | None = Field(
        None, description="Write candidates and the index; default (null): for link prediction with model.decoder dot "
        "(an MLP decoder's score is not an inner product an index can search)."
    )
    k: int = Field(10, gt=0, description="Candidates per source node (fewer only when the graph has fewer destinations).")
    exact_below: int = Field(
        100_000, ge=0, description="Destination nodes below which candidates are found exactly (a flat index); "
        "from there on with a faiss HNSW index per worker."
    )
    hnsw_neighbors: int = Field(32, gt=1, description="HNSW: links per node (faiss M).")
    ef_construction: int = Field(200, gt=0, description="HNSW: candidate list size while building.")
    ef_search: int = Field(128, gt=0, description="HNSW: candidate list size while searching (higher: better recall, slower).")
    query_block: int = Field(4096, gt=0, description="Source embeddings each worker sends per search round.")
    recall_sample_fraction: float = Field(
        0.05, gt=0, le=1, description="Share of source nodes also searched exactly, to report the index's recall@k against exact search."
    )
    seed: int = Field(0, description="Seed of the recall sample.")


class OutputSpec(_Section):
    root: str = Field("runs", description="Run root: local path or gs:// URI under which each step writes its output.")


class GnnflowConfig(_Section):
    """A whole run's configuration."""

    graph: GraphSpec = Field(description="The tables: node types and edge types (required).")
    task: TaskSpec = Field(default_factory=TaskSpec, description="What is learned, and the split.")
    preprocess: PreprocessSpec = Field(default_factory=PreprocessSpec, description="Step preprocess: chunk sizes.")
    serialize: SerializeSpec = Field(default_factory=SerializeSpec, description="Step serialize: shards.")
    partition: PartitionSpec = Field(default_factory=PartitionSpec, description="Step partition.")
    model: ModelSpec = Field(default_factory=ModelSpec, description="The model: GraphSAGE, GATv2 or R-GCN.")
    training: TrainingSpec = Field(default_factory=TrainingSpec, description="Steps train and infer.")
    retrieval: RetrievalSpec = Field(default_factory=RetrievalSpec, description="Step infer: top-k candidates for link prediction.")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="Workers of the multi-worker steps, where they run (local or Vertex AI CustomJobs), and task requests.")
    output: OutputSpec = Field(default_factory=OutputSpec, description="Where a run writes.")

    @model_validator(mode="after")
    def _task_fits_graph(self) -> "GnnflowConfig":
        target = self.task_target
        if self.task.type == "node_classification":
            node = next((n for n in self.graph.nodes if n.type == target), None)
            if node is None:
                raise ValueError(f"task.target {target!r} is not a node type of graph.nodes")
            if node.label_column is None:
                raise ValueError(f"node_classification needs graph.nodes[{target!r}].label_column")
        elif not any(e.type == target or e.name == target for e in self.graph.edges if e.role == "message"):
            raise ValueError(f"task.target {target!r} is not an edge type of graph.edges")
        return self

    @model_validator(mode="after")
    def _labels_fit(self) -> "GnnflowConfig":
        labels = [e for e in self.graph.edges if e.role != "message"]
        if not labels:
            if "hard" in self.training.negatives:
                raise ValueError("training.negatives: hard needs a graph.edges table with role negative_label (the hard negatives)")
            return self
        if self.task.type != "link_prediction":
            raise ValueError(f"graph.edges {labels[0].name!r} has role {labels[0].role}: label edge tables need task.type link_prediction")
        target = next(e for e in self.graph.edges if e.name == self.task_target)
        for role in ("positive_label", "negative_label"):
            tables = [e.name for e in labels if e.role == role]
            if len(tables) > 1:
                raise ValueError(f"graph.edges has {len(tables)} tables with role {role} ({tables}): give one")
        for label in labels:
            if (label.src_type, label.dst_type) != (target.src_type, target.dst_type):
                raise ValueError(f"label edge table {label.name!r} joins {label.src_type} to {label.dst_type}; the target "
                                 f"{target.name!r} joins {target.src_type} to {target.dst_type}")
            if label.features:
                raise ValueError(f"label edge table {label.name!r} has features; label tables are pairs only")
        if "hard" in self.training.negatives and not any(e.role == "negative_label" for e in labels):
            raise ValueError("training.negatives: hard needs a graph.edges table with role negative_label (the hard negatives)")
        return self

    @model_validator(mode="after")
    def _fan_outs_match_layers(self) -> "GnnflowConfig":
        fan_outs = self.training.fan_outs
        lists = {"training.fan_outs": fan_outs} if isinstance(fan_outs, list) else {f"training.fan_outs[{k!r}]": v for k, v in fan_outs.items()}
        for key, values in lists.items():
            if len(values) != self.model.num_layers:
                raise ValueError(
                    f"{key} has {len(values)} entries but model.num_layers is {self.model.num_layers}: give one fan-out per layer"
                )
            if any(v <= 0 for v in values):
                raise ValueError(f"{key} holds {values}: each hop samples a positive number of neighbours")
        if isinstance(fan_outs, dict):
            known = {name for e in self.graph.edges if e.role == "message" for name in (e.name, e.type)}
            unknown = sorted(set(fan_outs) - known - {"default"})
            if unknown:
                raise ValueError(f"training.fan_outs names {unknown[0]!r}, not an edge type of graph.edges (known: {sorted(known)})")
            missing = [e.name for e in self.graph.edges if e.role == "message" and e.name not in fan_outs and e.type not in fan_outs]
            if missing and "default" not in fan_outs:
                raise ValueError(f"training.fan_outs gives no list for edge type {missing[0]!r}: name it or add a 'default' list")
        return self

    @model_validator(mode="after")
    def _model_fits(self) -> "GnnflowConfig":
        spec = self.model
        if spec.type == "gat" and spec.hidden_channels % spec.attention_heads:
            raise ValueError(f"model.attention_heads {spec.attention_heads} does not divide model.hidden_channels {spec.hidden_channels}")
        return self

    @model_validator(mode="after")
    def _retrieval_fits(self) -> "GnnflowConfig":
        if self.retrieval.enabled and self.task.type != "link_prediction":
            raise ValueError("retrieval.enabled needs task.type link_prediction")
        if self.retrieval.enabled and self.model.decoder != "dot":
            raise ValueError(f"retrieval.enabled needs model.decoder dot: an index searches inner products, "
                             f"model.decoder {self.model.decoder} scores pairs otherwise")
        return self

    @property
    def retrieval_on(self) -> bool:
        """Whether infer writes retrieval output (see RetrievalSpec.enabled)."""
        enabled = self.retrieval.enabled
        return enabled if enabled is not None else self.task.type == "link_prediction" and self.model.decoder == "dot"

    def fan_outs_of(self, edge_type: str) -> list[int]:
        """Neighbours per hop sampled along ``edge_type`` (a graph.edges name src__relation__dst)."""
        fan_outs = self.training.fan_outs
        if isinstance(fan_outs, list):
            return fan_outs
        edge = next(e for e in self.graph.edges if e.name == edge_type)
        return fan_outs.get(edge.name) or fan_outs.get(edge.type) or fan_outs["default"]

    @property
    def task_target(self) -> str:
        """The node type (classification) or edge type name (link prediction) the task is about."""
        if self.task.type == "node_classification":
            return self.task.target or self.graph.nodes[0].type
        messages = [e for e in self.graph.edges if e.role == "message"]
        target = self.task.target or (messages[0].name if messages else self.graph.edges[0].name)
        match = next((e for e in messages if target in (e.type, e.name)), None)
        return match.name if match else target

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def _format_error(source: str, error: ValidationError) -> str:
    lines = [f"invalid config {source}:"]
    for e in error.errors():
        key = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e["loc"]).lstrip(".")
        what = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
        lines.append(f"  key '{key}': {what}" if key else f"  {what}")
    return "\n".join(lines)


def _resolve_relative_uris(raw: dict, base_folder: str | None) -> None:
    if base_folder is None or not isinstance(raw.get("graph"), dict):
        return
    for section in ("nodes", "edges"):
        for table in raw["graph"].get(section) or []:
            if isinstance(table, dict) and isinstance(table.get("uri"), str):
                uri = table["uri"]
                if "://" not in uri and not os.path.isabs(os.path.expanduser(uri)):
                    table["uri"] = os.path.join(base_folder, uri)


class _DuplicateKeyError(yaml.constructor.ConstructorError):
    pass


class _StrictLoader(yaml.SafeLoader):
    """A safe loader that refuses a key given twice in one mapping (where plain YAML loading
    keeps the last value silently: ``epochs: 50`` then ``epochs: 7``)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[object, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise _DuplicateKeyError(None, None, f"key {key!r} appears twice in one section (lines {seen[key]} and {line})")
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def parse_config(text: str, source: str, base_folder: str | None = None) -> GnnflowConfig:
    """Validates YAML text; ``source`` names it in errors."""
    try:
        raw = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except _DuplicateKeyError as exc:
        raise GnnflowError(f"config {source}: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise GnnflowError(f"config {source} is not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise GnnflowError(f"config {source} must be a YAML mapping, got {type(raw).__name__}")
    _resolve_relative_uris(raw, base_folder)
    try:
        return GnnflowConfig.model_validate(raw)
    except ValidationError as exc:
        raise GnnflowError(_format_error(source, exc)) from None


def load_config(uri: storage.Uri | str) -> GnnflowConfig:
    """Reads and validates a config file from a local path or ``gs://``."""
    uri = storage.parse_uri(uri)
    base = os.path.dirname(uri.path) if isinstance(uri, storage.LocalUri) else None
    return parse_config(storage.read_text(uri), str(uri), base)


def apply_overrides(config: GnnflowConfig, overrides: dict[str, object], source: str = "overrides") -> GnnflowConfig:
    """``config`` with dotted keys replaced (``{"training.epochs": 5, "resources.world_size": 4}``).

    The result is validated like a file, so a bad override is an error naming its key.
    """
    raw = config.model_dump(mode="json")
    for dotted, value in overrides.items():
        node = raw
        *parents, leaf = dotted.split(".")
        for part in parents:
            child = node.get(part) if isinstance(node, dict) else None
            if not isinstance(child, dict):
                raise GnnflowError(f"{source}: key '{dotted}' does not name a config field ('{part}' is not a section)")
            node = child
        if not isinstance(node, dict) or leaf not in node:
            raise GnnflowError(f"{source}: key '{dotted}' does not name a config field")
        node[leaf] = value
    try:
        return GnnflowConfig.model_validate(raw)
    except ValidationError as exc:
        raise GnnflowError(_format_error(source, exc)) from None


def parse_overrides(text: str | None, source: str = "overrides") -> dict[str, object]:
    """A JSON object of dotted keys (the form pipeline parameters and ``--set`` take)."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise GnnflowError(f"{source} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise GnnflowError(f"{source} must be a JSON object of dotted keys, got {type(value).__name__}")
    return value


def resolve_config(config: str, overrides: str | dict[str, object] | None = None) -> GnnflowConfig:
    """The config a pipeline parameter names: YAML text, or the URI of a YAML file, plus overrides.

    Pipelines pass the YAML text so that KFP's cache key changes whenever the config does; a
    URI is read at run time (cached runs then key on the URI alone).
    """
    text = config.strip()
    is_uri = "\n" not in text and (text.startswith(("gs://", "file://", "/", "./")) or text.endswith((".yaml", ".yml")))
    resolved = load_config(text) if is_uri else parse_config(text, "the config parameter")
    extra = parse_overrides(overrides) if isinstance(overrides, str) or overrides is None else overrides
    return apply_overrides(resolved, extra) if extra else resolved
