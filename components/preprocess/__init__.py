"""Step ``preprocess``: raw tables → validated, enumerated, transformed tables."""
