"""The sizing model's arithmetic on small known shapes (components/*/sizing.py, pipelines/machine_sizes.py)."""

from __future__ import annotations

import pytest

from components.config import GnnflowConfig, PartitionSpec, TrainingSpec
from components.gnn import worker_sizing
from components.graph_size import EdgeSize, GraphSize, NodeSize, StepPrediction
from components.infer import sizing as infer_sizing
from components.partition import sizing as partition_sizing
from components.train import sizing as train_sizing
from pipelines import machine_sizes
from pipelines.sizing_report import plan_replicas, refusal
from tests.small_graphs import with_updates

MiB = 2**20


def _config(ratio: float = 0.0) -> GnnflowConfig:
    raw = {
        "graph": {"nodes": [{"uri": "nodes.csv", "label_column": "label"}], "edges": [{"uri": "edges.csv"}]},
        "training": {"feature_cache_ratio": ratio, "fan_outs": [10, 5]},
    }
    return with_updates(raw)


def _graph(value_bytes: int = 4) -> GraphSize:
    # 1,000 nodes of 10 features, 3,000 undirected edges: stored 6,000 directed
    return GraphSize((NodeSize("node", 1000, 10, value_bytes, labeled=True),), (EdgeSize("node", "edge", "node", 3000),), train_seeds=100)


def test_stored_edges_count_as_partition_stores_them():
    graph = GraphSize(
        (NodeSize("paper", 10, 4), NodeSize("author", 5, 0)),
        (
            EdgeSize("paper", "cites", "paper", 7),  # undirected, one type: both directions
            EdgeSize("author", "writes", "paper", 3),  # undirected, two types: forward and rev_
            EdgeSize("paper", "follows", "paper", 2, undirected=False),
            EdgeSize("paper", "likes", "paper", 4, undirected=False, role="positive_label"),
        ),
    )
    stored = {s.name: (s.count, s.message, s.compressed_type) for s in graph.stored_edges()}
    assert stored == {
        "paper__cites__paper": (14, True, "paper"),
        "author__writes__paper": (3, True, "author"),
        "paper__rev_writes__author": (3, True, "paper"),
        "paper__follows__paper": (2, True, "paper"),
        "paper__likes__paper": (4, False, "paper"),
    }
    assert graph.directed_message_edges() == 22
    assert {s.name: s.compressed_type for s in graph.stored_edges("dst")}["author__writes__paper"] == "paper"


def test_partition_peak_is_the_floor_plus_a_multiple_of_its_share():
    # a worker's share at 2 workers: 500 nodes x (id, source id, split, label, 10 float32) + 3,000 stored edges x 33 bytes
    assert partition_sizing.partition_bytes(_graph(), 2) == 500 * (17 + 8 + 40) + 3000 * 33
    prediction = partition_sizing.predict(_graph(), 2, PartitionSpec())
    assert prediction.peak_rss_mib_per_worker == pytest.approx(partition_sizing.FLOOR_MIB + partition_sizing.SHARE_FACTOR * 131_500 / MiB)
    assert prediction.shm_mib_per_worker == pytest.approx(1.0)  # below subprocess_min_bytes: loaded in the worker itself
    everything = 1000 * 65 + 6000 * 33 + 1000 * partition_sizing.ID_MAP_BYTES_PER_NODE
    assert prediction.disk_mib == pytest.approx(everything / MiB)
    subprocess = partition_sizing.predict(_graph(), 2, PartitionSpec(subprocess_min_bytes=0))
    assert subprocess.shm_mib_per_worker == pytest.approx((500 * (8 + 8 + 1 + 40) + 1500 * 25) / MiB + 1.0)


