"""Step ``partition``: TFRecords → one graph partition per worker, plus partition books."""
