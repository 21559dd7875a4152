"""``gnnflow init-config``: its arguments, for one node and one edge table or for typed tables.

    gnnflow init-config --nodes nodes.csv --edges edges.csv --id-column node_id --src-column src \\
        --dst-column dst --label-column label -o config.yaml

    gnnflow init-config --task link_prediction --target cites \\
        --nodes paper=papers.csv --nodes word=words.csv \\
        --edges cites:paper:paper=cites.csv --edges has_word:paper:word=has_word.csv \\
        --id-column paper_id --id-column word=word_id --src-column src --dst-column dst \\
        --src-column has_word=paper_id --dst-column has_word=word_id -o config.yaml

A table is ``URI``, or ``TYPE=URI`` for a node table and ``RELATION:SRC_TYPE:DST_TYPE=URI`` for an
edge table. A column flag is ``COLUMN`` (every table) or ``TYPE=COLUMN`` / ``RELATION=COLUMN`` (that
table), repeated as needed.
"""

from __future__ import annotations

import argparse
import sys

from components import storage
from components.errors import GnnflowError


def add_parser(commands) -> None:  # noqa: ANN001  # argparse's private _SubParsersAction
    init = commands.add_parser(
        "init-config",
        help="propose a config from node and edge tables",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    init.add_argument("--nodes", required=True, action="append", help="node table: URI, or TYPE=URI (repeat per type)")
    init.add_argument("--edges", required=True, action="append", help="edge table: URI, or RELATION:SRC_TYPE:DST_TYPE=URI (repeat)")
    init.add_argument("--id-column", required=True, action="append", help="COLUMN, or TYPE=COLUMN for one node table")
    init.add_argument("--src-column", required=True, action="append", help="COLUMN, or RELATION=COLUMN for one edge table")
    init.add_argument("--dst-column", required=True, action="append", help="COLUMN, or RELATION=COLUMN for one edge table")
    init.add_argument("--label-column", help="class label column of the target node table")
    init.add_argument("--split-column", help="split column of the target node table")
    init.add_argument("--task", choices=["node_classification", "link_prediction"], default="node_classification")
    init.add_argument("--target", help="node type (node_classification) or relation (link_prediction) to learn; needed with several")
    init.add_argument("--node-type", default="node", help="name of the node type of an untyped --nodes (default: node)")
    init.add_argument("--relation", default="edge", help="name of the relation of an untyped --edges (default: edge)")
    init.add_argument("--output-root", default="runs", help="output.root of the config (default: runs)")
    init.add_argument("-o", "--output", required=True, help="where to write the config (local or gs://)")
    init.set_defaults(handler=run)


def _named(value: str) -> tuple[str | None, str]:
    """'NAME=REST' → (NAME, REST); a value whose part before '=' looks like a path or URI → (None, value)."""
    name, sep, rest = value.partition("=")
    if sep and name and "/" not in name:
        return name, rest
    return None, value


def _columns(flag: str, values: list[str], names: list[str]) -> dict[str, str]:
    """The column of each table name from ``--flag COLUMN`` (all) and ``--flag NAME=COLUMN`` (one)."""
    default, named = None, {}
    for value in values:
        name, column = _named(value)
        if name is None:
            default = column
        elif name not in names:
            raise GnnflowError(f"init-config: {flag} {value!r} names {name!r}, which is not one of {names}")
        else:
            named[name] = column
    missing = [n for n in names if n not in named and default is None]
    if missing:
        raise GnnflowError(f"init-config: {flag} gives no column for {missing[0]!r}: add {flag} COLUMN or {flag} {missing[0]}=COLUMN")
    return {n: named.get(n, default) for n in names}  # type: ignore[misc]  # default is set where a name is missing


def _node_uris(values: list[str], default_type: str) -> list[tuple[str, str]]:
    """(type, URI) of every --nodes value."""
    named = [_named(v) for v in values]
    if len(named) > 1 and any(name is None for name, _ in named):
        raise GnnflowError("init-config: with several --nodes tables, give each as TYPE=URI")
    return [(name or default_type, uri) for name, uri in named]


def _edge_uris(values: list[str], types: list[str], default_relation: str) -> list[tuple[str, str, str, str]]:
    """(relation, source type, destination type, URI) of every --edges value."""
    found: list[tuple[str, str, str, str]] = []
    for value in values:
        spec, uri = _named(value)
        if spec is None and len(types) > 1:
            raise GnnflowError(f"init-config: --edges {value!r}: with several node types, give RELATION:SRC_TYPE:DST_TYPE=URI")
        parts = (spec or default_relation).split(":")
        if len(parts) == 1 and len(types) == 1:
            parts = [parts[0], types[0], types[0]]
        if len(parts) != 3:
            raise GnnflowError(f"init-config: --edges {value!r}: expected RELATION:SRC_TYPE:DST_TYPE=URI")
        found.append((parts[0], parts[1], parts[2], uri))
    return found


def run(args: argparse.Namespace) -> None:
    from components.tables.proposal import EdgeTable, NodeTable, propose_graph_config, render

    node_uris = _node_uris(args.nodes, args.node_type)
    types = [name for name, _ in node_uris]
    edge_uris = _edge_uris(args.edges, types, args.relation)
    relations = [relation for relation, *_ in edge_uris]
    ids = _columns("--id-column", args.id_column, types)
    srcs, dsts = _columns("--src-column", args.src_column, relations), _columns("--dst-column", args.dst_column, relations)
    labelled = args.target or types[0]
    nodes = [
        NodeTable(t, uri, ids[t], args.label_column if t == labelled else None, args.split_column if t == labelled else None)
        for t, uri in node_uris
    ]
    edges = [EdgeTable(r, uri, srcs[r], dsts[r], src, dst) for r, src, dst, uri in edge_uris]
    config = propose_graph_config(nodes, edges, task=args.task, target=args.target, output_root=args.output_root)
    tables = [*args.nodes, *args.edges]
    sources = " and ".join(tables) if len(tables) <= 4 else f"{len(nodes)} node and {len(edges)} edge tables"
    storage.write_text(args.output, render(config, sources))
    print(f"wrote {args.output}", file=sys.stderr)
