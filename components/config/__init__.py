"""The run configuration: one YAML file validated into frozen, typed sections.

Every field has a default (documented in its ``description``); unknown keys and wrong types
are errors that name the key and the file. Relative local table paths are resolved against
the folder of the config file, so a config travels with its data.

``sections`` holds the graph and task sections, ``steps`` those of each step, ``resources``
where steps run, ``run`` the whole config with its cross-section checks, ``source`` reading it.
"""

from components.config.registry import BLESSED, RegistrySpec
from components.config.resources import CustomJobSpec, OutputSpec, ResourcesSpec, StepName, TaskRequests
from components.config.run import GnnflowConfig
from components.config.sections import EdgeTableSpec, FeatureSpec, GraphSpec, NodeTableSpec, SplitSpec, TaskSpec, TaskType, Transform
from components.config.source import apply_overrides, load_config, parse_config, parse_overrides, resolve_config
from components.config.steps import (
    BeamSpec,
    DataflowSpec,
    ModelSpec,
    ModelType,
    PartitionSpec,
    PreprocessSpec,
    RetrievalSpec,
    SerializeSpec,
    TrainingSpec,
)

__all__ = [
    "BLESSED",
    "BeamSpec",
    "CustomJobSpec",
    "DataflowSpec",
    "EdgeTableSpec",
    "FeatureSpec",
    "GnnflowConfig",
    "GraphSpec",
    "ModelSpec",
    "ModelType",
    "NodeTableSpec",
    "OutputSpec",
    "PartitionSpec",
    "PreprocessSpec",
    "RegistrySpec",
    "ResourcesSpec",
    "RetrievalSpec",
    "SerializeSpec",
    "SplitSpec",
    "StepName",
    "TaskRequests",
    "TaskSpec",
    "TaskType",
    "TrainingSpec",
    "Transform",
    "apply_overrides",
    "load_config",
    "parse_config",
    "parse_overrides",
    "resolve_config",
]
