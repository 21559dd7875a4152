"""Small hand-written tables and configs for tests that need exact, readable inputs."""

from __future__ import annotations

import gzip
import pathlib
from typing import Any

import yaml

NODES_CSV = """node_id,label,split,x1,x2,color
a,red,train,1.0,10,blue
b,blue,train,2.0,20,green
c,red,val,3.0,30,blue
d,blue,test,4.0,40,red
e,,none,5.0,50,blue
"""

EDGES_CSV = """src,dst,weight
a,b,0.5
b,c,1.5
c,d,2.5
d,a,3.5
e,a,4.5
"""


def config_dict(nodes_uri: str, edges_uri: str, **node_overrides: Any) -> dict:
    node = {
        "type": "item",
        "uri": nodes_uri,
        "id_column": "node_id",
        "label_column": "label",
        "split_column": "split",
        "features": [
            {"columns": ["x*"], "transform": "standardize"},
            {"columns": ["color"], "transform": "one_hot"},
        ],
        **node_overrides,
    }
    edge = {"type": "link", "uri": edges_uri, "src_type": "item", "dst_type": "item"}
    return {"graph": {"nodes": [node], "edges": [edge]}}


def write_tiny_graph(
    folder: pathlib.Path,
    nodes_csv: str = NODES_CSV,
    edges_csv: str = EDGES_CSV,
    *,
    gzip_tables: bool = False,
    config: dict | None = None,
    **node_overrides: Any,
) -> pathlib.Path:
    """Writes nodes/edges tables and a config next to them; returns the config's path."""
    folder.mkdir(parents=True, exist_ok=True)
    suffix = ".csv.gz" if gzip_tables else ".csv"
    nodes, edges = folder / f"nodes{suffix}", folder / f"edges{suffix}"
    for path, text in ((nodes, nodes_csv), (edges, edges_csv)):
        data = text.encode()
        path.write_bytes(gzip.compress(data) if gzip_tables else data)
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config or config_dict(nodes.name, edges.name, **node_overrides)))
    return path
