"""The report as one self-contained HTML page: inline CSS, PNGs as base64 data URIs, no scripts
and no external references, so it opens the same from a local folder, a bucket or a KFP UI."""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from components.report.summary import format_value

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1100px; color: #222; padding: 0 1em; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
h2 { font-size: 1.2em; margin-top: 1.8em; border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }
p.lead { font-size: 1.05em; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.92em; }
th, td { border: 1px solid #ddd; padding: 0.3em 0.7em; text-align: left; vertical-align: top; }
td.number { text-align: right; font-variant-numeric: tabular-nums; }
th { background: #f4f4f4; }
figure { display: inline-block; margin: 0.5em 1em 0.5em 0; }
figcaption { font-size: 0.88em; color: #555; max-width: 800px; }
img { max-width: 100%; height: auto; border: 1px solid #eee; }
pre { background: #f7f7f7; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
.note { color: #8a4b00; }
"""


@dataclass(frozen=True)
class Plot:
    """One PNG, embedded in the page and also published as ``file_name``."""

    file_name: str
    png: bytes
    alt: str
    caption: str


@dataclass(frozen=True)
class ReportPage:
    """Everything the page shows, already worded."""

    title: str
    headline: str  # one sentence: task, best epoch, final test metric
    metrics: list[tuple[str, float, str]]  # the final metrics: key, value, where it comes from
    training_tests: dict[str, Any]  # train's test metrics of the best model (sampled evaluation)
    curves: list[Plot]
    projection: Plot
    history: list[dict[str, Any]]  # one row per epoch
    config_rows: list[tuple[str, str]]
    config_yaml: str
    inputs: list[tuple[str, str]]  # what was read: label, URI and generation
    notes: list[str] = field(default_factory=list)


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], numeric_columns: Sequence[int] = ()) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = "".join(
            f'<td class="number">{html.escape(c)}</td>' if i in numeric_columns else f"<td>{html.escape(c)}</td>" for i, c in enumerate(row)
        )
        body.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _figure(plot: Plot) -> str:
    return (
        f'<figure><img src="{data_uri(plot.png)}" alt="{html.escape(plot.alt, quote=True)}">'
        f"<figcaption>{html.escape(plot.caption)} ({html.escape(plot.file_name)})</figcaption></figure>"
    )


def _history_table(history: list[dict[str, Any]]) -> str:
    columns: list[str] = []
    for row in history:
        columns += [k for k in row if k not in columns]
    rows = [[format_value(c, row.get(c, "")) for c in columns] for row in history]
    return _table(columns, rows, numeric_columns=range(len(columns)))


def render(page: ReportPage) -> str:
    """The HTML document."""
    parts = [f"<h1>{html.escape(page.title)}</h1>", f'<p class="lead">{html.escape(page.headline)}</p>']
    parts += [f'<p class="note">{html.escape(note)}</p>' for note in page.notes]
    parts.append("<h2>Final metrics</h2>")
    parts.append(
        _table(["metric", "value", "from"], [(k, format_value(k, v), source) for k, v, source in page.metrics], numeric_columns=[1])
    )
    if page.training_tests:
        parts.append(
            "<p>Test metrics of the same model as measured during training (sampled evaluation; the final ones above "
            "are recomputed from the published inference output):</p>"
        )
        parts.append(_table(["metric", "value"], [(k, format_value(k, v)) for k, v in page.training_tests.items()], numeric_columns=[1]))
    parts.append("<h2>Training</h2>")
    parts += [_figure(plot) for plot in page.curves]
    parts.append(f"<details><summary>Per-epoch metrics ({len(page.history)} epochs)</summary>{_history_table(page.history)}</details>")
    parts.append("<h2>Embeddings</h2>")
    parts.append(_figure(page.projection))
    parts.append("<h2>Configuration</h2>")
    parts.append(_table(["section", "setting"], page.config_rows))
    parts.append(f"<details><summary>Full resolved config (YAML)</summary><pre>{html.escape(page.config_yaml)}</pre></details>")
    parts.append("<h2>Inputs</h2>")
    parts.append(_table(["output", "location"], page.inputs))
    body = "\n".join(parts)
    return (
        f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{html.escape(page.title)}</title>\n'
        f"<style>{_STYLE}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )
