"""The house style and the drawing helpers every study's figures share, and how a figure becomes its files.

Colours are fixed per meaning (Muon blue, AdamW orange, AdamW at Muon's lr purple, full recipe green, collapse
red) and never reused for anything else. pyplot is never used: each figure is a bare `matplotlib.figure.Figure`
(Agg renders the PNG, the PDF backend the PDF), so there is no display, no global figure list and nothing to
close. Panels and margins have fixed sizes in inches (`grid`) instead of `tight_layout`, which would lay out every
text twice more, and many lines of one style are one `LineCollection`: a 1,000-run grid draws in seconds. The
PDF has no creation date, so a rerun writes identical bytes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter, NullLocator

from trainer.analysis.cell_logs import paper_model

MUON, ADAM, HIGH_LR, FULL, COLLAPSE, MUTED = "#2f6eba", "#e08a1e", "#8e4fb5", "#2e9a4f", "#d62728", "#555555"
OPTIMIZER_COLORS = {"adam": ADAM, "muon": MUON, "adam_high_lr": HIGH_LR}
OPTIMIZER_STYLES = {"adam": "--", "muon": "-", "adam_high_lr": "-."}
"""Each optimizer also has its own line style, so the curves read in grey too."""
OPTIMIZER_LABELS = {"adam": "AdamW", "muon": "Muon", "adam_high_lr": "AdamW at Muon's lr"}
LINE_STYLES = ("-", "--", ":", "-.")
"""Line styles of a second grouping beside the colour (model family, or recipe within an optimizer)."""
SELECTED_COLORS = {("spo_adam", "adam"): ADAM, ("spo_muon", "muon"): MUON, ("full", "muon"): FULL}
"""The colours of the paper's three selected runs (its Figure 3), wherever they are drawn."""

RECIPE_LABELS = {
    "spo_adam": "SPO + Adam",
    "spo_muon": "SPO + Muon",
    "full": "Full recipe (SPO++ + Muon)",
    "no_length": "w/o length penalty",
    "no_tool": "w/o tool-error penalty",
    "no_penalties": "w/o both penalties",
    "no_length_seqmean": "w/o length pen., seq-mean",
    "no_length_seqmean_no_tis": "w/o length pen., seq-mean, no TIS",
}
"""Display names of the Figure 2 recipes; an unknown recipe is shown by its own name."""

FORMATS: tuple[str, ...] = ("png", "pdf")
PNG_DPI = 150
"""PNG resolution: sharp on screen and in the Snakemake report; the PDF is the vector version for print."""
PNG_COMPRESSION = 1
"""zlib level of the PNG: level 1 instead of the default 6 saves a few tenths of a second per figure of a
1,000-run grid, for files about 10% larger (these figures are mostly flat colour)."""

STYLE = {
    **sns.axes_style("ticks"),
    **sns.plotting_context("paper", font_scale=1.15),
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e6e6e6",
    "grid.linewidth": 0.6,
    "axes.axisbelow": True,
    "legend.frameon": False,
    "figure.dpi": 100,
    "pdf.fonttype": 42,
    "figure.autolayout": False,
    "figure.constrained_layout.use": False,
}
"""seaborn's "ticks" style and "paper" context, light grid; applied per figure with `rc_context`, never globally."""

PLAIN = FuncFormatter(lambda value, _: f"{value:g}")
"""Log-axis tick labels as plain numbers (0.01, 1, 10): easier to read than 10^-2, and no mathtext to typeset."""

COLLAPSE_HANDLE = Line2D(
    [], [], marker="X", ls="", color=COLLAPSE, markersize=7, markeredgecolor="white", label="collapse"
)
SEED_HANDLE = Line2D([], [], marker="o", ls="", color="#222222", markersize=4, label="one seed")
COLLAPSED_SEED_HANDLE = Line2D([], [], marker="o", ls="", color=COLLAPSE, markersize=4, label="collapsed seed")


# -- labels ------------------------------------------------------------------------------------------------
def recipe_label(recipe: str) -> str:
    return RECIPE_LABELS.get(recipe, recipe)


def family_title(model: str, models: Mapping[str, str] | None) -> str:
    """ "MiniCPM5-2B stand-in (minicpm-tiny)" at the embedded scale; the paper's name alone at paper scale."""
    name = paper_model(model, models)
    return name if name == model else f"{name} stand-in ({model})"


