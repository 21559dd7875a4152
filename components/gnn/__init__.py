"""What training and inference share: models, GLT sampling set-up, the tasks and their metrics."""
