"""One visual style for every figure of the reports.

Conventions (every figure follows them; ``figures.py`` uses nothing else):

- Colour-blind-safe palette: Okabe and Ito, "Color Universal Design" (2008),
  https://jfly.uni-koeln.de/color/ ; eight colours distinguishable under the common colour
  vision deficiencies.
- Measured versus modelled is carried four ways at once: measured data are solid lines with
  filled markers in any palette colour but vermillion; modelled data are dashed lines with open
  square markers in vermillion, a colour reserved for them; and every figure that shows both
  prints :data:`MEASURED_MODELLED_NOTE` as the title of its legend.
- Legends sit outside the axes (right of or below them), never over data.
- Every axis label names its unit, ``Quantity (unit)``; dimensionless axes say so.
- Figures are PDF (vector) for LaTeX and SVG (vector) for the HTML reports, each also written
  as PNG for a quick look; sizes are in inches for a 6.3 in text width.
- Colours of series drawn together differ in lightness as well as hue (:func:`lightness`), and
  carry a second cue (marker, hatch or line style), so a figure reads in grey.
- A log axis gets explicit labelled ticks (:func:`log_axis`): 1-2-5 steps per decade, fewer
  where the range is wide, every 1-9 where it is narrow, and no minor tick labels, so a value
  can be read and labels never overlap.

matplotlib runs with the Agg backend (no display needed) and its built-in defaults: no
``matplotlibrc`` is read (the one in the current folder included). This module imports no torch and
no ray.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

from commprof.caps import cap_label
from commprof.units import format_bytes

# matplotlib reads a ``matplotlibrc`` in the current folder when imported: the figures draw from
# its built-in defaults alone, so a file planted where the command runs (a dataset folder, say)
# changes nothing.
matplotlib.rcParams.update({k: v for k, v in matplotlib.rcParamsDefault.items() if k != "backend"})
# Text is drawn as written: a ``$`` in a module name (``$\frac{``) is no mathtext to parse.
matplotlib.rcParams["text.parse_math"] = False

OKABE_ITO = {
    "black": "#000000",
    "orange": "#E69F00",
    "sky_blue": "#56B4E9",
    "bluish_green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "reddish_purple": "#CC79A7",
}
"""The Okabe-Ito palette by name."""

MODELLED_COLOR = OKABE_ITO["vermillion"]
"""Reserved for modelled data."""

SERIES_COLORS = (
    OKABE_ITO["blue"],
    OKABE_ITO["orange"],
    OKABE_ITO["black"],
    OKABE_ITO["bluish_green"],
    OKABE_ITO["reddish_purple"],
    OKABE_ITO["sky_blue"],
)
"""Colours for measured series, in order of use (no vermillion; yellow is too light on white).
The first three differ in lightness too (CIE L* 46, 71 and 0: :func:`lightness`), so a panel of
up to three series reads in grey (printed, or by a reader who sees no hue); past three the
markers (:data:`SERIES_MARKERS`) tell series apart."""
GREY_SAFE_SERIES = 3
"""Series whose colours differ by at least :data:`MIN_LIGHTNESS_STEP` in CIE L*."""
MIN_LIGHTNESS_STEP = 20.0
"""Least difference in CIE L* between two colours that must read apart in grey."""

SERIES_MARKERS = ("o", "^", "D", "v", "P", "X")
"""Filled markers for measured series, same order as ``SERIES_COLORS``."""

CATEGORY_STYLE = {
    "compute": {"color": OKABE_ITO["blue"], "hatch": ""},
    "exposed communication": {"color": OKABE_ITO["vermillion"], "hatch": "///"},
    "optimizer": {"color": OKABE_ITO["orange"], "hatch": ".."},
    "idle / other": {"color": "#DDDDDD", "hatch": "xx"},
}
"""Stacked-bar categories of the step-time breakdown: colour and hatch (redundant cues; the
hatches tell the categories apart in grey)."""

MEASURED_MODELLED_NOTE = "measured: solid line, filled marker; modelled: dashed line, open square"
"""Printed on every figure that shows measured and modelled data together."""

SINGLE_WIDTH_IN = 6.3
"""Text width of the report pages in inches."""

RC_PARAMS: dict[str, Any] = {
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "legend.fontsize": 7,
    "legend.title_fontsize": 7,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "axes.grid": True,
    "grid.color": "#DDDDDD",
    "grid.linewidth": 0.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "lines.linewidth": 1.4,
    "lines.markersize": 4.5,
    "hatch.linewidth": 0.5,
    "pdf.fonttype": 42,
    "svg.fonttype": "none",  # text stays text in the HTML reports (searchable, small)
    "savefig.dpi": 200,
    "text.parse_math": False,  # names from the dataset are text: "$x$" is not math
}
"""Shared matplotlib settings (small fonts for a two-column-free A4 page)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LineStyle:
    """How one series is drawn."""

    color: str
    """Line and marker colour."""
    linestyle: str
    """Matplotlib line style."""
    marker: str
    """Matplotlib marker."""
    filled: bool
    """Filled (measured) or open (modelled) markers."""

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``Axes.plot``/``errorbar``."""
        return {
            "color": self.color,
            "linestyle": self.linestyle,
            "marker": self.marker,
            "markerfacecolor": self.color if self.filled else "white",
            "markeredgecolor": self.color,
        }


MODELLED = LineStyle(color=MODELLED_COLOR, linestyle="--", marker="s", filled=False)
"""The one style of modelled data."""


def measured(index: int = 0) -> LineStyle:
    """Style of the ``index``-th measured series of a panel (solid, filled, never vermillion).

    Args:
        index: position of the series in its panel.

    Returns:
        The style.
    """
    i = index % len(SERIES_COLORS)
    return LineStyle(color=SERIES_COLORS[i], linestyle="-", marker=SERIES_MARKERS[i], filled=True)


def axis_label(quantity: str, unit: str) -> str:
    """An axis label with its unit, ``Quantity (unit)``.

    Args:
        quantity: what is plotted.
        unit: its unit (``"1"`` for a dimensionless ratio, shown as "ratio").

    Returns:
        The label.
    """
    if not unit:
        raise ValueError(f"axis {quantity!r} needs a unit; use '1' for a dimensionless ratio")
    return f"{quantity} ({'ratio' if unit == '1' else unit})"


@contextmanager
def style() -> Iterator[None]:
    """Apply the shared rcParams for the figures made inside the block."""
    with plt.rc_context(RC_PARAMS):  # type: ignore[arg-type]
        yield


def new_figure(
    nrows: int = 1, ncols: int = 1, *, height_in: float = 2.6, width_in: float = SINGLE_WIDTH_IN
) -> tuple[Figure, list[Axes]]:
    """A figure with constrained layout and its axes as a flat list.

    Args:
        nrows: rows of panels.
        ncols: columns of panels.
        height_in: height in inches.
        width_in: width in inches.

    Returns:
        The figure and its axes (row-major).
    """
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(width_in, height_in), layout="constrained", squeeze=False
    )
    return fig, list(axes.ravel())


def legend_outside(
    fig: Figure,
    handles: Sequence[Artist],
    labels: Sequence[str],
    *,
    title: str | None = None,
    where: str = "right",
    ncols: int = 1,
) -> None:
    """A figure legend outside every axes (constrained layout makes room for it).

    Args:
        fig: the figure.
        handles: legend handles.
        labels: their labels.
        title: legend title (e.g. :data:`MEASURED_MODELLED_NOTE`).
        where: ``right`` or ``bottom``.
        ncols: legend columns.
    """
    if where not in ("right", "bottom"):
        raise ValueError(f"where={where!r}: use 'right' or 'bottom'")
    loc = "outside right upper" if where == "right" else "outside lower center"
    fig.legend(list(handles), list(labels), loc=loc, title=title, ncols=ncols, frameon=False)  # type: ignore[call-overload]


def unique_legend(axes: Sequence[Axes]) -> tuple[list[Artist], list[str]]:
    """Handles and labels of all axes, each label once, in first-seen order."""
    seen: dict[str, Artist] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if not label.startswith("_") and label not in seen:
                seen[label] = handle
    return list(seen.values()), list(seen)


MAX_LOG_TICKS = 7
"""Most labelled ticks on a log axis (more overlap at 7 pt on a panel a third of a page wide)."""


def _decimal_ticks(lo: float, hi: float) -> list[float]:
    """1-2-5 ticks per decade in [lo, hi]; only powers of ten when that is too many; every
    1-9 multiple when it is too few."""
    decades = range(int(np.floor(np.log10(lo))), int(np.ceil(np.log10(hi))) + 1)
    for mantissas in ((1, 2, 5), (1,), (1, 2, 3, 4, 5, 6, 7, 8, 9)):
        ticks = [m * 10.0**k for k in decades for m in mantissas if lo <= m * 10.0**k <= hi]
        if 3 <= len(ticks) <= MAX_LOG_TICKS or (mantissas == (1,) and len(ticks) > 2):
            return ticks
    return ticks


def _binary_ticks(lo: float, hi: float) -> list[float]:
    """Powers of two in [lo, hi], every second or fourth one where there are too many."""
    ticks = [2.0**k for k in range(int(np.ceil(np.log2(lo))), int(np.floor(np.log2(hi))) + 1)]
    step = 1
    while len(ticks[::step]) > MAX_LOG_TICKS - 2:  # "256 KiB" is wider than "50"
        step *= 2
    return ticks[::step]


def bytes_label(value: float) -> str:
    """A byte count as a tick label: ``512 B``, ``4 KiB``, ``16 MiB`` (``commprof.units``)."""
    return format_bytes(value)


def lightness(color: str) -> float:
    """CIE L* (0 black to 100 white) of a colour: how it reads in grey.

    L* = 116 Y^(1/3) - 16 (903.3 Y below Y = 0.008856), Y the relative luminance of the
    linearised sRGB channels, 0.2126 R + 0.7152 G + 0.0722 B (CIE 15:2004; IEC 61966-2-1).
    """
    from matplotlib.colors import to_rgb

    def linear(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(c) for c in to_rgb(color))
    y = 0.2126 * r + 0.7152 * g + 0.0722 * b
    return 116.0 * y ** (1.0 / 3.0) - 16.0 if y > 0.008856 else 903.3 * y


def log_axis(ax: Axes, which: str, *, binary_bytes: bool = False) -> None:
    """Labelled ticks for a log-scaled axis of ``ax`` over its current limits.

    Args:
        ax: the axes (already log-scaled and drawn, so its limits are final).
        which: ``x`` or ``y``.
        binary_bytes: a byte-size axis: powers of two labelled in KiB/MiB.
    """
    axis = ax.xaxis if which == "x" else ax.yaxis
    lo, hi = sorted(ax.get_xlim() if which == "x" else ax.get_ylim())
    ticks = _binary_ticks(lo, hi) if binary_bytes else _decimal_ticks(lo, hi)
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(
        FuncFormatter(lambda v, _: bytes_label(v) if binary_bytes else f"{v:g}")
    )
    axis.set_minor_locator(NullLocator() if binary_bytes else axis.get_minor_locator())
    axis.set_minor_formatter(NullFormatter())
    if which == "x":
        ax.set_xlim(lo, hi)
    else:
        ax.set_ylim(lo, hi)


def save(fig: Figure, path: Path) -> Path:
    """Write a figure as PDF at ``path`` and as PNG and SVG beside it (the HTML reports inline
    the SVG), close it, check every file is non-empty.

    Args:
        fig: the figure.
        path: the PDF path (``.pdf``); the PNG gets the same stem.

    Returns:
        ``path``.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    png, svg = path.with_suffix(".png"), path.with_suffix(".svg")
    fig.savefig(path)
    fig.savefig(png, dpi=120)
    fig.savefig(svg, metadata={"Date": None})  # the HTML reports inline it
    plt.close(fig)
    for written in (path, png, svg):
        if written.stat().st_size == 0:
            raise RuntimeError(f"matplotlib wrote an empty file: {written}")
    return path


def ms(values_ns: Any) -> Any:
    """Nanoseconds to milliseconds (for plotting; the data stay in ns)."""
    return values_ns / 1e6


def cell_label(
    model: str, world_size: int, bucket_cap_mb: float | None, profile: bool = False
) -> str:
    """A configuration as it appears in labels: ``srn-1m, p=2, 0.25 MiB`` (``, profiled``)."""
    return f"{model}, p={int(world_size)}, {cap_label(bucket_cap_mb)}" + (
        ", profiled" if profile else ""
    )