def family_handles(model_list: Sequence[str], models: Mapping[str, str] | None) -> list[Line2D]:
    """Legend entries of the model families' line styles (`LINE_STYLES`, in `model_list` order)."""
    return [
        Line2D([], [], color=MUTED, lw=1.5, ls=LINE_STYLES[m % len(LINE_STYLES)], label=family_title(model, models))
        for m, model in enumerate(model_list)
    ]


# -- layout ------------------------------------------------------------------------------------------------
def grid(
    nrows: int,
    ncols: int,
    panel: tuple[float, float],
    margins: tuple[float, float, float, float],
    gaps: tuple[float, float],
    **subplot_kw,
) -> tuple[Figure, np.ndarray]:
    """A figure of nrows x ncols panels of `panel` (w, h) inches; margins (left, right, top, bottom) and gaps
    (between columns, between rows) in inches too, so text space does not shrink as panels are added."""
    (w, h), (left, right, top, bottom), (wgap, hgap) = panel, margins, gaps
    width, height = left + right + ncols * w + (ncols - 1) * wgap, top + bottom + nrows * h + (nrows - 1) * hgap
    fig = Figure(figsize=(width, height))
    axes = fig.subplots(
        nrows,
        ncols,
        squeeze=False,
        gridspec_kw={
            "left": left / width,
            "right": 1 - right / width,
            "top": 1 - top / height,
            "bottom": bottom / height,
            "wspace": wgap / w,
            "hspace": hgap / h,
        },
        **subplot_kw,
    )
    return fig, axes.ravel()


def legend(fig: Figure, handles: list, ncol: int | None = None) -> None:
    """One legend for the whole figure, centred in the bottom margin."""
    fig.legend(
        handles=handles,
        loc="lower center",
        ncol=ncol or len(handles),
        bbox_to_anchor=(0.5, 0.0),
        fontsize=8.5,
        handlelength=2.2,
        columnspacing=1.4,
    )


def suptitle(fig: Figure, text: str) -> None:
    """The figure's title, a fixed 0.15 inch below its top edge."""
    fig.suptitle(text, fontsize=12, y=1 - 0.15 / fig.get_figheight())


def empty(message: str, size: tuple[float, float] = (7.0, 2.0)) -> Figure:
    """A figure whose only panel says what is missing (Snakemake still gets the file it expects)."""
    fig = Figure(figsize=size)
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=11, color="#444444", wrap=True)
    return fig


def label_outer(axes: Sequence, ncols: int) -> None:
    """Update tick labels and an "Update" label only on panels with no panel below (the last row may be short)."""
    for i, ax in enumerate(axes):
        bottom = i + ncols >= len(axes)
        ax.xaxis.set_tick_params(labelbottom=bottom)
        ax.set_xlabel("Update" if bottom else "")


def curve_axes(ax, max_update: float) -> None:
    """Success in percent over updates 0..max_update."""
    ax.set_xlim(0, max_update + 1)  # updates 0..99 on an axis to 100, the paper's "100 updates"
    ax.set_ylim(-2, 102)


def log_y(ax) -> None:
    """A log y axis labelled 1, 2, 5 per decade in plain numbers."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(PLAIN)
    ax.yaxis.set_minor_formatter(NullFormatter())


def fixed_log_x(
    ax, values: Sequence[float], labels: Sequence[str], margin: float, base: float = 10, **label_kw
) -> None:
    """A log x axis with a tick (and `labels`) at each of `values` only, `margin` times wider on each side."""
    ax.set_xscale("log", **({} if base == 10 else {"base": base}))
    ax.xaxis.set_major_locator(FixedLocator(list(values)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels(labels, **label_kw)
    ax.set_xlim(min(values) / margin, max(values) * margin)


# -- marks -------------------------------------------------------------------------------------------------
def lines(ax, curves: Sequence[np.ndarray], column: int, **style) -> None:
    """Column `column` of every curve against its column 0, as one LineCollection."""
    if curves:
        ax.add_collection(LineCollection([c[:, [0, column]] for c in curves], **style))


def mark_collapses(ax, points: pd.DataFrame) -> int:
    """Red crosses at the collapse points' (`update`, `ema_pct`); returns how many."""
    if len(points):
        ax.scatter(
            points["update"],
            points["ema_pct"],
            marker="X",
            s=55,
            color=COLLAPSE,
            edgecolor="white",
            linewidth=0.6,
            zorder=5,
        )
    return len(points)


