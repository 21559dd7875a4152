"""Step ``report``: final metrics, training curves and an embedding projection in one HTML page."""
