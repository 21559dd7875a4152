"""The whole run configuration, with the checks that span sections."""

from __future__ import annotations

import yaml
from pydantic import Field, model_validator

from components.config.inference import InferSpec
from components.config.registry import RegistrySpec
from components.config.resources import OutputSpec, ResourcesSpec
from components.config.sections import GraphSpec, TaskSpec, _Section
from components.config.steps import ModelSpec, PartitionSpec, PreprocessSpec, RetrievalSpec, SerializeSpec, TrainingSpec
from components.errors import GnnflowError
from components.warehouse.result_tables import check_node_type_name


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
    infer: InferSpec = Field(default_factory=InferSpec, description="Step infer: smoothing of node classification's predictions.")
    resources: ResourcesSpec = Field(
        default_factory=ResourcesSpec,
        description="Workers of the multi-worker steps, where they run (local or Vertex AI CustomJobs), and task requests.",
    )
    output: OutputSpec = Field(default_factory=OutputSpec, description="Where a run writes.")
    registry: RegistrySpec = Field(
        default_factory=RegistrySpec, description="Model registry and evaluation gate (off unless registry.uri is set)."
    )

    @model_validator(mode="after")
    def _task_fits_graph(self) -> GnnflowConfig:
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
    def _labels_fit(self) -> GnnflowConfig:
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
                raise ValueError(
                    f"label edge table {label.name!r} joins {label.src_type} to {label.dst_type}; the target "
                    f"{target.name!r} joins {target.src_type} to {target.dst_type}"
                )
            if label.features:
                raise ValueError(f"label edge table {label.name!r} has features; label tables are pairs only")
        if "hard" in self.training.negatives and not any(e.role == "negative_label" for e in labels):
            raise ValueError("training.negatives: hard needs a graph.edges table with role negative_label (the hard negatives)")
        return self

    @model_validator(mode="after")
    def _fan_outs_match_layers(self) -> GnnflowConfig:
        fan_outs = self.training.fan_outs
        lists = (
            {"training.fan_outs": fan_outs} if isinstance(fan_outs, list) else {f"training.fan_outs[{k!r}]": v for k, v in fan_outs.items()}
        )
        for key, values in lists.items():
            reason = self.model.hops_error(len(values))
            if reason is not None and self.training.mode == "sampled":  # full_graph samples nothing
                raise ValueError(f"{key} has {len(values)} entries but {reason}")
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
    def _model_fits(self) -> GnnflowConfig:
        spec = self.model
        if spec.type == "gat" and spec.hidden_channels % spec.attention_heads:
            raise ValueError(f"model.attention_heads {spec.attention_heads} does not divide model.hidden_channels {spec.hidden_channels}")
        return self

    @model_validator(mode="after")
    def _gcn_fits(self) -> GnnflowConfig:
        messages = [e for e in self.graph.edges if e.role == "message"]
        # gcn has no per-relation form (yet); appnp and gcnii have a typed form (components/gnn/propagation.py).
        if self.model.type == "gcn" and (len(self.graph.nodes) > 1 or len(messages) > 1 or not self.graph.nodes[0].features):
            raise ValueError(
                f"model.type {self.model.type} supports homogeneous graphs with node features; this config has {len(self.graph.nodes)} "
                f"node types, {len(messages)} edge types{'' if self.graph.nodes[0].features else ', no node features'}"
            )
        return self

    @model_validator(mode="after")
    def _full_graph_fits(self) -> GnnflowConfig:
        """training.mode full_graph: node classification, graphsage, gcn, appnp or gcnii, one node type with features, one edge type."""
        if self.training.mode != "full_graph":
            return self
        messages = [e for e in self.graph.edges if e.role == "message"]
        if self.task.type != "node_classification":
            raise ValueError(f"training.mode full_graph supports task.type node_classification, not {self.task.type}")
        if self.model.type not in ("graphsage", "gcn", "appnp", "gcnii"):
            raise ValueError(f"training.mode full_graph supports model.type graphsage, gcn, appnp or gcnii, not {self.model.type}")
        if len(self.graph.nodes) > 1 or len(messages) > 1:
            raise ValueError(
                f"training.mode full_graph supports homogeneous graphs (one node type, one edge type); this config has "
                f"{len(self.graph.nodes)} node types and {len(messages)} edge types"
            )
        if not self.graph.nodes[0].features:
            raise ValueError(f"training.mode full_graph needs node features; node type {self.graph.nodes[0].type!r} has none")
        return self

    @model_validator(mode="after")
    def _retrieval_fits(self) -> GnnflowConfig:
        if self.retrieval.enabled and self.task.type != "link_prediction":
            raise ValueError("retrieval.enabled needs task.type link_prediction")
        if self.retrieval.enabled and self.model.decoder != "dot":
            raise ValueError(
                f"retrieval.enabled needs model.decoder dot: an index searches inner products, "
                f"model.decoder {self.model.decoder} scores pairs otherwise"
            )
        return self

    @model_validator(mode="after")
    def _smoothing_fits(self) -> GnnflowConfig:
        if self.infer.smoothing == "none":
            return self
        if self.task.type != "node_classification":
            raise ValueError(f"infer.smoothing {self.infer.smoothing} needs task.type node_classification, not {self.task.type}")
        target = self.task_target
        if not any(e.src_type == e.dst_type == target for e in self.graph.edges if e.role == "message"):
            raise ValueError(
                f"infer.smoothing {self.infer.smoothing} propagates over edges between nodes of the target type {target!r}, "
                f"and graph.edges has none (its edge types join {sorted({(e.src_type, e.dst_type) for e in self.graph.edges})}): "
                "set infer.smoothing to none"
            )
        return self

    @model_validator(mode="after")
    def _accelerators_used(self) -> GnnflowConfig:
        # Only train and infer compute on a device, and training.device cpu keeps them off it:
        # accelerators requested beside it would be paid for and sit idle.
        if self.training.device == "cpu" and (requested := self.resources.accelerator_requests()):
            key, kind = requested[0]
            raise ValueError(
                f"{key} requests {kind} but training.device is cpu, which leaves it idle: "
                f"set training.device to auto or cuda, or remove {key}"
            )
        return self

    @model_validator(mode="after")
    def _result_tables_nameable(self) -> GnnflowConfig:
        if self.output.bigquery is not None:
            for node in self.graph.nodes:
                try:
                    check_node_type_name(node.type)
                except GnnflowError as exc:
                    raise ValueError(str(exc)) from None
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
