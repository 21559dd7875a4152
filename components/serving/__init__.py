"""Online inference: a model, its partitions and (optionally) its batch embeddings behind one
predictor, and the HTTP server on Vertex AI Prediction's container contract."""
