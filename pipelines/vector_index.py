"""``gnnflow vector-index``: create or update a Vertex AI Vector Search index from a run's export.

``gnnflow vector-index --project P --region R --folder gs://.../vector_search --display-name NAME
--dimensions D`` creates an index (tree-AH, or ``--algorithm brute-force``) over the JSON line
files that step export writes (``output.vector_search: true``; the step logs the folder and the
dimensions); ``--update INDEX_ID`` loads the folder into an existing index instead, replacing its
contents (or only adding and replacing points with ``--upsert``). The folder is checked first:
Vector Search reads every file directly under it, and fails hours later on anything else.
"""

from __future__ import annotations

import argparse
import logging
import re
from dataclasses import dataclass
from typing import Any

from components import storage
from components.errors import GnnflowError
from pipelines.run_request import VertexTarget, api_message

log = logging.getLogger("gnnflow.vector_index")

MAX_FILES = 5_000  # Vector Search's limit per folder
DISTANCES = {"dot": "DOT_PRODUCT_DISTANCE", "cosine": "COSINE_DISTANCE", "l2": "SQUARED_L2_DISTANCE"}
_INDEX_ID = re.compile(r"^(projects/[^/]+/locations/[^/]+/indexes/)?[0-9A-Za-z_-]+$")


@dataclass(frozen=True)
class IndexRequest:
    """What to build: a new index (``update`` None) or new contents for an existing one."""

    folder: str
    display_name: str | None = None
    dimensions: int | None = None
    update: str | None = None
    algorithm: str = "tree-ah"  # tree-ah or brute-force
    distance: str = "dot"  # dot (infer's retrieval score), cosine or l2
    neighbors: int = 10  # tree-ah: approximate_neighbors_count
    upsert: bool = False  # update: add and replace points only, keep the others

    def __post_init__(self) -> None:
        if not self.folder.startswith("gs://"):
            raise GnnflowError(f"--folder must be a gs:// folder (Vector Search reads from Cloud Storage), got {self.folder!r}")
        if self.distance not in DISTANCES:
            raise GnnflowError(f"--distance {self.distance!r}: choose one of {', '.join(DISTANCES)}")
        if self.update is not None:
            if not _INDEX_ID.match(self.update):
                raise GnnflowError(f"--update {self.update!r} is not an index id or projects/P/locations/L/indexes/ID")
            return
        if not self.display_name:
            raise GnnflowError("creating an index needs --display-name (or give --update INDEX_ID to update one)")
        if self.dimensions is None or self.dimensions < 1:
            raise GnnflowError("creating an index needs --dimensions D (the embedding size; export logs it)")


def check_folder(folder: str) -> int:
    """The number of JSON files directly under ``folder``; an error naming what Vector Search would refuse."""
    root = storage.parse_uri(folder.rstrip("/") + "/")
    found = storage.list_files(root)
    if not found:
        raise GnnflowError(f"{folder} holds no files: point --folder at the vector_search folder of a published export")
    for uri in found:
        relative = storage.relative_to(uri, root)
        if "/" in relative and not relative.startswith("delete/"):
            raise GnnflowError(f"{folder} holds a subfolder ({relative}): Vector Search allows only files and a delete/ folder there")
        if "/" not in relative and not relative.endswith(".json"):
            raise GnnflowError(f"{folder} holds {relative}, not a .json file: Vector Search would refuse it")
    if len(found) > MAX_FILES:
        raise GnnflowError(f"{folder} holds {len(found)} files; Vector Search reads at most {MAX_FILES}")
    return len(found)


