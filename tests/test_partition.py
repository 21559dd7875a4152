"""Step partition: CiteSeer on 2 workers (local and gs://), GLT sampling over the stored
partitions, partitioned loading, and the failures a user can cause."""

from __future__ import annotations

import io
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import google_crc32c
import pandas as pd
import psutil
import pytest
import torch

from components import storage
from components.config import PartitionSpec, load_config
from components.errors import GnnflowError
from components.partition.loading import assign_shards, load_graph
from components.partition.output import read_metadata, read_partition
from components.partition.step import partition
from components.preprocess.step import preprocess
from components.runtime.launcher import launch
from components.serialize.step import read_graph_metadata, serialize
from tests.partition_workers import sample_and_check
from tests.test_citeseer import citeseer_graph, require_citeseer
from tests.test_launcher import worker_processes

pytestmark = pytest.mark.multiworker

NODE, EDGE = "paper", "paper__cites__paper"


@pytest.fixture(scope="module")
def citeseer_tfrecords(tmp_path_factory) -> storage.PublishedOutput:
    """CiteSeer preprocessed and serialized into 4 shards per type."""
    require_citeseer()
    root = tmp_path_factory.mktemp("citeseer")
    raw = {
        "graph": citeseer_graph(),
        "serialize": {"num_shards": 4},
    }
    (root / "config.yaml").write_text(json.dumps(raw))
    config = load_config(root / "config.yaml")
    preprocess(config, root / "pre")
    return serialize(config, root / "pre", root / "tfr")


def whole_graph(serialized: storage.PublishedOutput) -> dict:
    """Every node's features, label, split and original id and every edge, indexed by source id."""
    metadata = read_graph_metadata(serialized)
    graph = load_graph(serialized, metadata, 0, 1)
    nodes, edges = graph.nodes[NODE], graph.edges[EDGE]
    order = torch.argsort(nodes["node_id"])
    eorder = torch.argsort(edges["edge_id"])
    id_map = pd.concat([pd.read_parquet(io.BytesIO(serialized.read_bytes(rel))) for rel in metadata.node_types[NODE].id_map_files])
    return {
        "features": nodes["features"][order],
        "label": nodes["label"][order],
        "split": nodes["split"][order],
        "src": edges["src"][eorder],
        "dst": edges["dst"][eorder],
        "original": id_map.sort_values("node_id")["original_id"].astype(str).tolist(),
    }


def in_range(ids: torch.Tensor, counts: list[int], index: int) -> bool:
    start = sum(counts[:index])
    return bool(((ids >= start) & (ids < start + counts[index])).all())


def check_partitions(published: storage.PublishedOutput, whole: dict[str, torch.Tensor], world_size: int) -> None:
    parts = [read_partition(published, i) for i in range(world_size)]
    counts = [len(p.nodes[NODE]["node_id"]) for p in parts]
    assert parts[0].metadata.node_counts == {NODE: counts}
    # Range books: partition p owns the contiguous partition ids sum(counts[:p]) .. + counts[p].
    assert torch.equal(torch.cat([p.nodes[NODE]["node_id"] for p in parts]), torch.arange(3327))
    sources = torch.cat([p.nodes[NODE]["source_id"] for p in parts])
    assert sorted(sources.tolist()) == list(range(3327)), "every node in exactly one partition"
    assert max(counts) <= 1.1 * min(counts), f"unbalanced partitions {counts}"
    for p in parts:
        n = p.nodes[NODE]
        assert torch.equal(n["features"], whole["features"][n["source_id"]])
        assert torch.equal(n["label"], whole["label"][n["source_id"]])
        assert torch.equal(n["split"], whole["split"][n["source_id"]])
    source_of = sources  # partition id → source id
    eids = torch.cat([p.edges[EDGE]["source_edge_id"] for p in parts])
    assert sorted(eids.tolist()) == list(range(2 * 4552)), "every edge, in both directions, exactly once"
    edge_counts = parts[0].metadata.edge_counts[EDGE]
    assert torch.equal(torch.cat([p.edges[EDGE]["edge_id"] for p in parts]), torch.arange(2 * 4552))
    for p in parts:
        e = p.edges[EDGE]
        forward = e["source_edge_id"] < 4552
        fid, rid = e["source_edge_id"][forward], e["source_edge_id"][~forward] - 4552
        ends = source_of[e["edge_index"]]
        assert torch.equal(ends[:, forward], torch.stack([whole["src"][fid], whole["dst"][fid]]))
        assert torch.equal(ends[:, ~forward], torch.stack([whole["dst"][rid], whole["src"][rid]]))
        assert in_range(e["edge_index"][0], counts, p.index), "edges live with their source node"
        assert in_range(e["edge_id"], edge_counts, p.index)
    assert not published.files_under("books"), "no O(N) partition books: ranges in the metadata describe ownership"
    # Each partition carries its nodes' original ids, in node order.
    from components.partition.output import read_original_ids

    for p in parts:
        originals = read_original_ids(published, p.index, NODE)
        assert len(originals) == len(p.nodes[NODE]["node_id"])
        assert list(originals[:5]) == [whole["original"][int(i)] for i in p.nodes[NODE]["source_id"][:5]]


