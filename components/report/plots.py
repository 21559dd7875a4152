"""The report's PNG plots, drawn on matplotlib's Agg canvas (no display, no pyplot global state).

Figures have fixed sizes, so every PNG has known pixel dimensions: curves 640 × 400, the
embedding projection 800 × 600.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from components.report.projection import Projection

DPI = 100
CURVE_SIZE = (6.4, 4.0)  # inches: 640 × 400 pixels at DPI
PROJECTION_SIZE = (8.0, 6.0)  # 800 × 600 pixels
MAX_LEGEND_GROUPS = 20  # more groups than this get colours but no legend (it would not fit)


def _figure(size: tuple[float, float]) -> tuple[Figure, Axes]:
    figure = Figure(figsize=size, dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure, figure.add_subplot()


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    # No "Software" text chunk: the PNG then depends only on what was drawn.
    figure.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return buffer.getvalue()


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _series(history: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    points = [(h["epoch"], float(h[key])) for h in history if _is_number(h.get(key))]
    return [p[0] for p in points], [p[1] for p in points]


def _epoch_axis(ax: Axes, history: Sequence[dict[str, Any]], best_epoch: int) -> None:
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    if any(h["epoch"] == best_epoch for h in history):
        ax.axvline(best_epoch, color="0.45", linestyle=":", linewidth=1.2, label=f"best epoch ({best_epoch})")
    if not history:
        ax.text(0.5, 0.5, "no epochs recorded", ha="center", va="center", transform=ax.transAxes, color="0.4")
    elif ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")


def loss_plot(history: Sequence[dict[str, Any]], best_epoch: int) -> bytes:
    """Training loss per epoch, the best epoch marked."""
    figure, ax = _figure(CURVE_SIZE)
    epochs, loss = _series(history, "loss")
    if epochs:
        ax.plot(epochs, loss, marker="o", markersize=3, color="C0", label="training loss")
    ax.set_ylabel("loss")
    ax.set_title("Training loss per epoch")
    _epoch_axis(ax, history, best_epoch)
    return _png(figure)


def validation_metric_names(history: Sequence[dict[str, Any]], headline: str) -> list[str]:
    """Metrics recorded on the validation split (``val_<name>``, counts aside), ``headline`` first."""
    names = sorted({k[len("val_") :] for h in history for k in h if k.startswith("val_") and k != "val_count"})
    return sorted(names, key=lambda name: name != headline)


def validation_plot(history: Sequence[dict[str, Any]], best_epoch: int, headline: str) -> bytes:
    """Each validation metric per epoch (solid), its training value where recorded (dashed)."""
    figure, ax = _figure(CURVE_SIZE)
    for i, name in enumerate(validation_metric_names(history, headline)):
        epochs, values = _series(history, f"val_{name}")
        ax.plot(epochs, values, marker="o", markersize=3, color=f"C{i}", label=f"validation {name}")
        epochs, values = _series(history, f"train_{name}")
        if epochs:
            ax.plot(epochs, values, linestyle="--", color=f"C{i}", alpha=0.7, label=f"training {name}")
    ax.set_ylabel("metric")
    ax.set_title(f"Validation metrics per epoch (best epoch: highest validation {headline})", fontsize="medium")
    _epoch_axis(ax, history, best_epoch)
    return _png(figure)


def palette(count: int) -> np.ndarray:
    """(count, 4) RGBA colours: qualitative for up to 20 groups, evenly spread over a rainbow beyond."""
    if count <= 10:
        return colormaps["tab10"](np.arange(count))
    if count <= 20:
        return colormaps["tab20"](np.arange(count))
    return colormaps["turbo"](np.linspace(0.0, 1.0, count))


def projection_plot(projection: Projection, groups: np.ndarray | None, legend_title: str, title: str) -> bytes:
    """A scatter of the projected nodes, coloured by ``groups`` ((m,) names; None: one colour).

    Points are drawn in the order given (the sample's random order), so no group is painted
    over all the others.
    """
    figure, ax = _figure(PROJECTION_SIZE)
    xy = projection.coordinates
    size = float(np.clip(6000 / max(len(xy), 1), 2, 20))
    if groups is None:
        ax.scatter(xy[:, 0], xy[:, 1], s=size, color="C0", alpha=0.6, linewidths=0)
    else:
        names, index, counts = np.unique(groups, return_inverse=True, return_counts=True)
        colours = palette(len(names))
        ax.scatter(xy[:, 0], xy[:, 1], s=size, c=colours[index], alpha=0.7, linewidths=0)
        if len(names) <= MAX_LEGEND_GROUPS:
            handles = [
                Line2D([], [], marker="o", linestyle="", color=colours[i], label=f"{name} ({counts[i]:,})") for i, name in enumerate(names)
            ]
            ax.legend(handles=handles, title=legend_title, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
        else:
            ax.text(
                0.01,
                0.99,
                f"{len(names)} groups ({legend_title}): too many for a legend",
                transform=ax.transAxes,
                ha="left",
                va="top",
                fontsize="small",
                color="0.3",
            )
    ax.set_xlabel(f"principal component 1 ({projection.explained[0]:.1%} of variance)")
    ax.set_ylabel(f"principal component 2 ({projection.explained[1]:.1%} of variance)")
    ax.set_title(title, fontsize="medium")
    ax.grid(alpha=0.3)
    return _png(figure)
