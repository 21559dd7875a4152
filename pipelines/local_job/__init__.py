"""``gnnflow local-job``: a CustomJob task of a compiled Vertex pipeline, run on this machine as Vertex AI would start it."""