def _sampled(published: storage.PublishedOutput, whole: dict) -> list[dict]:
    """What GLT's distributed neighbour loader over the stored partitions returned, per worker."""
    source_of = torch.cat([read_partition(published, i).nodes[NODE]["source_id"] for i in range(2)])
    return launch(sample_and_check, (str(published.root), whole["features"], whole["label"], source_of), world_size=2)


@pytest.fixture(scope="module")
def citeseer_whole(citeseer_tfrecords) -> dict:
    """whole_graph of CiteSeer, read once for the tests that compare partitions with it."""
    return whole_graph(citeseer_tfrecords)


@pytest.fixture(scope="module")
def hashed(citeseer_tfrecords, citeseer_whole, tmp_path_factory) -> tuple[storage.PublishedOutput, list[dict]]:
    """CiteSeer hash-partitioned for 2 workers, and what sampling it returned (two tests read both)."""
    published = partition(citeseer_tfrecords.root, tmp_path_factory.mktemp("hashed") / "parts", PartitionSpec(), world_size=2)
    return published, _sampled(published, citeseer_whole)


def test_citeseer_two_workers_local(citeseer_whole, hashed):
    published, results = hashed
    assert published.manifest.counts == {"partitions": 2, f"nodes.{NODE}": 3327, f"edges.{EDGE}": 9104}
    check_partitions(published, citeseer_whole, 2)
    # GLT's distributed neighbor loader over the stored partitions returns the original values.
    for counts in results:
        assert counts["seeds"] == 256 and counts["batches"] == 4
        assert counts["remote"] > 0, "some sampled neighbours live in the other partition"
        assert counts["feature_mismatch"] == 0 and counts["label_mismatch"] == 0


def test_label_propagation_cuts_fewer_edges_and_fetches_less(tmp_path, citeseer_tfrecords, citeseer_whole, hashed):
    hashed_output, hashed_counts = hashed
    options = PartitionSpec(method="label_propagation")
    published = partition(citeseer_tfrecords.root, tmp_path / "lp", options, world_size=2)
    check_partitions(published, citeseer_whole, 2)  # every guarantee of the hash partitioning holds
    cut, hash_cut = read_metadata(published).edge_cut[EDGE], read_metadata(hashed_output).edge_cut[EDGE]
    assert 0.45 < hash_cut < 0.55, "hashing cuts about half the edges of 2 partitions"
    assert cut < 0.5 * hash_cut, (cut, hash_cut)
    assert read_metadata(published).method == "label_propagation"
    rerun = partition(citeseer_tfrecords.root, tmp_path / "lp2", options, world_size=2)
    crcs = {k: v.crc32c for k, v in published.manifest.files.items()}
    assert crcs == {k: v.crc32c for k, v in rerun.manifest.files.items()}, "reruns are bit-identical"
    # Fewer of the nodes GLT samples live in the other partition.
    fetched = {}
    for name, counts in (("hash", hashed_counts), ("lp", _sampled(published, citeseer_whole))):
        assert all(c["feature_mismatch"] == 0 and c["label_mismatch"] == 0 for c in counts)
        fetched[name] = sum(c["remote"] for c in counts) / sum(c["sampled"] for c in counts)
    assert fetched["lp"] < 0.6 * fetched["hash"], fetched


