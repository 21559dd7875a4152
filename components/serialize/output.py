"""What the ``serialize`` step publishes (TFRecord shards of ``tf.train.Example``), and how later steps read it.

One record per node (``node_id``, ``label``, ``split`` as int64; ``features`` as one packed
float list) and per edge (``edge_id``, ``src``, ``dst``, ``split``; ``features``); an edge's id is
its position within its type, so later steps can name edges (partition books, edge features). Each type is cut into
shards of about equal size so N workers can read disjoint shard subsets in parallel.
A type whose ``feature_storage`` is not float32 has its rows written already stored (one bytes
value a record), a type without features no ``features`` key, and a type without a split no
``split`` key; ``graph_metadata.json``'s ``record_format`` says which (see :mod:`.records`).

Output (published atomically)::

    nodes/<type>/shard-00000-of-00004.tfrecord
    edges/<src>__<rel>__<dst>/shard-*.tfrecord
    id_maps/<type>/part-*.parquet      copied from preprocess, for mapping results back
    graph_metadata.json                the schema every later step reads (files: shards)
    config.resolved.yaml
"""

from __future__ import annotations

from components import storage
from components.schema import GraphSchema

STEP = "serialize"
METADATA_FILE = "graph_metadata.json"
# record_format["features_encoding"] of a type whose rows serialize wrote in their stored type (feature_storage)
STORED_BYTES = "stored_bytes"


def read_graph_metadata(serialized: storage.PublishedOutput) -> GraphSchema:
    return GraphSchema.from_json(serialized.read_bytes(METADATA_FILE).decode(), str(serialized.uri(METADATA_FILE)))


def source_of(serialized: storage.PublishedOutput) -> tuple[str | None, str | None]:
    """The preprocess output these TFRecords were serialized from and its generation then, as the
    manifest records them (None where it does not)."""
    metadata = serialized.manifest.metadata
    return metadata.get("source"), metadata.get("source_generation")
