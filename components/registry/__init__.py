"""The model registry: versions of trained models with their metrics and lineage, the aliases
(``blessed``) that the evaluation gate and ``gnnflow models promote|rollback`` move, and the
references (``REGISTRY@blessed``, ``REGISTRY@v3``) inference-only runs resolve.

Backends: a folder on this machine or a ``gs://`` prefix (:mod:`.store`), and a Vertex AI Model
Registry model (:mod:`.vertex`); :func:`open_registry` picks one from the URI."""
