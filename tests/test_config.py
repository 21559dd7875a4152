"""Config: defaults, clear errors naming key and file, cross-section checks, init-config."""

from __future__ import annotations

import re

import numpy as np
import pytest
import yaml

from components.config import GnnflowConfig, PreprocessSpec, SplitSpec, TrainingSpec, load_config, parse_config
from components.demo.graph import generate_demo_graph, write_demo_graph
from components.errors import GnnflowError
from components.tables.proposal import PROPOSED_HIDDEN_CHANNELS, count_training_rows, propose_config, rows_keeping_defaults, size_epochs

MINIMAL = "graph:\n  nodes: [{uri: n.csv, label_column: y}]\n  edges: [{uri: e.csv}]\n"


def test_defaults_fill_every_section():
    config = parse_config(MINIMAL, "mem.yaml")
    assert config.task.type == "node_classification" and config.task_target == "node"
    assert config.graph.nodes[0].id_column == "node_id" and config.graph.edges[0].undirected
    assert config.task.split.train == 0.8 and config.serialize.target_shard_bytes == 64 << 20
    assert config.output.root == "runs"


def test_every_field_is_documented():
    def walk(model: type) -> list[str]:
        missing = []
        for name, field in model.model_fields.items():
            if not field.description:
                missing.append(f"{model.__name__}.{name}")
            for inner in getattr(field.annotation, "__args__", ()) + (field.annotation,):
                if isinstance(inner, type) and hasattr(inner, "model_fields"):
                    missing += walk(inner)
        return missing

    assert walk(GnnflowConfig) == []


