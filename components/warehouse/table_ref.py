"""A typed reference to one BigQuery table, ``bq://project.dataset.table``."""

from __future__ import annotations

import re
from dataclasses import dataclass

from components.errors import GnnflowError

SCHEME = "bq://"
# Project ids may hold dashes, dots and a domain prefix ("example.com:proj"); dataset and table
# names are letters, digits and underscores (tables also allow dashes and spaces, not supported).
_PROJECT = r"[a-z][a-z0-9.:-]*[a-z0-9]"
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_TABLE_URI = re.compile(rf"^bq://(?P<project>{_PROJECT})\.(?P<dataset>{_NAME})\.(?P<table>[A-Za-z0-9_-]+)$")
_DATASET = re.compile(rf"^(?P<project>{_PROJECT})\.(?P<dataset>{_NAME})$")


@dataclass(frozen=True)
class BigQueryTable:
    """One table: ``bq://project.dataset.table`` in configs, ``project.dataset.table`` in SQL."""

    project: str
    dataset: str
    table: str

    @property
    def table_id(self) -> str:
        """The id the client library takes (``project.dataset.table``)."""
        return f"{self.project}.{self.dataset}.{self.table}"

    @property
    def read_path(self) -> str:
        """The resource name the Storage Read API takes."""
        return f"projects/{self.project}/datasets/{self.dataset}/tables/{self.table}"

    def __str__(self) -> str:
        return f"{SCHEME}{self.table_id}"


@dataclass(frozen=True)
class BigQueryDataset:
    """One dataset, ``project.dataset`` (where output tables are written)."""

    project: str
    dataset: str

    def table(self, name: str) -> BigQueryTable:
        return BigQueryTable(self.project, self.dataset, name)

    def __str__(self) -> str:
        return f"{self.project}.{self.dataset}"


def is_bigquery_uri(uri: str) -> bool:
    return uri.startswith(SCHEME)


def parse_table_uri(uri: str) -> BigQueryTable:
    """``bq://project.dataset.table`` as a :class:`BigQueryTable`; anything else is an error naming it."""
    match = _TABLE_URI.match(uri.strip())
    if not match:
        raise GnnflowError(f"'{uri}' is not a BigQuery table URI: expected bq://project.dataset.table")
    return BigQueryTable(match["project"], match["dataset"], match["table"])


def parse_dataset(text: str) -> BigQueryDataset:
    """``project.dataset`` (``output.bigquery``) as a :class:`BigQueryDataset`."""
    match = _DATASET.match(text.strip().removeprefix(SCHEME))
    if not match:
        raise GnnflowError(f"'{text}' is not a BigQuery dataset: expected project.dataset")
    return BigQueryDataset(match["project"], match["dataset"])