def test_train_keeps_features_labels_and_the_csr_and_adds_the_larger_of_setup_and_epoch():
    kept = worker_sizing.kept_bytes(_graph(), 2, _config())
    assert kept == {
        "features": 500 * 40,
        "whole feature tables": 0,
        "labels and ids": 500 * 17,
        "learnt embeddings": 0,
        "CSR": 1001 * 8 + 3000 * 8,  # indptr, indices; no edge ids without edge features
    }
    transient = worker_sizing.setup_transient_bytes(_graph(), 2, _config())
    assert transient == worker_sizing.SETUP_BYTES_PER_EDGE * 3000
    prediction = train_sizing.predict(_graph(), 2, _config())
    working = worker_sizing.EPOCH_WORKING_MIB_PER_SQRT_MILLION_NODES * (_graph().total_nodes / 1e6) ** 0.5
    extra = max(transient / MiB, working)
    assert prediction.peak_rss_mib_per_worker == pytest.approx(worker_sizing.FLOOR_MIB + sum(kept.values()) / MiB + extra)
    # /dev/shm: the worker's features, its adjacency (indptr over every node, indices and edge ids), 1 MiB of queues
    assert prediction.shm_mib_per_worker == pytest.approx((20_000 + 1001 * 8 + 3000 * 16) / MiB + 1.0)


def test_copying_whole_tables_costs_the_peers_rows_on_their_way_in():
    """Two workers copy the whole table (ratio 1.5): the peers' rows arrive in a buffer once,
    which outweighs GLT's sort of the edges on a graph with wide rows."""
    graph = GraphSize((NodeSize("node", 1_000_000, 100, 4, labeled=True),), (EdgeSize("node", "edge", "node", 1_000_000),), train_seeds=10)
    assert worker_sizing.setup_transient_bytes(graph, 2, _config(ratio=1.5)) == 500_000 * 400
    assert worker_sizing.setup_transient_bytes(graph, 2, _config(ratio=0.0)) == worker_sizing.SETUP_BYTES_PER_EDGE * 1_000_000


def test_narrower_feature_storage_shrinks_features_by_its_bytes():
    wide, narrow = train_sizing.predict(_graph(4), 2, _config()), train_sizing.predict(_graph(1), 2, _config())
    assert (wide.shm_mib_per_worker - narrow.shm_mib_per_worker) * MiB == pytest.approx(500 * 10 * 3)
    assert partition_sizing.partition_bytes(_graph(4), 2) - partition_sizing.partition_bytes(_graph(1), 2) == 500 * 10 * 3


def test_two_workers_copy_the_whole_table_under_the_default_ratio_and_four_do_not():
    two = worker_sizing.kept_bytes(_graph(), 2, _config(ratio=1.5))
    assert two["whole feature tables"] == 1000 * (40 + 8) and two["features"] == 0
    assert worker_sizing.kept_bytes(_graph(), 4, _config(ratio=1.5))["whole feature tables"] == 0


def test_epoch_time_follows_seeds_fan_outs_and_cores():
    # 50 seeds per worker, each bringing 1 + 6 + 6 x 5 nodes (the first hop capped at the average degree 6)
    assert train_sizing.sampled_per_seed([10, 5], 6.0) == 1 + 6 + 30
    one = train_sizing.epoch_seconds(_graph(), 2, _config(), cores_per_worker=1.0)
    assert one == pytest.approx(50 * 37 / train_sizing.SAMPLED_NODES_PER_CORE_S)
    assert train_sizing.epoch_seconds(_graph(), 2, _config(), cores_per_worker=8.0) == pytest.approx(
        one / 8**train_sizing.THREAD_SCALING_EXPONENT
    )


def test_infer_adds_its_output_rows_and_writes_them():
    config = _config()
    prediction = infer_sizing.predict(_graph(), 2, config)
    row = 64 * 4  # hidden 64 float32; classes unknown
    assert infer_sizing.output_row_bytes(_graph(), config) == row + 8
    assert prediction.disk_mib == pytest.approx(1000 * (row + 8 + infer_sizing.ID_BYTES_PER_ROW) / MiB)
    assert prediction.peak_rss_mib_per_worker >= train_sizing.predict(_graph(), 2, config).peak_rss_mib_per_worker