def test_relative_table_paths_resolve_against_the_config_folder(tmp_path):
    (tmp_path / "c.yaml").write_text(MINIMAL)
    config = load_config(tmp_path / "c.yaml")
    assert config.graph.nodes[0].uri == str(tmp_path / "n.csv")
    assert parse_config(MINIMAL.replace("n.csv", "gs://b/n.csv"), "x").graph.nodes[0].uri == "gs://b/n.csv"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (MINIMAL + "extra: 1\n", "key 'extra': unknown key"),
        (MINIMAL + "task: {type: regression}\n", "key 'task.type': Input should be 'node_classification' or 'link_prediction'"),
        (MINIMAL + "serialize: {num_shards: 0}\n", "key 'serialize.num_shards': Input should be greater than 0"),
        (MINIMAL + "task: {split: {train: 0.9, val: 0.2}}\n", "split fractions sum to 1.2 > 1"),
        ("graph:\n  nodes: [{uri: n.csv}]\n  edges: [{uri: e.csv}]\n", "node_classification needs graph.nodes['node'].label_column"),
        (MINIMAL.replace("{uri: e.csv}", "{uri: e.csv, src_type: user}"), "refers to node type 'user'"),
        (MINIMAL + "task: {type: link_prediction, target: follows}\n", "task.target 'follows' is not an edge type"),
        ("graph: [1, 2]\n", "key 'graph': Input should be a valid dictionary"),
        ("- a\n- b\n", "must be a YAML mapping"),
        ("graph: {nodes: [\n", "is not valid YAML"),
        (MINIMAL + "training:\n  epochs: 50\n  batch_size: 64\n  epochs: 7\n", "key 'epochs' appears twice in one section (lines 5 and 7)"),
        (MINIMAL + "model: {dropout: 0.1}\nmodel: {dropout: 0.2}\n", "key 'model' appears twice"),
        (MINIMAL + "training: {fan_outs: {follows: [5, 5]}}\n", "training.fan_outs names 'follows', not an edge type of graph.edges"),
        (MINIMAL + "training: {fan_outs: {default: [5]}}\n", "training.fan_outs['default'] has 1 entries but model.num_layers is 2"),
        (MINIMAL + "training: {fan_outs: [5, 0]}\n", "training.fan_outs holds [5, 0]: each hop samples a positive number"),
        (MINIMAL + "model: {type: gin}\n", "key 'model.type': Input should be 'graphsage', 'gat', 'rgcn', 'gcn', 'appnp' or 'gcnii'"),
        (MINIMAL + "model: {type: gat, attention_heads: 3}\n", "model.attention_heads 3 does not divide model.hidden_channels 64"),
    ],
)
def test_errors_name_the_key_and_the_file(tmp_path, text, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(GnnflowError) as error:
        load_config(path)
    assert str(path) in str(error.value)
    assert expected in str(error.value)


def test_missing_config_file(tmp_path):
    with pytest.raises(GnnflowError, match=f"{tmp_path / 'nope.yaml'} does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_init_config_types_every_column_and_runs_as_is(tmp_path):
    nodes, edges = write_demo_graph(generate_demo_graph(500, num_word_features=16), tmp_path / "data")
    config = propose_config(str(nodes), str(edges), id_column="node_id", src_column="src", dst_column="dst", label_column="label")
    groups = [(g.columns, g.transform) for g in config.graph.nodes[0].features]
    # 16 sparse 0/1 word columns pass through (row-normalising them is an option; proposal.ROW_NORMALIZE_MULTI_HOT).
    assert groups == [(["w*"], "passthrough"), (["score"], "standardize"), (["venue"], "one_hot")]
    round_trip = parse_config(config.to_yaml(), "round-trip")
    assert round_trip == config
    from components.preprocess.step import preprocess

    published = preprocess(round_trip, tmp_path / "out")
    schema = published.read_json("graph_schema.json")["node_types"]["node"]
    assert len(schema["feature_names"]) == 16 + 1 + 8 + 1
    assert schema["label_vocabulary"] == [f"class_{i}" for i in range(5)]


def test_init_config_row_normalizes_only_wide_sparse_binary_runs_and_only_when_asked(tmp_path):
    rng = np.random.default_rng(0)
    sparse = rng.random((300, 20)) < 0.05
    dense = rng.random((300, 20)) < 0.5
    header = (
        ["id", "y"] + [f"tag{j}" for j in range(20)] + ["score"] + [f"d{j}" for j in range(20)] + ["age"] + [f"few{j}" for j in range(15)]
    )
    rows = [
        [f"n{i}", f"c{i % 2}", *map(int, sparse[i]), f"{rng.random():.3f}", *map(int, dense[i]), 20 + i % 50, *map(int, sparse[i, :15])]
        for i in range(300)
    ]
    (tmp_path / "n.csv").write_text(",".join(header) + "\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))
    (tmp_path / "e.csv").write_text("a,b\nn1,n2\n")
    files = {"nodes": str(tmp_path / "n.csv"), "edges": str(tmp_path / "e.csv")}
    config = propose_config(**files, id_column="id", src_column="a", dst_column="b", label_column="y")
    assert [g.transform for g in config.graph.nodes[0].features] == [
        "passthrough",
        "standardize",
        "passthrough",
        "standardize",
        "passthrough",
    ]
    config = propose_config(**files, id_column="id", src_column="a", dst_column="b", label_column="y", row_normalize_multi_hot=True)
    assert [(g.columns, g.transform) for g in config.graph.nodes[0].features] == [
        (["tag*"], "row_normalize"),  # 20 columns, 5% ones
        (["score"], "standardize"),
        (["d*"], "passthrough"),  # half ones: not a sparse multi-hot vector
        (["age"], "standardize"),
        (["few*"], "passthrough"),  # sparse but only 15 columns
    ]


def test_init_config_sizes_epochs_from_the_training_rows(tmp_path):
    # An epoch over 240 labelled training rows is one step: 200 epochs, none of them cut by early stopping.
    assert (size_epochs(240, TrainingSpec(), 1).epochs, size_epochs(240, TrainingSpec(), 1).early_stopping_patience) == (200, 200)
    three_steps = size_epochs(1500, TrainingSpec(batch_size=512), 1)
    assert (three_steps.epochs, three_steps.early_stopping_patience) == (67, 67)
    ten_steps = size_epochs(5000, TrainingSpec(batch_size=256), 2)
    assert (ten_steps.epochs, ten_steps.early_stopping_patience) == (50, 20)
    many = size_epochs(100_000, TrainingSpec(), 2)
    assert (many.epochs, many.early_stopping_patience) == (50, 10)  # the defaults
    assert size_epochs(240, TrainingSpec(early_stopping_patience=None), 1).early_stopping_patience is None

    rows = "".join(f"n{i},{'' if i % 3 == 0 else 'c1'},{'train' if i % 2 else 'test'}\n" for i in range(600))
    (tmp_path / "n.csv").write_text("id,y,s\n" + rows)
    split = SplitSpec()
    # Labelled (i % 3 != 0) and in the training split (odd i): 200 of 600 rows.
    reading = PreprocessSpec(csv_block_bytes=1024, parquet_batch_rows=64)  # several chunks
    assert count_training_rows(str(tmp_path / "n.csv"), "y", "s", split, reading, enough=10**9) == 200
    assert count_training_rows(str(tmp_path / "n.csv"), "y", None, split, reading, enough=10**9) == pytest.approx(400 * 0.8)
    assert count_training_rows(str(tmp_path / "n.csv"), "y", "s", split, reading, enough=50) < 200  # stops once enough
    (tmp_path / "e.csv").write_text("a,b\nn1,n3\n")
    config = propose_config(
        str(tmp_path / "n.csv"), str(tmp_path / "e.csv"), id_column="id", src_column="a", dst_column="b", label_column="y", split_column="s"
    )
    assert (config.training.epochs, config.training.early_stopping_patience) == (200, 200)
    assert config.model.hidden_channels == PROPOSED_HIDDEN_CHANNELS == 64
    assert parse_config(config.to_yaml(), "round-trip") == config

    # A table at least as large as rows_keeping_defaults keeps the defaults, epochs and patience alike,
    # though counting stops there.
    enough = rows_keeping_defaults(TrainingSpec(), 1)
    assert enough == 20 * 512 and size_epochs(enough, TrainingSpec(), 1).early_stopping_patience == 10
    many_rows = "".join(f"n{i},c{i % 2},train\n" for i in range(enough + 5000))
    (tmp_path / "big.csv").write_text("id,y,s\n" + many_rows)
    big = propose_config(
        str(tmp_path / "big.csv"),
        str(tmp_path / "e.csv"),
        id_column="id",
        src_column="a",
        dst_column="b",
        label_column="y",
        split_column="s",
    )
    assert (big.training.epochs, big.training.early_stopping_patience) == (50, 10)


def test_init_config_leaves_out_near_unique_text_and_hashes_many_values(tmp_path):
    rows = "".join(f"n{i},c{i % 2},title {i},city{i % 50},{i % 2}\n" for i in range(200))
    (tmp_path / "n.csv").write_text("id,y,title,city,flag\n" + rows)
    (tmp_path / "e.csv").write_text("a,b\nn1,n2\n")
    config = propose_config(
        str(tmp_path / "n.csv"), str(tmp_path / "e.csv"), id_column="id", src_column="a", dst_column="b", label_column="y"
    )
    assert [(g.columns, g.transform) for g in config.graph.nodes[0].features] == [(["city"], "hashing"), (["flag"], "passthrough")]
    with pytest.raises(GnnflowError, match="missing column 'label'"):
        propose_config(
            str(tmp_path / "n.csv"), str(tmp_path / "e.csv"), id_column="id", src_column="a", dst_column="b", label_column="label"
        )
    with pytest.raises(GnnflowError, match="needs --label-column"):
        propose_config(str(tmp_path / "n.csv"), str(tmp_path / "e.csv"), id_column="id", src_column="a", dst_column="b")
    assert yaml.safe_load(config.to_yaml())["task"]["type"] == "node_classification"


def test_init_config_samples_a_wide_table_beyond_its_first_block(tmp_path):
    """A row of 2,000 word columns is about 4 KB: the first 1 MiB block holds some 250 rows, and
    the empty venue of row 600 is still within the 1,000-row sample, so the proposal fills it
    instead of proposing a config whose preprocess fails on that row."""
    words = ",".join(["0"] * 1999)
    rows = "".join(f"n{i},{'' if i == 600 else f'v{i % 3}'},1,{words}\n" for i in range(900))
    header = "id,venue," + ",".join(f"w{j}" for j in range(2000))
    (tmp_path / "n.csv").write_text(header + "\n" + rows)
    (tmp_path / "e.csv").write_text("a,b\nn1,n2\n")
    config = propose_config(
        str(tmp_path / "n.csv"), str(tmp_path / "e.csv"), id_column="id", src_column="a", dst_column="b", task="link_prediction"
    )
    venue = next(g for g in config.graph.nodes[0].features if g.columns == ["venue"])
    assert (venue.transform, venue.on_missing) == ("one_hot", "fill")


def test_init_config_proposes_the_no_split_values_it_sees(tmp_path):
    (tmp_path / "n.csv").write_text(
        "id,label,fold,x\n" + "".join(f"n{i},c{i % 2},{['train', 'val', 'test', 'unused', ''][i % 5]},{i}\n" for i in range(50))
    )
    (tmp_path / "e.csv").write_text("src,dst\nn0,n1\n")
    config = propose_config(
        str(tmp_path / "n.csv"),
        str(tmp_path / "e.csv"),
        id_column="id",
        src_column="src",
        dst_column="dst",
        label_column="label",
        split_column="fold",
    )
    assert config.task.split.none_values == ["", "none", "unused"]


TWO_EDGE_TYPES = (
    "graph:\n  nodes: [{type: user, uri: u.csv, label_column: y}, {type: item, uri: i.csv}]\n"
    "  edges: [{type: follows, uri: f.csv, src_type: user, dst_type: user},\n"
    "          {type: clicks, uri: c.csv, src_type: user, dst_type: item}]\n"
)


LINK_TWO_TYPES = TWO_EDGE_TYPES + "task: {type: link_prediction, target: clicks}\n"


@pytest.mark.parametrize(
    ("extra_edge", "training", "expected"),
    [
        (
            "{type: liked, uri: l.csv, src_type: user, dst_type: user, role: positive_label}",
            "",
            "label edge table 'user__liked__user' joins user to user; the target 'user__clicks__item' joins user to item",
        ),
        (
            "{type: skipped, uri: s.csv, src_type: user, dst_type: item, role: negative_label, features: [{columns: [w]}]}",
            "",
            "label edge table 'user__skipped__item' has features",
        ),
        (
            "{type: bought, uri: b.csv, src_type: user, dst_type: item, role: positive_label}",
            "training: {negatives: [random, hard]}\n",
            "training.negatives: hard needs a graph.edges table with role negative_label",
        ),
    ],
)
def test_label_tables_that_do_not_fit_the_target_are_refused(extra_edge, training, expected):
    text = LINK_TWO_TYPES.replace("dst_type: item}]\n", f"dst_type: item}},\n          {extra_edge}]\n") + training
    with pytest.raises(GnnflowError, match=re.escape(expected)):
        parse_config(text, "x")


def test_a_label_table_is_never_the_target():
    text = LINK_TWO_TYPES.replace(
        "dst_type: item}]\n",
        "dst_type: item},\n          {type: bought, uri: b.csv, src_type: user, dst_type: item, role: positive_label}]\n",
    )
    config = parse_config(text, "x")
    assert config.task_target == "user__clicks__item"
    with pytest.raises(GnnflowError, match="task.target 'bought' is not an edge type of graph.edges"):
        parse_config(text.replace("target: clicks", "target: bought"), "x")


def test_fan_outs_per_edge_type_by_name_relation_or_default():
    config = parse_config(TWO_EDGE_TYPES + "training: {fan_outs: {user__follows__user: [10, 5], default: [3, 2]}}\n", "x")
    assert config.fan_outs_of("user__follows__user") == [10, 5] and config.fan_outs_of("user__clicks__item") == [3, 2]
    config = parse_config(TWO_EDGE_TYPES + "training: {fan_outs: {follows: [10, 5], clicks: [4, 4]}}\n", "x")
    assert config.fan_outs_of("user__clicks__item") == [4, 4]
    assert parse_config(TWO_EDGE_TYPES, "x").fan_outs_of("user__clicks__item") == [15, 10]
    with pytest.raises(
        GnnflowError, match="training.fan_outs gives no list for edge type 'user__clicks__item': name it or add a 'default' list"
    ):
        parse_config(TWO_EDGE_TYPES + "training: {fan_outs: {follows: [10, 5]}}\n", "x")
