"""Step ``export``: a run's results to BigQuery tables and a Vertex AI Vector Search input folder."""
