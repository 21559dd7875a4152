"""Names of the tables a run's results are written to: ``<node type>_<kind>`` in the
``output.bigquery`` dataset, one per node type and kind, and the run ids they carry.

Kept free of client imports: the config checks these names before any step runs.
"""

from __future__ import annotations

import re
from typing import Literal

from components.errors import GnnflowError

ResultKind = Literal["embeddings", "predictions", "candidates"]
RESULT_KINDS: tuple[ResultKind, ...] = ("embeddings", "predictions", "candidates")
# BigQuery allows more in table names (dashes, spaces, Unicode letters), but not everywhere
# (SQL needs quoting, some tools refuse them): node types become names as they are, or not at all.
_TABLE_NAME = re.compile(r"^[A-Za-z0-9_]{1,1000}$")
# Run ids are written into SQL as literals (the emulator takes no query parameters inside a
# multi-statement script): only characters that need no escaping.
_RUN_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


def result_table(node_type: str, kind: ResultKind) -> str:
    """The table holding ``kind`` rows of ``node_type``."""
    return f"{node_type}_{kind}"


def check_node_type_name(node_type: str) -> None:
    """A node type whose tables BigQuery (and SQL without quoting tricks) would take."""
    if not _TABLE_NAME.match(result_table(node_type, "embeddings")):
        raise GnnflowError(
            f"node type {node_type!r} cannot name a BigQuery table ({result_table(node_type, 'embeddings')!r}): "
            "output.bigquery needs node types of letters, digits and underscores"
        )


def check_run_id(run_id: str) -> str:
    """``run_id`` if it is 1-128 letters, digits, '_', '.', ':' or '-'; else an error naming it."""
    if not _RUN_ID.match(run_id):
        raise GnnflowError(f"run id {run_id!r} is not allowed: use 1-128 letters, digits, '_', '.', ':' or '-'")
    return run_id
