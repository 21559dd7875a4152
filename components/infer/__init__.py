"""Step ``infer``: embeddings (and predictions) for every node, keyed by original ids, with test metrics."""
