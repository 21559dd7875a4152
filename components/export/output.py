"""What the ``export`` step publishes, and the names readers find it by.

Output (published atomically, before any BigQuery table is changed)::

    vector_search/embeddings-<n>.json   output.vector_search: JSON lines in Vertex AI Vector Search's
                                        batch input format (id, embedding, restricts); nothing else
                                        in this folder, so it can be an index's contents_delta_uri
    bigquery.json                       output.bigquery: the dataset, write mode, run id and the
                                        tables with the rows each receives
    config.resolved.yaml

The manifest's metadata names the infer output read, the run id, and the Vector Search folder
(``vector_search.folder``, a full URI) with its dimensions.
"""

from __future__ import annotations

STEP = "export"
VECTOR_SEARCH_FOLDER = "vector_search"
TABLES_FILE = "bigquery.json"
