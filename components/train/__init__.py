"""Step ``train``: distributed GLT sampling + GraphSAGE under DistributedDataParallel."""