def test_citeseer_two_workers_gcs_sequential_loading(tmp_path, citeseer_tfrecords, gcs_bucket):
    storage.copy_tree(citeseer_tfrecords.root, f"gs://{gcs_bucket}/tfr")
    options = PartitionSpec(load_in_parallel=False, edge_assignment="dst")
    published = partition(f"gs://{gcs_bucket}/tfr", f"gs://{gcs_bucket}/parts", options, world_size=2)
    assert storage.exists(f"gs://{gcs_bucket}/parts/manifest.json")
    parts = [read_partition(published, i) for i in range(2)]
    assert sorted(torch.cat([p.nodes[NODE]["node_id"] for p in parts]).tolist()) == list(range(3327))
    for p in parts:
        assert in_range(p.edges[EDGE]["edge_index"][1], p.metadata.node_counts[NODE], p.index), "edges live with their destination"


def test_shards_are_split_disjointly_and_balanced():
    files = [f"s{i}" for i in range(7)]
    sizes = [100, 90, 80, 70, 60, 50, 40]
    shares = [assign_shards(files, sizes, r, 3) for r in range(3)]
    assert sorted(f for s in shares for f in s) == files
    loads = [sum(sizes[files.index(f)] for f in s) for s in shares]
    assert max(loads) - min(loads) <= 40
    assert assign_shards(files[:1], sizes[:1], 1, 2) == []


def test_more_workers_than_shards(tmp_path, citeseer_tfrecords):
    published = partition(citeseer_tfrecords.root, tmp_path / "parts", PartitionSpec(), world_size=5)
    parts = [read_partition(published, i) for i in range(5)]
    assert sorted(torch.cat([p.nodes[NODE]["node_id"] for p in parts]).tolist()) == list(range(3327))


def copy_of(serialized: storage.PublishedOutput, tmp_path: pathlib.Path) -> pathlib.Path:
    target = tmp_path / "tfr"
    storage.copy_tree(serialized.root, target)
    return target


def test_missing_shard(tmp_path, citeseer_tfrecords):
    tfr = copy_of(citeseer_tfrecords, tmp_path)
    shard = next(tfr.glob("gen-*/edges/*/shard-00002-of-00004.tfrecord"))
    shard.unlink()
    with pytest.raises(GnnflowError) as error:
        partition(tfr, tmp_path / "parts", PartitionSpec(), world_size=2)
    assert str(shard) in str(error.value) and "does not exist" in str(error.value)
    assert not (tmp_path / "parts" / "manifest.json").exists()
    assert not list((tmp_path / "parts").glob("gen-*")), "the failed run's staged files are removed"


