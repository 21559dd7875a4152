"""A compiled package as Vertex AI Pipelines reads it: the pipeline spec without its Kubernetes platform spec.

With ``resources.runner: local`` the compiler writes a second YAML document after the pipeline
spec: kfp-kubernetes' platform spec, which mounts an in-memory ``/dev/shm`` on partition, train and
infer (``pipelines/dag.py``). A KFP cluster applies it to the task pods. Vertex AI Pipelines runs
its tasks on machines of its own, and the SDK's ``PipelineJob`` reads a package as a single YAML
document, so a package sent there goes without it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Iterator

import yaml

log = logging.getLogger("gnnflow.submit")


@contextlib.contextmanager
def pipeline_spec_only(package: str) -> Iterator[str]:
    """``package`` itself where it holds one YAML document (or is not a local file), else a
    temporary copy of its pipeline spec alone, for as long as the context lasts."""
    if not os.path.isfile(package):
        yield package
        return
    with open(package, encoding="utf-8") as file:
        documents = [d for d in yaml.safe_load_all(file) if d]
    if len(documents) <= 1:
        yield package
        return
    spec = next(d for d in documents if "root" in d)
    log.info("Vertex AI Pipelines: sending the pipeline spec without its Kubernetes platform spec (the /dev/shm mounts apply on KFP)")
    with tempfile.TemporaryDirectory(prefix="gnnflow-vertex-") as folder:
        path = os.path.join(folder, os.path.basename(package))
        with open(path, "w", encoding="utf-8") as file:
            yaml.safe_dump(spec, file, sort_keys=False)
        yield path
