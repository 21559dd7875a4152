"""``gnnflow tune``: hyperparameter search on one shared data output (locally with Optuna; on Vertex AI
as a hyperparameter-tuning job, see :mod:`pipelines.tuning_pipeline`)."""
