"""``gnnflow run``: the steps in DAG order on this machine, each output under one run root."""

from __future__ import annotations

import datetime as dt
import logging
import pathlib
from dataclasses import dataclass

from components import storage
from components.config import GnnflowConfig, load_config
from components.demo_graph import generate_demo_graph, write_demo_graph
from components.partition.step import partition
from components.preprocess.step import preprocess
from components.serialize.step import serialize
from components.starter_config import propose_config, render

log = logging.getLogger("gnnflow.run")

DEMO_NODES = 10_000


@dataclass(frozen=True)
class RunOutputs:
    """Where each step of a local run published its output."""

    root: storage.Uri
    preprocessed: storage.Uri
    tfrecords: storage.Uri
    partitions: storage.Uri


def new_run_root(base: str = "runs") -> storage.Uri:
    return storage.parse_uri(base).join(dt.datetime.now().strftime("%Y%m%d-%H%M%S"))


def demo_config(root: storage.Uri, num_nodes: int = DEMO_NODES) -> GnnflowConfig:
    """Writes the bundled demo graph under ``root/demo_data`` and a starter config for it."""
    data = root.join("demo_data")
    if not isinstance(data, storage.LocalUri):
        raise NotImplementedError("the demo data is generated locally; give a local --output or a --config")
    nodes_path, edges_path = write_demo_graph(generate_demo_graph(num_nodes), pathlib.Path(data.path))
    config = propose_config(
        str(nodes_path), str(edges_path), id_column="node_id", src_column="src", dst_column="dst",
        label_column="label", node_type="paper", relation="cites", output_root=str(root),
    )
    # Two workers, so the demo exercises distributed partitioning like a real run.
    config = config.model_copy(update={"resources": config.resources.model_copy(update={"world_size": 2})})
    storage.write_text(root.join("config.yaml"), render(config, "the bundled demo graph"))
    log.info("demo graph: %d nodes → %s; config → %s", num_nodes, data, root.join("config.yaml"))
    return config


def run_pipeline(config: GnnflowConfig, root: storage.Uri) -> RunOutputs:
    """preprocess → serialize → partition (train and infer join as they land), each publishing
    under ``root``."""
    outputs = RunOutputs(
        root=root, preprocessed=root.join("preprocessed"), tfrecords=root.join("tfrecords"), partitions=root.join("partitions")
    )
    preprocess(config, outputs.preprocessed)
    serialize(config, outputs.preprocessed, outputs.tfrecords)
    partition(outputs.tfrecords, outputs.partitions, config.partition, config.resources.world_size,
              config.resources.processes_per_replica)
    return outputs


def run(config_uri: str | None, output: str | None) -> RunOutputs:
    """With no config, the demo into ``runs/<timestamp>``; else the config into ``output``."""
    if config_uri is None:
        root = storage.parse_uri(output) if output else new_run_root()
        config = demo_config(root)
    else:
        config = load_config(config_uri)
        root = storage.parse_uri(output) if output else new_run_root(config.output.root)
    log.info("run root: %s", root)
    outputs = run_pipeline(config, root)
    for name in ("preprocessed", "tfrecords", "partitions"):
        log.info("%-12s → %s", name, getattr(outputs, name))
    return outputs