def build_index(target: VertexTarget, request: IndexRequest) -> Any:
    """Creates or updates the index; returns the SDK's ``MatchingEngineIndex`` (its operation done)."""
    from google.api_core import exceptions as api_exceptions
    from google.cloud import aiplatform
    from google.cloud.aiplatform.matching_engine import matching_engine_index_config as index_config

    from pipelines.vertex_submit import init_vertex, vertex_call

    files = check_folder(request.folder)
    init_vertex(target)
    distance = getattr(index_config.DistanceMeasureType, DISTANCES[request.distance])
    try:
        if request.update is not None:
            index_name, subject = request.update, f"Vector Search index {request.update}"
            index = vertex_call(target, subject, lambda: aiplatform.MatchingEngineIndex(index_name=index_name))
            vertex_call(
                target,
                subject,
                lambda: index.update_embeddings(contents_delta_uri=request.folder, is_complete_overwrite=not request.upsert),
            )
            log.info("vector-index: %s updated from %s (%d files, %s)", index.resource_name, request.folder, files,
                     "upsert" if request.upsert else "complete overwrite")  # fmt: skip
            return index
        common = {
            "display_name": request.display_name,
            "contents_delta_uri": request.folder,
            "dimensions": request.dimensions,
            "distance_measure_type": distance,
            "index_update_method": "BATCH_UPDATE",
        }
        create: Any
        if request.algorithm == "brute-force":
            create = lambda: aiplatform.MatchingEngineIndex.create_brute_force_index(**common)  # noqa: E731
        else:
            # Vertex AI's documented tree-AH defaults, given so the request names its algorithm.
            create = lambda: aiplatform.MatchingEngineIndex.create_tree_ah_index(  # noqa: E731
                **common,
                approximate_neighbors_count=request.neighbors,
                leaf_node_embedding_count=1000,
                leaf_nodes_to_search_percent=10,
            )
        # A new index has no caller-chosen id: repeated only when the request never left this machine.
        index = vertex_call(target, f"a Vector Search index from {request.folder}", create, idempotent=False)
    except api_exceptions.GoogleAPICallError as exc:
        raise GnnflowError(f"Vertex AI refused the index request for {request.folder}: {api_message(exc)}") from None
    log.info("vector-index: created %s from %s (%d files, %d dimensions)", index.resource_name, request.folder, files, request.dimensions)
    return index


def _command(args: argparse.Namespace) -> None:
    target = VertexTarget(args.project or "", args.region or "", api_endpoint=args.api_endpoint, check_pipeline_root=False)
    request = IndexRequest(
        folder=args.folder,
        display_name=args.display_name,
        dimensions=args.dimensions,
        update=args.update,
        algorithm=args.algorithm,
        distance=args.distance,
        neighbors=args.neighbors,
        upsert=args.upsert,
    )
    index = build_index(target, request)
    print(index.resource_name)


def register(commands: argparse._SubParsersAction) -> None:
    """Adds the ``vector-index`` subcommand to the ``gnnflow`` parser."""
    parser = commands.add_parser(
        "vector-index", help="create or update a Vertex AI Vector Search index from an export", description=__doc__
    )
    parser.add_argument("--project", required=True, help="Google Cloud project of the index")
    parser.add_argument("--region", required=True, help="Vertex AI region, e.g. us-central1")
    parser.add_argument("--folder", required=True, help="gs:// folder of JSON line files (an export's vector_search folder)")
    parser.add_argument("--display-name", help="name of a new index")
    parser.add_argument("--dimensions", type=int, help="embedding size of a new index")
    parser.add_argument("--update", metavar="INDEX_ID", help="update this index (id or full resource name) instead of creating one")
    parser.add_argument("--algorithm", choices=["tree-ah", "brute-force"], default="tree-ah", help="a new index's algorithm")
    parser.add_argument("--distance", choices=sorted(DISTANCES), default="dot", help="a new index's distance (default: dot, infer's score)")
    parser.add_argument("--neighbors", type=int, default=10, help="tree-ah: approximate neighbours count (default 10)")
    parser.add_argument("--upsert", action="store_true", help="--update: add and replace points, keep the rest (default: replace all)")
    parser.add_argument("--api-endpoint", help="Vertex AI API endpoint (default: REGION-aiplatform.googleapis.com)")
    parser.set_defaults(handler=_command)