def seed_dots(ax, x, y, dead: np.ndarray) -> None:
    """One dot per seed, larger and red where the seed collapsed."""
    ax.scatter(x, y, s=np.where(dead, 16, 11), color=np.where(dead, COLLAPSE, "#222222"), zorder=5, linewidth=0)


def error_bars(
    ax,
    x: np.ndarray,
    y: np.ndarray,
    low: np.ndarray,
    high: np.ndarray,
    color: str = "black",
    zorder: float = 4,
    horizontal: bool = False,
) -> None:
    """Interval whiskers low..high around y at x (x and y swapped when `horizontal`), where the interval exists."""
    ok = np.isfinite(low)
    err = [y[ok] - low[ok], high[ok] - y[ok]]
    where = (y[ok], x[ok]) if horizontal else (x[ok], y[ok])
    ax.errorbar(
        *where,
        **{"xerr" if horizontal else "yerr": err},
        fmt="none",
        ecolor=color,
        elinewidth=1.0,
        capsize=2.5,
        zorder=zorder,
    )


def interval_line(ax, x: np.ndarray, y: np.ndarray, low: np.ndarray, high: np.ndarray, color, style: str = "-"):
    """Means as a line with dots, their intervals as whiskers in the line's colour."""
    ax.plot(x, y, color=color, ls=style, lw=1.6, marker="o", markersize=4, zorder=3)
    error_bars(ax, x, y, low, high, color, zorder=3)


def median_band(
    ax, q: pd.DataFrame, column: str, stats: tuple[str, str, str], color, style: str, band_gaps: bool = False
) -> bool:
    """The `stats` (low, middle, high suffixes of `column`) of `q` over its `update`: middle as a line, low..high
    shaded, where the middle is known. `band_gaps`: the band is cut where a value is missing instead of bridged.
    Returns whether anything was drawn."""
    low, mid, high = (q[f"{column}_{stat}"] for stat in stats)
    ok = mid.notna().to_numpy()
    if not ok.any():
        return False
    if band_gaps:
        ax.fill_between(q["update"], low, high, color=color, alpha=0.15, linewidth=0)
    else:
        ax.fill_between(q["update"][ok], low[ok], high[ok], color=color, alpha=0.15, linewidth=0)
    ax.plot(q["update"][ok], mid[ok], color=color, lw=1.5, ls=style)
    return True


# -- files -------------------------------------------------------------------------------------------------
def save_figure(fig: Figure, path: str | os.PathLike) -> Path:
    """Write `fig` as PNG (`PNG_DPI`) or PDF (no creation date, so the bytes are reproducible), by suffix."""
    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise ValueError(f"figure file {str(path)!r}: unsupported format {fmt!r}; use one of {list(FORMATS)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with matplotlib.rc_context(STYLE):
        if fmt == "pdf":
            fig.savefig(path, format="pdf", metadata={"CreationDate": None})
        else:
            fig.savefig(path, format="png", dpi=PNG_DPI, pil_kwargs={"compress_level": PNG_COMPRESSION})
    return path


def outputs_by_figure(outputs: Sequence[str | os.PathLike], known: Sequence[str]) -> dict[str, list[Path]]:
    """Output paths grouped by figure (file stem), so each figure is drawn once; an unknown stem or format is a
    ValueError naming the output, before anything is drawn."""
    by_name: dict[str, list[Path]] = {}
    for output in outputs:
        path = Path(output)
        if path.stem not in known:
            raise ValueError(f"output {str(output)!r}: unknown figure {path.stem!r}; known: {list(known)}")
        if path.suffix.lower().lstrip(".") not in FORMATS:
            raise ValueError(f"output {str(output)!r}: unsupported format; use one of {list(FORMATS)}")
        by_name.setdefault(path.stem, []).append(path)
    return by_name


def save_figures(by_name: Mapping[str, Sequence[Path]], draw: Callable[[str], Figure]) -> list[str]:
    """Draw each figure of `by_name` once and write all its files; returns a "wrote PATH" note per file."""
    notes = []
    for name, paths in by_name.items():
        fig = draw(name)
        for path in paths:
            save_figure(fig, path)
            notes.append(f"wrote {path}")
    return notes
