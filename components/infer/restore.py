"""The trained model, rebuilt from a published train output for the graph in the partitions."""

from __future__ import annotations

import io
from dataclasses import dataclass, field

import torch
from pydantic import ValidationError
from torch import nn

from components import storage
from components.config import GnnflowConfig, ModelSpec
from components.errors import GnnflowError
from components.gnn.learnt_embeddings import learnt_types, shard_path
from components.partition.output import StoredPartition, range_offset
from components.schema import GraphSchema
from components.train.output import MODEL_FILE, SPEC_FILE


@dataclass(frozen=True)
class RestoredModel:
    """The model in eval mode, and what it was trained as."""

    module: nn.Module  # NodeClassifier or LinkPredictor
    task_type: str
    spec: ModelSpec  # the architecture training used (wins over the infer config's model section)
    edge_dir: str  # the sampling direction training used
    # Replicated learnt tables as trained, keyed by type, when inferring on other partitions than
    # the model's own: their rows are put in the new ids' order (components.infer.cold_start).
    trained_rows: dict[str, torch.Tensor] = field(default_factory=dict)


def model_config(config: GnnflowConfig, spec: ModelSpec) -> GnnflowConfig:
    """``config`` with the model section training used: the weights only fit that architecture."""
    return config.model_copy(update={"model": spec})


def read_spec(model: storage.PublishedOutput, schema: GraphSchema) -> tuple[dict, ModelSpec]:
    """model_spec.json, checked against the graph of the partitions."""
    raw = model.read_json(SPEC_FILE)
    source = model.uri(SPEC_FILE)
    try:
        # Models published before learnt embeddings were sharded hold the whole table in model.pt.
        spec = ModelSpec.model_validate({"learnt_embeddings": "replicated", **raw["model"]})
        task_type, target, heterogeneous = raw["task_type"], raw["target"], bool(raw["heterogeneous"])
        raw["edge_dir"] = str(raw["edge_dir"])
    except (KeyError, TypeError, ValidationError) as exc:
        raise GnnflowError(f"{source} is not a valid model spec: {exc}") from None
    if (task_type, target) != (schema.task_type, schema.target):
        raise GnnflowError(
            f"{model.root} was trained for {task_type} on {target!r}, but the partitions are set up for "
            f"{schema.task_type} on {schema.target!r}"
        )
    if heterogeneous != schema.is_heterogeneous:
        kinds = {True: "heterogeneous", False: "homogeneous"}
        raise GnnflowError(
            f"{model.root} was trained on a {kinds[heterogeneous]} graph, the partitions hold a {kinds[schema.is_heterogeneous]} one"
        )
    return raw, spec


def restore_model(
    model: storage.PublishedOutput, schema: GraphSchema, config: GnnflowConfig, edge_dir: str, trained_elsewhere: bool = False
) -> RestoredModel:
    """Rebuilds the trained module and loads its weights (``weights_only``: no pickled code runs).

    ``edge_dir`` is the direction the partitions sample in; a heterogeneous model's edge types
    depend on it, so it must be the one training used. ``trained_elsewhere``: the partitions are
    not the model's own, so replicated learnt tables (sized and ordered by the training run's
    ids) are kept aside in ``trained_rows`` instead of loaded.
    """
    raw, spec = read_spec(model, schema)
    if schema.is_heterogeneous and raw["edge_dir"] != edge_dir:
        raise GnnflowError(
            f"{model.root} was trained on partitions sampled in direction {raw['edge_dir']!r}, these sample {edge_dir!r}: "
            "partition with the same partition.edge_assignment as for training"
        )
    from components.gnn.build import build_model

    module = build_model(schema, model_config(config, spec), raw["edge_dir"])
    source = model.uri(MODEL_FILE)
    try:
        state = torch.load(io.BytesIO(model.read_bytes(MODEL_FILE)), map_location="cpu", weights_only=True)
        trained_rows = _set_aside_learnt_tables(module, state) if trained_elsewhere else {}
        module.load_state_dict(state)
    except (RuntimeError, ValueError, TypeError, EOFError) as exc:  # torch reports mismatches as RuntimeError
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise GnnflowError(f"{source} does not fit the graph in the partitions: {first_line}") from None
    module.eval()
    return RestoredModel(module, schema.task_type, spec, raw["edge_dir"], trained_rows)


def _set_aside_learnt_tables(module: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Takes the replicated learnt tables out of ``state`` (the module's own stand in for them)."""
    tables = getattr(module.encoder, "embedding", {})
    own = module.state_dict()
    aside = {}
    for node_type in tables:
        key = f"encoder.embedding.{node_type}.weight"
        if key in state:
            aside[node_type] = state.pop(key)
            state[key] = own[key]
    return aside


def install_learnt_rows(model: storage.PublishedOutput, spec: ModelSpec, part: StoredPartition) -> None:
    """Puts the trained embedding rows of this partition's featureless nodes where their features
    would be (what the encoder and the samplers read), from the train output's shard of the same
    partition; nothing for a model with replicated embeddings (they are in model.pt)."""
    if spec.learnt_embeddings != "sharded":
        return
    for node_type in learnt_types(part):
        path = shard_path(node_type, part.index)
        if path not in model.manifest.files:
            raise GnnflowError(
                f"{model.root} holds no learnt embeddings of node type {node_type!r} for partition {part.index} ({path}): "
                "infer with the partitions the model was trained on"
            )
        saved = torch.load(io.BytesIO(model.read_bytes(path)), map_location="cpu", weights_only=True)
        start, rows = int(saved["start"]), saved["rows"]
        own = len(part.nodes[node_type]["node_id"])
        first = range_offset(part.metadata.node_counts[node_type], part.index)
        if start != first or tuple(rows.shape) != (own, spec.hidden_channels):
            raise GnnflowError(
                f"{model.uri(path)} holds {tuple(rows.shape)} rows from id {start}, but partition {part.index} owns {own} "
                f"{node_type!r} nodes from id {first} (hidden {spec.hidden_channels}): infer with the partitions the model was trained on"
            )
        part.nodes[node_type]["features"] = rows.to(torch.float32)