def test_correct_and_smooth_counts_the_held_target_rows_and_its_matrices():
    """A graph whose target rows dwarf the rest: smoothing's held rows set infer's peak; choosing
    the alphas on validation holds every candidate pair's matrices side by side."""
    graph = GraphSize(
        (NodeSize("node", 40_000_000, 4, 1, labeled=True),), (EdgeSize("node", "edge", "node", 40_000_000),), train_seeds=10, classes=40
    )
    plain = infer_sizing.predict(graph, 2, _config()).peak_rss_mib_per_worker
    peaks = {}
    for selection, pairs, corrections in (("fixed", 1, 1), ("validation", 9, 3)):
        smoothing = with_updates(
            {**_config().model_dump(mode="json"), "infer": {"smoothing": "correct_and_smooth", "alpha_selection": selection}}
        )
        assert infer_sizing.smoothing_candidates(smoothing) == (pairs, corrections)
        peaks[selection] = infer_sizing.predict(graph, 2, smoothing).peak_rss_mib_per_worker
        own, row = 20_000_000, infer_sizing.output_row_bytes(graph, smoothing) + infer_sizing.PER_NODE_BYTES
        matrices = (infer_sizing.SMOOTHING_MATRICES * pairs + corrections) * 40 * 4
        held = own * (row + matrices) + 40_000_000 * infer_sizing.SMOOTHING_BYTES_PER_EDGE
        assert peaks[selection] > plain and peaks[selection] >= held / MiB, selection
    # 8 more pairs of 40 classes float32, five matrices each, and 2 more corrected: 6,720 bytes per node more.
    assert peaks["validation"] - peaks["fixed"] == pytest.approx(20_000_000 * (5 * 8 + 2) * 40 * 4 / MiB)


def test_the_machine_table_knows_compute_engines_ratios():
    assert machine_sizes.machine("n1-standard-8").memory_gib == 30.0
    assert machine_sizes.machine("n2-highmem-4").memory_gib == 32.0
    assert machine_sizes.machine("e2-highcpu-16").memory_gib == 16.0
    assert machine_sizes.machine("n1-highcpu-2").memory_gib == pytest.approx(1.8)
    assert machine_sizes.machine("g2-standard-8") is None and machine_sizes.machine("n1-standard-3") is None
    # 10 GiB x 1.25 margin + 1 GiB reserve = 13.5 GiB: n1-standard-4 (15 GiB) in its series, n2-highmem-2 (16 GiB) across
    assert machine_sizes.smallest_fitting(10.0, 1, "n1-standard").name == "n1-standard-4"
    assert machine_sizes.smallest_fitting(10.0, 1, None).name in ("n2-highmem-2", "e2-highmem-2")
    assert machine_sizes.smallest_fitting(10.0, 8, "n1-standard").name == "n1-standard-8"  # a vCPU per worker
    assert machine_sizes.smallest_fitting(10_000.0, 1, None) is None


def test_a_machine_too_small_for_a_replica_is_refused_naming_the_key_the_need_and_its_memory():
    big = GraphSize((NodeSize("node", 20_000_000, 128, labeled=True),), (EdgeSize("node", "edge", "node", 100_000_000),), train_seeds=1)
    config = _config()
    plan = plan_replicas(big, config, 2, "n1-standard-4")
    message = refusal(plan)
    assert message is not None
    need = plan.need_gib
    assert message.startswith(
        f"resources.custom_job.machine_type n1-standard-4 (15 GiB) cannot hold a replica's partition workers: predicted {need:.1f} GiB"
    )
    assert f"; {plan.recommended.name} holds it" in message and plan.recommended.series == "n1-standard"
    assert refusal(plan_replicas(big, config, 2, plan.recommended.name)) is None


def test_json_has_exactly_the_promised_shape():
    plan = plan_replicas(_graph(), _config(), 4, None)
    data = plan.as_json()
    assert set(data) == {"world_size", "steps", "machine_type"} and data["world_size"] == 4
    assert set(data["steps"]) == {"partition", "train", "infer"}
    for name, values in data["steps"].items():
        expected = {"peak_rss_mib_per_worker", "shm_mib_per_worker", "disk_mib"} | ({"epoch_s"} if name == "train" else set())
        assert set(values) == expected
    assert isinstance(plan.steps["train"], StepPrediction) and data["machine_type"] == plan.recommended.name


def test_training_spec_default_copies_at_two_workers():
    assert TrainingSpec().feature_cache_ratio == 1.5  # the model's copies follow the config's default
