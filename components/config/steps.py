"""Sections of the steps: preprocess (local or Beam), serialize, partition, model, training, retrieval."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from components.config.sections import _Section


class DataflowSpec(_Section):
    """The Dataflow job of a data step (preprocess, serialize) when ``preprocess.beam.runner`` is dataflow.

    Workers run the step image as their SDK container, so they hold exactly the pinned packages.
    """

    project: str | None = Field(None, min_length=1, description="Google Cloud project of the job (required for dataflow).")
    region: str = Field("us-central1", min_length=1, description="Dataflow region.")
    temp_location: str | None = Field(
        None, pattern=r"^gs://[^/]+", description="gs:// prefix for the job's temporary files (required for dataflow)."
    )
    staging_location: str | None = Field(
        None, pattern=r"^gs://[^/]+", description="gs:// prefix for staged job files; default: <temp_location>/staging."
    )
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
        "local",
        description="local: Beam's portable FnApiRunner with num_workers processes on this machine; "
        "dataflow: a Dataflow job (see dataflow).",
    )
    num_workers: int = Field(2, ge=1, description="local: worker processes (Beam's direct_num_workers).")
    join_buckets: int | None = Field(
        None,
        ge=1,
        description="Buckets that node ids are hashed into for duplicate checks and the edge-endpoint join; "
        "default: about one per 32 MiB of input, at least 4 per worker. A bucket's ids must fit one worker.",
    )
    dataflow: DataflowSpec = Field(default_factory=DataflowSpec, description="The Dataflow job when runner is dataflow.")

    @model_validator(mode="after")
    def _dataflow_complete(self) -> BeamSpec:
        if self.runner == "dataflow":
            missing = [name for name in ("project", "temp_location") if getattr(self.dataflow, name) is None]
            if missing:
                raise ValueError(f"runner dataflow needs preprocess.beam.dataflow.{' and .'.join(missing)}")
        return self


class PreprocessSpec(_Section):
    csv_block_bytes: int = Field(16 << 20, gt=0, description="CSV bytes parsed per chunk (bounds memory).")
    parquet_batch_rows: int = Field(65_536, gt=0, description="Parquet rows read per chunk (bounds memory).")
    engine: Literal["local", "beam"] = Field(
        "local",
        description="How preprocess and serialize run: local: in this process; beam: an Apache Beam pipeline "
        "(many processes here, or Dataflow) for tables beyond one machine. Both publish the same outputs.",
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
        True,
        description="Load node and edge shards in parallel subprocesses; false loads them one after another (edges first), "
        "lowering peak memory.",
    )
    subprocess_min_bytes: int = Field(
        128 << 20,
        ge=0,
        description="A node or edge type whose shards (this worker's share) hold at least this many bytes is decoded in a "
        "subprocess (in parallel; its memory goes back to the OS when it exits); a smaller one in the worker itself, where "
        "a subprocess's start-up (seconds of imports) costs more than decoding it (about 0.25 GB/s). 0: every type in a subprocess.",
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


NegativeKind = Literal["random", "hard", "in_batch"]
ModelType = Literal["graphsage", "gat", "rgcn", "gcn", "appnp", "gcnii"]
# Models that propagate over the whole sampled subgraph, however many hops deep (see ModelSpec.hops_error).
PROPAGATION_TYPES = ("appnp", "gcnii")
# gcnii's model.num_layers when the config gives none: see ModelSpec.num_layers.
GCNII_DEFAULT_LAYERS = 16


class ModelSpec(_Section):
    type: ModelType = Field(
        "graphsage",
        description="graphsage: mean/max/sum of neighbours (SAGEConv); gat: attention over neighbours (GATv2Conv), "
        "using edge features where a type has them; rgcn: one weight per relation (R-GCN, GraphConv per edge type); "
        "gcn: GCN's symmetric-normalised sum over neighbours and the node itself (GCNConv; aggregation does not apply). "
        "appnp: an MLP of the node features, then propagation_steps steps of personalized PageRank with teleport "
        "(APPNP); gcnii: a linear input layer, then num_layers GCNII layers (GCN2Conv: initial residual teleport, "
        "identity mapping identity_strength). "
        "graphsage, gat, rgcn, appnp and gcnii work for both tasks, on homogeneous and heterogeneous graphs (appnp and "
        "gcnii propagate over the graph's homogeneous view, relations not distinguished); gcn on homogeneous graphs with "
        "node features. infer --mode exact and training.mode full_graph need graphsage, gcn, "
        "appnp or gcnii on a homogeneous graph.",
    )
    hidden_channels: int = Field(64, gt=0, description="Width of every layer; also the embedding size.")
    num_layers: int = Field(
        2,
        gt=0,
        description="Message-passing layers (hops); must equal the length of every training.fan_outs list. appnp: the "
        "MLP's linear layers (2, as in the APPNP paper), and training.fan_outs may have 1 to propagation_steps entries. "
        f"gcnii: its GCN2Conv layers (default {GCNII_DEFAULT_LAYERS}; the paper's deep setting is 64, but on a sampled "
        "subgraph a few hops deep the extra layers add little and cost time), and training.fan_outs may have 1 to "
        "num_layers entries.",
    )
    propagation_steps: int = Field(
        10,
        ge=1,
        description="appnp: K, the steps of personalized-PageRank propagation h <- (1 - teleport) * A h + teleport * h0 "
        "(A: the symmetric-normalised adjacency with self-loops); 10 as in the APPNP paper (Gasteiger et al., ICLR 2019).",
    )
    teleport: float = Field(
        0.1,
        gt=0,
        le=1,
        description="appnp: the teleport probability alpha, the share of the MLP's output h0 mixed back in at every step; "
        "gcnii: the initial residual alpha, the same role. 0.1 in both papers (APPNP; GCNII, Chen et al., ICML 2020).",
    )
    identity_strength: float = Field(
        0.5,
        gt=0,
        description="gcnii: lambda (PyG's theta) of the identity mapping: layer l mixes in its weight matrix with strength "
        "beta_l = log(lambda / l + 1); 0.5 as in the GCNII paper.",
    )
    attention_heads: int = Field(1, gt=0, description="gat: attention heads per layer (concatenated; must divide hidden_channels).")
    dropout: float = Field(0.5, ge=0, lt=1, description="Dropout between layers.")
    aggregation: Literal["mean", "max", "sum"] = Field("mean", description="graphsage, rgcn: how a node aggregates its neighbours.")
    decoder: Literal["dot", "mlp"] = Field(
        "dot",
        description="Link prediction: score an edge by the scaled cosine of the two embeddings, with a learnt scale "
        "(dot: the inner product of the embeddings infer writes is the score), or by an MLP of their product.",
    )
    dot_scale: float = Field(
        1.0,
        gt=0,
        description="Link prediction, dot: the learnt scale's starting value (scores start within ±dot_scale); 1 had the best "
        "mean validation ROC-AUC of 1, 5 and 10 over four graphs (benchmarks/link_defaults.py).",
    )
    learnt_embeddings: Literal["sharded", "replicated"] = Field(
        "sharded",
        description="Node types without features get a learnt embedding per node. sharded: each worker holds and "
        "updates the rows of its own partition's nodes (memory O(nodes / workers)); rows of sampled remote nodes arrive "
        "with the subgraph, their gradients go back to the owner (training.embedding_optimizer). replicated: one "
        "nn.Embedding of the whole type on every worker, all-reduced densely by DDP each step (O(nodes) per worker).",
    )

    @model_validator(mode="before")
    @classmethod
    def _gcnii_depth(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("type") == "gcnii" and data.get("num_layers") is None:
            return {**data, "num_layers": GCNII_DEFAULT_LAYERS}
        return data

    def hops_error(self, hops: int) -> str | None:
        """Why a sampled subgraph ``hops`` deep (a fan-out list that long) does not fit this model; None if it does.

        Stacks of layers read exactly one hop per layer. appnp and gcnii propagate over the whole
        sampled subgraph, whatever its depth, but K steps (layers) reach K hops only: a deeper
        sample would never be read.
        """
        if self.type == "appnp":
            reach, name = self.propagation_steps, "model.propagation_steps"
        elif self.type == "gcnii":
            reach, name = self.num_layers, "model.num_layers"
        else:
            return None if hops == self.num_layers else f"model.num_layers is {self.num_layers}: give one fan-out per layer"
        if hops <= reach:
            return None
        return f"{name} is {reach}: model.type {self.type} reads at most {reach} hops, so sample at most {reach}"


# GLT 0.2.4's CUDA sampler draws with replacement from its own unseeded generator: gnnflow's
# seeded, distinct draw (components/gnn/distinct_sampling.py) replaces GLT's CPU draw only.
GPU_SAMPLER_LIMITS = (
    "training.replace: false needs the CPU sampler: on a GPU, GLT 0.2.4 samples neighbours with replacement and does not "
    "read training.seed. Set training.replace: true to sample on the GPU (runs are then not bit-reproducible), or "
    "training.device: cpu (or training.mode: full_graph, which samples nothing)"
)


class TrainingSpec(_Section):
    mode: Literal["sampled", "full_graph"] = Field(
        "sampled",
        description="sampled: mini-batches of sampled neighbourhoods (GLT); full_graph: every epoch is one step over the "
        "whole graph, each worker holding only its partition and fetching the rows its nodes read from one peer at a "
        "time, recomputing them in the backward pass (SAR; node classification with model.type graphsage, gcn, appnp or gcnii on a "
        "homogeneous graph with node features; batch_size and fan_outs do not apply; runs on the CPU).",
    )
    full_graph_block_rows: int = Field(
        65_536,
        gt=0,
        description="full_graph and infer --mode exact: most rows fetched from a peer at once; a worker's memory grows "
        "with its partition plus one such block of layer inputs.",
    )
    epochs: int = Field(50, gt=0, description="Maximum epochs.")
    batch_size: int = Field(512, gt=0, description="Seed nodes (or seed edges) per mini-batch and worker.")
    eval_batch_size: int = Field(1024, gt=0, description="Seeds per batch when evaluating and inferring.")
    fan_outs: list[int] | dict[str, list[int]] = Field(
        default_factory=lambda: [15, 10],
        description="Neighbours sampled per hop, one per layer: a list for every edge type, or a mapping from edge type "
        "(its name src__relation__dst or its relation) to a list; key 'default' covers the types not named. "
        "An undirected type's reverse direction samples with its own type's list.",
    )
    replace: bool = Field(
        False,
        description="Sample neighbours with replacement. false (as in PyG): each hop draws up to k distinct "
        "neighbours per node (min(k, degree)), on local and remote partitions alike; true: k independent draws "
        "per node (GLT 0.2.4's own CPU sampler), so a node may repeat and fewer distinct neighbours are aggregated.",
    )
    feature_cache_ratio: float = Field(
        1.5,
        ge=0,
        description="Sampled train and infer: a worker copies a node type's feature rows (and labels) of all other "
        "partitions once at the start, and fetches none per batch, where they number at most this many times its own "
        "(1.5: two workers do, more do not); 0: never.",
    )
    learning_rate: float = Field(0.01, gt=0, description="Adam learning rate.")
    weight_decay: float = Field(5e-4, ge=0, description="Adam weight decay.")
    weight_decay_scope: Literal["all", "input_layer"] = Field(
        "all",
        description="What training.weight_decay applies to. all: every dense parameter; input_layer: only the layers that "
        "read each node type's input (the first convolution or linear layer, a replicated learnt embedding), the rest "
        "left undecayed: the GCN and APPNP papers' recipe, which regularises the wide feature map where few labels "
        "overfit.",
    )
    embedding_optimizer: Literal["row_adagrad", "sparse_adam"] = Field(
        "row_adagrad",
        description="model.learnt_embeddings sharded: the sparse optimizer of the embedding rows (only a batch's rows are "
        "updated). row_adagrad: one accumulator per row (state 1/hidden of the rows); sparse_adam: Adam's moments per "
        "element (state twice the rows). row_adagrad at 0.1 had the best mean validation ROC-AUC over two graphs with "
        "featureless types (benchmarks/link_defaults.py --embeddings).",
    )
    embedding_learning_rate: float | None = Field(
        None,
        gt=0,
        description="model.learnt_embeddings sharded: learning rate of the embedding rows (null: 0.1 for row_adagrad, "
        "training.learning_rate for sparse_adam).",
    )
    seed: int = Field(
        0,
        description="Seed of model initialisation and sampling: same config and world size, same result (except with "
        "sharded learnt embeddings, whose peers' updates land asynchronously).",
    )
    early_stopping_patience: int | None = Field(
        10, gt=0, description="Stop after this many epochs without a better validation metric; null: never."
    )
    evaluate_test: bool = Field(
        True,
        description="Evaluate the best model on the test split at the end of training (test_* in the model's metrics). "
        "false: validation only; gnnflow tune's trials set it, so that no test figure exists before a trial is selected.",
    )
    stop_at_chance_epochs: int | None = Field(
        5,
        gt=0,
        description="Fail the step when the training loss stays within 2% of chance (what the best constant prediction "
        "scores on the same labels) for this many epochs in a row, and at least 50 optimizer steps: the model is not "
        "learning, and its outputs would flow on to infer. null: train on regardless.",
    )
    checkpoint_every_batches: int | None = Field(
        None,
        gt=0,
        description="Sampled training: checkpoint within an epoch too, once this many batches have passed since the "
        "last checkpoint (null: only at the end of each epoch, and on SIGTERM). A rerun after a kill -9 resumes from "
        "the batch of the last checkpoint.",
    )
    checkpoint_every_seconds: float | None = Field(
        None, gt=0, description="Sampled training: also checkpoint within an epoch once this many seconds have passed since the last."
    )
    sampling: Literal["collocated", "multiprocess"] = Field(
        "collocated", description="Sample in the trainer process, or in separate GLT sampling subprocesses."
    )
    sampling_workers: int | None = Field(
        None, gt=0, description="multiprocess: sampling subprocesses per trainer; null: a third of its share of the cores, at least one."
    )
    negative_ratio: float = Field(
        1.0,
        gt=0,
        description="Link prediction: random negative pairs per positive (negatives: random), "
        "and other positives of the batch scored per positive (negatives: in_batch), rounded up.",
    )
    negatives: list[NegativeKind] = Field(
        default_factory=lambda: list[NegativeKind](["random"]),
        min_length=1,
        description="Link prediction, combinable: random (uniform destination pairs), hard (the negative_label table's pairs "
        "of each anchor), in_batch (each positive's anchor against the destinations of other positives in its batch).",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="Where train and infer compute (components/gnn/device.py): cuda: each worker on GPU <local rank modulo "
        "visible GPUs>, DDP over nccl, GLT sampling and feature lookup on that GPU, an error where no GPU is visible "
        "(a local run refuses before its first step; a step, before its workers start); cpu: the CPU only (gloo), even "
        "where GPUs exist; auto: cuda where a GPU is visible, else cpu.",
    )
    gpu_feature_fraction: float = Field(
        1.0,
        ge=0,
        le=1,
        description="On a GPU: share of each partition's node (and edge) feature rows GLT keeps in GPU memory; the rest "
        "stays in pinned host memory, which the GPU reads directly (zero-copy). Lower it when a partition's features do "
        "not fit the GPU beside the model and batches. Ignored on the CPU.",
    )
    gpu_graph_placement: Literal["pinned_host", "gpu"] = Field(
        "pinned_host",
        description="On a GPU: where GLT keeps a partition's adjacency for GPU sampling: pinned_host (GLT ZERO_COPY: "
        "host memory the GPU reads directly, no GPU memory used) or gpu (GLT CUDA: copied into GPU memory, faster). "
        "Ignored on the CPU.",
    )

    @model_validator(mode="after")
    def _distinct_sampling_on_the_cpu(self) -> TrainingSpec:
        if self.device == "cuda" and self.mode == "sampled" and not self.replace:
            raise ValueError(GPU_SAMPLER_LIMITS)
        return self


class RetrievalSpec(_Section):
    """Step infer, link prediction: the top-k destination candidates of every source node of the
    target edge type, scored by the inner product of their embeddings (the dot decoder's logit)."""

    enabled: bool | None = Field(
        None,
        description="Write candidates and the index; default (null): for link prediction with model.decoder dot "
        "(an MLP decoder's score is not an inner product an index can search).",
    )
    k: int = Field(10, gt=0, description="Candidates per source node (fewer only when the graph has fewer destinations).")
    exact_below: int = Field(
        100_000,
        ge=0,
        description="Destination nodes below which candidates are found exactly (a flat index); "
        "from there on with a faiss HNSW index per worker.",
    )
    hnsw_neighbors: int = Field(32, gt=1, description="HNSW: links per node (faiss M).")
    ef_construction: int = Field(200, gt=0, description="HNSW: candidate list size while building.")
    ef_search: int = Field(128, gt=0, description="HNSW: candidate list size while searching (higher: better recall, slower).")
    query_block: int = Field(4096, gt=0, description="Source embeddings each worker sends per search round.")
    recall_sample_fraction: float = Field(
        0.05, gt=0, le=1, description="Share of source nodes also searched exactly, to report the index's recall@k against exact search."
    )
    seed: int = Field(0, description="Seed of the recall sample.")
