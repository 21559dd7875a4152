"""Step ``serialize``: preprocessed tables → TFRecord shards and ``graph_metadata.json``."""