def corrupt_copy(serialized: storage.PublishedOutput, tmp_path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """A copy of ``serialized`` with one byte of a node shard flipped: (its root, the shard)."""
    tfr = copy_of(serialized, tmp_path)
    shard = next(tfr.glob("gen-*/nodes/paper/shard-00001-of-00004.tfrecord"))
    data = bytearray(shard.read_bytes())
    data[5000] ^= 0xFF
    shard.write_bytes(bytes(data))
    return tfr, shard


def test_corrupt_shard(tmp_path, citeseer_tfrecords):
    tfr, shard = corrupt_copy(citeseer_tfrecords, tmp_path)
    with pytest.raises(GnnflowError) as error:
        partition(tfr, tmp_path / "parts", PartitionSpec(), world_size=2)  # CiteSeer's types decode in the workers
    message = str(error.value)
    assert f"worker rank 0 failed: loading node type 'paper' failed: {shard} is damaged: its CRC32C is" in message, message
    assert not (tmp_path / "parts" / "manifest.json").exists()


def test_a_worker_data_error_is_one_line_and_leaks_nothing(tmp_path, citeseer_tfrecords):
    tfr, shard = corrupt_copy(citeseer_tfrecords, tmp_path)
    config = "graph: {nodes: [{uri: x.csv, label_column: y}], edges: [{uri: e.csv}]}\npartition: {subprocess_min_bytes: 0}\n"
    (tmp_path / "c.yaml").write_text(config)  # every type in a subprocess: its errors travel back too
    command = [
        sys.executable,
        "-m",
        "components.partition",
        "--input",
        str(tfr),
        "--output",
        str(tmp_path / "parts"),
        "--world-size",
        "2",
        "--config",
        str(tmp_path / "c.yaml"),
    ]
    env = os.environ | {"PYTHONPATH": str(pathlib.Path(__file__).parents[1])}
    quiet = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert quiet.returncode == 2
    assert f"worker rank 0 failed: loading node type 'paper' failed in its subprocess: {shard} is damaged: its CRC32C is" in quiet.stderr
    assert "Traceback" not in quiet.stderr, "an expected data error carries no traceback"
    assert "leaked" not in quiet.stderr, quiet.stderr[-2000:]
    # --verbose adds the traceback; the error decoded in the worker itself (no loader subprocess to start) shows it as well.
    (tmp_path / "c.yaml").write_text(config.replace("subprocess_min_bytes: 0", "subprocess_min_bytes: 1000000000"))
    verbose = subprocess.run(command + ["--verbose"], capture_output=True, text=True, timeout=300, env=env)
    assert verbose.returncode == 2 and "Traceback" in verbose.stderr and "leaked" not in verbose.stderr


def test_metadata_that_disagrees_with_the_shards(tmp_path, citeseer_tfrecords):
    tfr = copy_of(citeseer_tfrecords, tmp_path)
    path = next(tfr.glob("gen-*/graph_metadata.json"))
    meta = json.loads(path.read_text())
    meta["node_types"][NODE]["count"] = 3000
    path.write_bytes(written := json.dumps(meta).encode())
    # Published so, not damaged after publishing (which the manifest's checksum would catch first):
    # the manifest records the disagreeing file, as a faulty serialize would have written it.
    manifest = json.loads((tfr / "manifest.json").read_text())
    manifest["files"]["graph_metadata.json"] = {"crc32c": f"{google_crc32c.value(written):08x}", "size": len(written)}
    (tfr / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(GnnflowError) as error:
        partition(tfr, tmp_path / "parts", PartitionSpec(), world_size=2)
    assert "graph_metadata.json says 3000 nodes but the shards hold 3327" in str(error.value)


def test_killed_worker_fails_the_step_fast_and_a_rerun_succeeds(tmp_path, citeseer_tfrecords):
    command = [
        sys.executable,
        "-m",
        "components.partition",
        "--input",
        str(citeseer_tfrecords.root),
        "--output",
        str(tmp_path / "parts"),
        "--world-size",
        "2",
        "--config",
        str(tmp_path / "c.yaml"),
    ]
    (tmp_path / "c.yaml").write_text(
        "graph: {nodes: [{uri: x.csv, label_column: y}], edges: [{uri: e.csv}]}\n"
        "partition: {load_in_parallel: false, subprocess_min_bytes: 0}\n"
    )
    proc = subprocess.Popen(
        command, stderr=subprocess.PIPE, text=True, env=os.environ | {"PYTHONPATH": str(pathlib.Path(__file__).parents[1])}
    )
    launcher = psutil.Process(proc.pid)
    deadline = time.monotonic() + 90
    victim = None
    while victim is None and time.monotonic() < deadline:
        workers = [w for w in worker_processes(launcher.pid) if w.children()]  # a worker loading shards in a subprocess
        victim = workers[-1] if len(workers) == 2 else None
        time.sleep(0.2)
    assert victim is not None, "workers never started loading"
    victim.send_signal(signal.SIGKILL)
    _, stderr = proc.communicate(timeout=90)
    assert proc.returncode != 0
    assert "timed out" not in stderr.lower(), "stopped by the death itself, not by a peer's timeout"
    assert "rank" in stderr and "SIGKILL" in stderr
    assert not (tmp_path / "parts" / "manifest.json").exists()
    assert not psutil.pid_exists(victim.pid) or psutil.Process(victim.pid).status() == psutil.STATUS_ZOMBIE
    rerun = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert storage.open_published(tmp_path / "parts").manifest.counts["partitions"] == 2


def test_heterogeneous_graph(tmp_path):
    (tmp_path / "papers.csv").write_text(
        "pid,topic,year\n" + "".join(f"p{i},{'ml' if i % 2 else 'db'},{2000 + i % 20}\n" for i in range(60))
    )
    (tmp_path / "authors.csv").write_text("aid,h\n" + "".join(f"a{i},{i % 7}\n" for i in range(40)))
    (tmp_path / "writes.csv").write_text("author,paper,order\n" + "".join(f"a{i % 40},p{(i * 7) % 60},{i % 3}\n" for i in range(120)))
    (tmp_path / "cites.csv").write_text("a,b\n" + "".join(f"p{i % 60},p{(i * 13 + 1) % 60}\n" for i in range(90)))
    raw = {
        "graph": {
            "nodes": [
                {
                    "type": "paper",
                    "uri": "papers.csv",
                    "id_column": "pid",
                    "label_column": "topic",
                    "features": [{"columns": ["year"], "transform": "standardize"}],
                },
                {"type": "author", "uri": "authors.csv", "id_column": "aid", "features": [{"columns": ["h"]}]},
            ],
            "edges": [
                {
                    "type": "writes",
                    "uri": "writes.csv",
                    "src_column": "author",
                    "dst_column": "paper",
                    "src_type": "author",
                    "dst_type": "paper",
                    "undirected": False,
                    "features": [{"columns": ["order"]}],
                },
                {"type": "cites", "uri": "cites.csv", "src_column": "a", "dst_column": "b", "src_type": "paper", "dst_type": "paper"},
            ],
        },
        "serialize": {"num_shards": 2},
    }
    (tmp_path / "config.yaml").write_text(json.dumps(raw))
    config = load_config(tmp_path / "config.yaml")
    preprocess(config, tmp_path / "pre")
    serialize(config, tmp_path / "pre", tmp_path / "tfr")
    published = partition(tmp_path / "tfr", tmp_path / "parts", PartitionSpec(), world_size=2)
    parts = [read_partition(published, i) for i in range(2)]
    for node_type, count in (("paper", 60), ("author", 40)):
        assert sorted(torch.cat([p.nodes[node_type]["node_id"] for p in parts]).tolist()) == list(range(count))
    writes = torch.cat([p.edges["author__writes__paper"]["source_edge_id"] for p in parts])
    assert sorted(writes.tolist()) == list(range(120)), "directed edges are stored once"
    cites = torch.cat([p.edges["paper__cites__paper"]["source_edge_id"] for p in parts])
    assert sorted(cites.tolist()) == list(range(180)), "undirected edges in both directions"
    for p in parts:
        src = p.edges["author__writes__paper"]["edge_index"][0]
        assert in_range(src, p.metadata.node_counts["author"], p.index)
        assert in_range(p.edges["author__writes__paper"]["edge_id"], p.metadata.edge_counts["author__writes__paper"], p.index)
    from components.gnn.glt_dataset import to_dist_dataset

    dataset = to_dist_dataset(parts[0])
    assert set(dataset.node_features) == {"paper", "author"}
    # An edge book (a range book) only for the edge type with features.
    assert set(dataset.edge_pb) == {("author", "writes", "paper")}
    assert dataset.node_pb["author"][torch.tensor([0, 39])].tolist() == [0, 1]
    assert set(dataset.graph) == {("author", "writes", "paper"), ("paper", "cites", "paper")}
