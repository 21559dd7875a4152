"""Row counts and feature widths for sizing, read fast from the tables (components/tables/row_counts.py)."""

from __future__ import annotations

import gzip

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from components import storage
from components.config import EdgeTableSpec, FeatureSpec, NodeTableSpec
from components.errors import GnnflowError
from components.tables import row_counts
from components.tables.row_counts import count_file, count_table, feature_width


def _csv(rows: int, trailing_newline: bool = True) -> bytes:
    text = "node_id,x,color\n" + "".join(f"n{i:05d},{i % 10}.5,{'red ' if i % 3 else 'blue'}\n" for i in range(rows))
    return text.encode() if trailing_newline else text.rstrip("\n").encode()


def test_csv_rows_are_newlines_less_the_header_local_and_on_gcs(root):
    storage.write_bytes(root.join("a.csv"), _csv(25))
    storage.write_bytes(root.join("b.csv"), _csv(7, trailing_newline=False))  # the last row without its newline
    assert count_file(root.join("a.csv"), "csv").rows == 25
    assert count_file(root.join("b.csv"), "csv").rows == 7
    assert count_table(NodeTableSpec(uri=str(root))).rows == 32  # every file under the folder


def test_gzipped_csv_is_streamed_including_concatenated_members(tmp_path):
    path = tmp_path / "t.csv.gz"
    path.write_bytes(gzip.compress(_csv(40)) + gzip.compress(b"n40,1.0,red\nn41,2.0,red\n"))  # two gzip members
    assert count_file(storage.parse_uri(path), "csv").rows == 42
    (tmp_path / "bad.csv.gz").write_bytes(b"not gzip at all")
    with pytest.raises(GnnflowError, match=r"bad\.csv\.gz: not a valid gzip file"):
        count_file(storage.parse_uri(tmp_path / "bad.csv.gz"), "csv")


def test_parquet_rows_come_from_the_footer(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"node_id": [f"n{i}" for i in range(123)], "x": list(range(123))}), path, row_group_size=50)
    assert count_file(storage.parse_uri(path), "parquet").rows == 123
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 truncated")
    with pytest.raises(GnnflowError, match=r"broken\.parquet is not a readable Parquet file"):
        count_file(storage.parse_uri(tmp_path / "broken.parquet"), "parquet")


def test_a_large_csv_is_estimated_from_its_first_bytes(tmp_path, monkeypatch):
    path = tmp_path / "big.csv"
    path.write_bytes(_csv(5000))
    monkeypatch.setattr(row_counts, "SAMPLE_BYTES", 4096)
    monkeypatch.setattr(row_counts, "CHUNK_BYTES", 4096)
    counted = count_file(storage.parse_uri(path), "csv", exact_up_to=1000)
    assert counted.estimated and abs(counted.rows - 5000) < 50  # rows per byte of the first 4 KiB (rows of one length), times the size
    assert count_file(storage.parse_uri(path), "csv", exact_up_to=None) == row_counts.TableCount(5000)


def test_an_empty_file_and_a_missing_table_are_named(tmp_path):
    (tmp_path / "empty.csv").write_bytes(b"")
    with pytest.raises(GnnflowError, match=r"empty\.csv is empty: no header row"):
        count_file(storage.parse_uri(tmp_path / "empty.csv"), "csv")
    with pytest.raises(GnnflowError, match=r"input .*nowhere does not exist"):
        count_table(EdgeTableSpec(uri=str(tmp_path / "nowhere")))


def test_feature_widths_follow_the_transforms(tmp_path):
    (tmp_path / "n.csv").write_bytes(_csv(30))
    spec = NodeTableSpec(
        uri=str(tmp_path / "n.csv"),
        features=[
            FeatureSpec(columns=["x"], transform="standardize"),
            FeatureSpec(columns=["color"], transform="one_hot"),  # 2 values seen + 'other'
            FeatureSpec(columns=["color"], transform="hashing", num_buckets=8),
        ],
    )
    assert feature_width(spec) == (1 + 3 + 8, True)  # one-hot widths from a sample are estimates
    assert feature_width(NodeTableSpec(uri=str(tmp_path / "n.csv"), features=[FeatureSpec(columns=["x"])])) == (1, False)
    with pytest.raises(GnnflowError, match="missing column 'y'"):
        feature_width(NodeTableSpec(uri=str(tmp_path / "n.csv"), features=[FeatureSpec(columns=["y"])]))


def test_bigquery_rows_come_from_the_table_metadata(bigquery_dataset):
    from components.warehouse.clients import bigquery_client

    project, dataset = bigquery_dataset.split(".")
    client = bigquery_client(project)
    client.query(
        f"CREATE TABLE `{bigquery_dataset}.nodes` AS SELECT CAST(x AS STRING) AS node_id, x * 1.0 AS f "
        "FROM UNNEST(GENERATE_ARRAY(1, 17)) AS x"
    ).result()
    counted = count_table(NodeTableSpec(uri=f"bq://{bigquery_dataset}.nodes"))
    assert counted == row_counts.TableCount(17)
    with pytest.raises(GnnflowError, match=r"BigQuery table bq://.*\.missing does not exist"):
        count_table(NodeTableSpec(uri=f"bq://{bigquery_dataset}.missing"))
