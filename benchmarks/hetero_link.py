"""Heterogeneous link prediction per model type: the pipeline (GLT, 2 workers) vs a single-process
PyG LinkNeighborLoader loop with the same model, on the papers/authors demo graph; prints markdown.

Graph: `components.demo.hetero_graph` with --papers papers and --authors authors (3 citations per
paper, 2-6 papers per author: about 1M edges at the defaults), `writes` undirected; task: link
prediction on author-writes-paper ("which papers will this author write"), split 85/5/10.
Preprocess, serialize and partition run once (untimed). Then for each model type:
- pipeline: `train` (2 workers, --epochs, batch --batch-size, fan-outs [10, 5], random negatives
  1:1) and `infer` (sampled); epoch seconds and batches/s from metrics.jsonl, test MRR / hits@10 /
  ROC-AUC from infer's metrics.json (each test edge ranked against 100 seeded random papers).
- PyG: the same model built by `components.gnn.build.build_model` over a `HeteroData` of the
  same partitions' features and training edges (both stored directions), trained in one process
  (2 threads) with `LinkNeighborLoader` (same batch size, fan-outs, 1:1 binary negatives); test
  MRR / hits@10 from embeddings of every node computed with `NeighborLoader`, each test edge ranked
  against 100 seeded random papers (the same definition, other draws).

    python benchmarks/hetero_link.py [--papers 200000] [--authors 100000] [--epochs 2] [--models graphsage,gat,rgcn]
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

FAN_OUTS = [10, 5]
RANKED = 100


def make_config(tables: dict, model_type: str, args: argparse.Namespace):
    from components.config import GnnflowConfig

    return GnnflowConfig.model_validate({
        "graph": {
            "nodes": [
                {"type": "paper", "uri": str(tables["papers"]), "id_column": "paper_id", "features": [{"columns": ["w*"]}]},
                {"type": "author", "uri": str(tables["authors"]), "id_column": "author_id",
                 "features": [{"columns": ["h_index"], "transform": "standardize"}, {"columns": ["field"], "transform": "one_hot"}]},
            ],
            "edges": [
                {"type": "cites", "uri": str(tables["cites"]), "src_type": "paper", "dst_type": "paper"},
                {"type": "writes", "uri": str(tables["writes"]), "src_column": "author_id", "dst_column": "paper_id",
                 "src_type": "author", "dst_type": "paper"},
            ],
        },
        "task": {"type": "link_prediction", "target": "writes", "split": {"train": 0.85, "val": 0.05, "test": 0.10, "seed": 0}},
        "resources": {"world_size": 2},
        "model": {"type": model_type, "hidden_channels": 64, "dropout": 0.1},
        "training": {"epochs": args.epochs, "batch_size": args.batch_size, "fan_outs": FAN_OUTS, "learning_rate": 0.005,
                     "weight_decay": 0.0, "early_stopping_patience": None},
        "retrieval": {"enabled": False},
    })


def pyg_run(partitions_uri: str, config, result) -> None:
    """One process: the same model over the same features and training edges, PyG loaders."""
    import torch
    from torch_geometric.data import HeteroData
    from torch_geometric.loader import LinkNeighborLoader, NeighborLoader

    from components import storage
    from components.gnn.build import build_model
    from components.gnn.link_labels import positive_pairs, training_edges
    from components.gnn.glt_dataset import edge_type_tuple
    from components.schema import stored_edge_types
    from components.partition.output import STEP
    from components.partition.output import read_partition

    torch.set_num_threads(2)
    torch.manual_seed(0)
    partitions = storage.open_published(partitions_uri, step=STEP)
    parts = [read_partition(partitions, i) for i in range(2)]
    schema = parts[0].metadata.schema
    data = HeteroData()
    for node_type in schema.node_types:  # partition ids are global and contiguous by partition
        data[node_type].x = torch.cat([p.nodes[node_type]["features"] for p in parts]).to(torch.float32)
        data[node_type].num_nodes = len(data[node_type].x)
    for name in stored_edge_types(schema):
        kept = [p.edges[name]["edge_index"][:, training_edges(p, schema, 1)[name]] for p in parts]
        data[edge_type_tuple(name)].edge_index = torch.cat(kept, dim=1)
    target = edge_type_tuple(schema.target)
    train_pairs = torch.cat([positive_pairs(p, "train")[0] for p in parts], dim=1)
    test_pairs = torch.cat([positive_pairs(p, "test")[0] for p in parts], dim=1)
    model = build_model(schema, config, "in")  # PyG batches name edges as stored: messages flow source → destination
    optimizer = torch.optim.Adam(model.parameters(), lr=config.training.learning_rate)
    loader = LinkNeighborLoader(data, num_neighbors=FAN_OUTS, edge_label_index=(target, train_pairs), neg_sampling="binary",
                                batch_size=config.training.batch_size, shuffle=True)

    def with_ids(batch):
        for node_type in batch.node_types:
            batch[node_type].node = batch[node_type].n_id
        return batch

    epochs = []
    for _ in range(config.training.epochs):
        model.train()
        start, batches = time.perf_counter(), 0
        for batch in loader:
            batch = with_ids(batch)
            optimizer.zero_grad()
            logits = model(batch, batch[target].edge_label_index)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch[target].edge_label.float())
            loss.backward()
            optimizer.step()
            batches += 1
        epochs.append((time.perf_counter() - start, batches))
    model.eval()
    z = {}
    with torch.no_grad():
        for node_type in ("author", "paper"):
            rows = []
            for batch in NeighborLoader(data, num_neighbors=FAN_OUTS, input_nodes=node_type, batch_size=4096):
                rows.append(model.encoder.encode_batch(with_ids(batch))[node_type][: batch[node_type].batch_size])
            z[node_type] = torch.cat(rows)
        generator = torch.Generator().manual_seed(0)
        ranked = torch.randint(0, len(z["paper"]), (test_pairs.shape[1], RANKED), generator=generator)
        positive = model.score(z["author"][test_pairs[0]], z["paper"][test_pairs[1]])
        against = model.score(z["author"][test_pairs[0]].repeat_interleave(RANKED, 0), z["paper"][ranked.reshape(-1)]).reshape(-1, RANKED)
        rank = 1 + (against >= positive[:, None]).sum(1).to(torch.float64)
    result.put({"epochs": epochs, "mrr": float((1 / rank).mean()), "hits@10": float((rank <= 10).to(torch.float64).mean())})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--papers", type=int, default=200_000)
    parser.add_argument("--authors", type=int, default=100_000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--models", default="graphsage,gat,rgcn")
    args = parser.parse_args()

    from components import storage
    from components.demo.hetero_graph import generate_hetero_demo_graph, write_hetero_demo_graph
    from components.infer.step import infer
    from components.partition.step import partition
    from components.preprocess.step import preprocess
    from components.serialize.step import serialize
    from components.train.step import train

    logging.basicConfig(level=logging.WARNING)
    root = Path(tempfile.mkdtemp(prefix="gnnflow-hetero-link-"))
    graph = generate_hetero_demo_graph(args.papers, args.authors, seed=0)
    tables = write_hetero_demo_graph(graph, root / "tables")
    edges = len(graph.cites) + len(graph.writes)
    r = storage.parse_uri(root)
    first = make_config(tables, "graphsage", args)
    start = time.perf_counter()
    preprocess(first, r.join("pre"))
    serialize(first, r.join("pre"), r.join("tfr"))
    parts = partition(r.join("tfr"), r.join("parts"), first.partition, world_size=2).root
    prep = time.perf_counter() - start
    rows = []
    for model_type in args.models.split(","):
        config = make_config(tables, model_type, args)
        model = train(config, parts, r.join(f"model-{model_type}"))
        history = [json.loads(line) for line in model.read_bytes("metrics.jsonl").decode().splitlines()]
        metrics = infer(config, parts, model.root, r.join(f"emb-{model_type}")).read_json("metrics.json")
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        process = context.Process(target=pyg_run, args=(str(parts), config, queue))
        process.start()
        pyg = queue.get()
        process.join()
        glt_seconds = sum(h["seconds"] for h in history) / len(history)
        pyg_seconds = sum(s for s, _ in pyg["epochs"]) / len(pyg["epochs"])
        rows.append({"model": model_type, "glt_epoch_s": glt_seconds, "glt_batches_s": sum(h["batches_per_s"] for h in history) / len(history),
                     "glt_mrr": metrics["test_mrr"], "glt_hits": metrics["test_hits@10"], "glt_auc": metrics["test_roc_auc"],
                     "pyg_epoch_s": pyg_seconds, "pyg_batches_s": pyg["epochs"][0][1] / pyg_seconds, "pyg_mrr": pyg["mrr"],
                     "pyg_hits": pyg["hits@10"]})
        print(json.dumps(rows[-1]), flush=True)
    print(f"\n{args.papers:,} papers, {args.authors:,} authors, {edges:,} edges; {platform.machine()}, {os.cpu_count()} cores, "
          f"{time.strftime('%Y-%m-%d')}; preprocess+serialize+partition {prep:.0f} s; {args.epochs} epochs, batch {args.batch_size}, "
          f"fan-outs {FAN_OUTS}\n")
    print("| model | pipeline epoch (s) | batches/s | test MRR | hits@10 | ROC-AUC | PyG epoch (s) | batches/s | test MRR | hits@10 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['model']} | {row['glt_epoch_s']:.1f} | {row['glt_batches_s']:.1f} | {row['glt_mrr']:.3f} | {row['glt_hits']:.3f} | "
              f"{row['glt_auc']:.3f} | {row['pyg_epoch_s']:.1f} | {row['pyg_batches_s']:.1f} | {row['pyg_mrr']:.3f} | {row['pyg_hits']:.3f} |")


if __name__ == "__main__":
    main()
