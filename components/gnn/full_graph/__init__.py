"""Full-graph distributed message passing (``training.mode: full_graph``, ``infer --mode exact``).

SAR-style (sequential aggregation and rematerialization): every worker holds only its
partition's nodes, features and the edges its nodes aggregate over. A layer aggregates each
worker's nodes by fetching the rows they need from one peer at a time, block by block
(:mod:`.plan` decides which rows, :mod:`.aggregate` moves and reduces them), and the backward
pass re-fetches those blocks where it needs them instead of keeping them, so a worker's memory
grows with its share of the graph plus one block. :mod:`.encoder` runs GraphSAGE and GCN stacks
on it; :mod:`.node_task` trains node classification with it.
"""
