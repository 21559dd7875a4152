"""Step ``register``: a trained model becomes the registry's next version, and the evaluation gate
decides whether it takes the ``blessed`` alias."""
