"""The report figures, each from the processed dataset only (``commprof.analysis.dataset``).

Every figure follows ``commprof.reporting.viz`` and is written as PDF and PNG. A figure whose
data the dataset lacks is not drawn (no empty axes): its function returns the reason instead,
and :class:`FigureResult` carries it, so the report leaves the figure and its sentence out. This
module imports no torch and no ray.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.ticker import NullFormatter

from commprof.analysis.dataset import Processed
from commprof.analysis.dataset import rows as records
from commprof.caps import DEFAULT_LABEL, cap_label
from commprof.modeling.buckets import DEFAULT_BUCKET_CAP_MB
from commprof.reporting import viz

TOP_MODULES = 10
"""Modules shown per panel of the attribution figure."""
PROFILED_OFFSET = 1.15
"""Where a profiled configuration's marker sits on a log cap axis: this factor right of its cap,
so that it and the unprofiled one of the same cap do not hide each other."""


@dataclass(frozen=True, kw_only=True, slots=True)
class FigureResult:
    """One written figure."""

    name: str
    """Stem of the file (also the LaTeX label)."""
    path: Path
    """The PDF (the PNG beside it has the same stem); not written when ``note`` is set."""
    note: str = ""
    """Why the figure was not drawn (the dataset lacks its data), or an empty string."""

    @property
    def written(self) -> bool:
        """Whether the figure was drawn."""
        return not self.note


def plot_step_breakdown(data: Processed, path: Path) -> str:
    """Stacked bars per configuration: compute, exposed communication, optimizer, idle/other.

    Bars are means over measured steps, ranks and repeats, so they add up to the mean step time
    (the breakdown identity holds per step; see ``commprof.analysis.breakdown``).
    """
    rows = data.breakdown.merge(data.summary[["cell_id", "attempt", "config_key"]])
    if rows.empty:
        return "no ok cells in this dataset"
    with viz.style():
        means = rows.groupby("config_key")[
            ["compute_ns", "exposed_ns", "optimizer_ns", "other_ns"]
        ].mean()
        config = data.merged.set_index("config_key").loc[means.index]
        order = config.sort_values(["model", "world_size", "bucket_cap_mb"]).index
        means, config = means.loc[order], config.loc[order]
        labels = [
            viz.cell_label(r.model, r.world_size, r.bucket_cap_mb, bool(r.profile))
            for r in records(config)
        ]
        fig, axes = viz.new_figure(height_in=0.9 + 0.22 * len(labels))
        ax = axes[0]
        y = np.arange(len(labels))
        left = np.zeros(len(labels))
        columns = ("compute_ns", "exposed_ns", "optimizer_ns", "other_ns")
        for (name, st), col in zip(viz.CATEGORY_STYLE.items(), columns, strict=True):
            width = viz.ms(means[col].to_numpy())
            ax.barh(
                y,
                width,
                left=left,
                color=st["color"],
                hatch=st["hatch"],
                label=name,
                edgecolor="white",
                linewidth=0.4,
            )
            left += width
        ax.set_yticks(y, labels)
        ax.invert_yaxis()
        ax.set_xlabel(viz.axis_label("Mean step time", "ms"))
        ax.grid(axis="y", visible=False)
        viz.legend_outside(fig, *ax.get_legend_handles_labels(), title="share of the step")
        viz.save(fig, path)
    return ""


def plot_overlap_vs_cap(data: Processed, path: Path) -> str:
    """Overlap efficiency (median, IQR bars) against bucket cap, one panel per model; a world
    size's profiled configurations are a series of their own (dotted)."""
    merged = data.merged.dropna(subset=["overlap_efficiency_median"])
    num_caps = merged.groupby(["model", "world_size"])["bucket_cap_mb"].nunique(dropna=False)
    models = sorted(set(num_caps[num_caps >= 2].index.get_level_values("model")))
    if not models:
        return "no model ran with two bucket caps or more at one world size"
    merged = merged[merged["model"].isin(models)]
    with viz.style():
        fig, axes = viz.new_figure(1, len(models), height_in=2.4)
        for ax, model in zip(axes, models, strict=True):
            # a cap left unset is DDP's 25 MiB (with a 1 MiB first bucket): drawn there, apart
            part = merged[merged["model"] == model].copy()
            default = part["bucket_cap_mb"].isna()
            part["cap_axis_mb"] = part["bucket_cap_mb"].fillna(DEFAULT_BUCKET_CAP_MB)
            profiled = part["profile"].astype(bool)
            for i, (ws, line) in enumerate(part.groupby("world_size")):
                keys = pd.DataFrame({"unset": default[line.index], "prof": profiled[line.index]})
                for (unset, prof), points in line.groupby([keys["unset"], keys["prof"]]):
                    points = points.sort_values("cap_axis_mb")
                    med = points["overlap_efficiency_median"].to_numpy()
                    err = np.vstack(
                        [
                            med - points["overlap_efficiency_p25"],
                            points["overlap_efficiency_p75"] - med,
                        ]
                    )
                    style = viz.measured(i).kwargs()
                    if unset:
                        style.update(linestyle="none", markerfacecolor="white")
                    if prof:  # a series of its own: dotted, diamonds, right of its cap
                        style.update(linestyle=":" if not unset else "none", marker="D")
                    label = f"p = {ws} ranks" + (f", {DEFAULT_LABEL} cap" if unset else "")
                    ax.errorbar(
                        points["cap_axis_mb"] * (PROFILED_OFFSET if prof else 1.0),
                        med,
                        yerr=err,
                        capsize=2,
                        label=label + (", profiled" if prof else ""),
                        **style,
                    )
            ax.set_xscale("log", base=2)
            caps = sorted(part["cap_axis_mb"].unique())
            ax.set_xticks(caps, [f"{c:g}" for c in caps])
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set_ylim(-0.02, 1.02)
            ax.set_title(model)
            ax.set_xlabel(viz.axis_label("Bucket cap", "MiB"))
            ax.set_ylabel(viz.axis_label("Overlap efficiency", "1"))
        viz.legend_outside(fig, *viz.unique_legend(axes), title="measured (median, IQR)")
        viz.save(fig, path)
    return ""


def plot_allreduce_vs_size(data: Processed, path: Path) -> str:
    """All-reduce time and bus bandwidth against message size, measured and modelled."""
    points = data.microbench
    sizes = sorted(points["world_size"].unique()) if not points.empty else []
    if not sizes:
        return "no microbenchmark rows in this dataset"
    with viz.style():
        fig, axes = viz.new_figure(2, len(sizes), height_in=4.2)
        ncols = len(sizes)
        for j, ws in enumerate(sizes):
            part = points[points["world_size"] == ws].sort_values("num_bytes")
            t_ax, b_ax = axes[j], axes[ncols + j]
            err = np.vstack(
                [part["time_ns"] - part["time_min_ns"], part["time_max_ns"] - part["time_ns"]]
            )
            t_ax.errorbar(
                part["num_bytes"],
                viz.ms(part["time_ns"]),
                yerr=viz.ms(err),
                capsize=2,
                label="measured (median p50; min to max)",
                **viz.measured(0).kwargs(),
            )
            b_ax.plot(
                part["num_bytes"],
                part["busbw_gbps"],
                label="measured (median p50; min to max)",
                **viz.measured(0).kwargs(),
            )
            key = next((k for k in data.fits if k[2] == ws), None)
            if key is not None:
                grid = np.geomspace(part["num_bytes"].min(), part["num_bytes"].max(), 40)
                model_ns = np.asarray(data.fits[key].predict_ns(grid, ws))
                busbw = grid / model_ns * 2.0 * (ws - 1) / ws
                style = viz.MODELLED.kwargs() | {"markevery": 6}
                t_ax.plot(grid, viz.ms(model_ns), label="modelled (ring, calibrated)", **style)
                b_ax.plot(grid, busbw, label="modelled (ring, calibrated)", **style)
            t_ax.set_yscale("log")
            for ax in (t_ax, b_ax):
                ax.set_xscale("log", base=2)
                ax.set_xlabel(viz.axis_label("Message size", "bytes"))
                viz.log_axis(ax, "x", binary_bytes=True)
            viz.log_axis(t_ax, "y")
            t_ax.set_title(f"p = {int(ws)} ranks")
            t_ax.set_ylabel(viz.axis_label("All-reduce time", "ms"))
            b_ax.set_ylabel(viz.axis_label("Bus bandwidth", "GB/s"))
        viz.legend_outside(
            fig, *viz.unique_legend(axes), title=viz.MEASURED_MODELLED_NOTE, where="bottom", ncols=2
        )
        viz.save(fig, path)
    return ""


def attribution_cells(data: Processed) -> pd.DataFrame:
    """The cell shown per model in the attribution figure: the most buckets, preferring a
    configuration without repeats (so its all-reduce time is Table 1's), then the smallest world
    size and the first repeat."""
    with_attr = data.summary[data.summary["cell_id"].isin(data.attribution["cell_id"])]
    repeats = data.merged.set_index("config_key")["num_repeats"]
    chosen = with_attr.assign(num_repeats=with_attr["config_key"].map(repeats))
    return (
        chosen.sort_values(
            ["num_buckets", "profile", "num_repeats", "world_size", "repeat"],
            ascending=[False, True, True, True, True],
        )
        .groupby("model")
        .head(1)
        .sort_values("model")
    )


def plot_layer_attribution(data: Processed, path: Path) -> str:
    """All-reduce service time charged to each module, for one cell per model (most buckets)."""
    if data.attribution.empty:
        return "no bucket composition in this dataset"
    chosen = attribution_cells(data)
    shown = data.attribution[data.attribution["cell_id"].isin(chosen["cell_id"])]
    rows = min(TOP_MODULES, int(shown.groupby("cell_id").size().max()))
    with viz.style():
        fig, axes = viz.new_figure(1, len(chosen), height_in=0.9 + 0.2 * max(rows, 3))
        for ax, cell in zip(axes, records(chosen), strict=True):
            part = data.attribution[data.attribution["cell_id"] == cell.cell_id]
            part = part.head(TOP_MODULES)
            y = np.arange(len(part))
            ax.barh(y, viz.ms(part["transfer_ns"]), height=0.6, color=viz.SERIES_COLORS[0])
            ax.set_yticks(y, part["label"])  # qualified name and class: "2: Linear"
            ax.invert_yaxis()
            ax.grid(axis="y", visible=False)
            ax.set_title(
                viz.cell_label(cell.model, cell.world_size, cell.bucket_cap_mb, bool(cell.profile))
            )
        label = viz.axis_label("All-reduce service time per step", "ms")
        if len(chosen) > 1:  # one label under the panels: per panel they run into each other
            fig.supxlabel(label, fontsize=matplotlib.rcParams["axes.labelsize"])
        else:
            axes[0].set_xlabel(label)
        viz.save(fig, path)
    return ""


def plot_scaling(data: Processed, path: Path) -> str:
    """Step time, exposed and all-reduce time per step against world size, per model."""
    merged = data.merged[~data.merged["profile"].astype(bool)]
    sizes = merged.groupby("model")["world_size"].nunique()
    models = sorted(sizes[sizes >= 2].index)
    if not models:
        return "no model ran at two world sizes or more"
    per_cell = data.summary.groupby("config_key")[
        ["allreduce_sum_measured_ns", "allreduce_sum_modelled_ns"]
    ].median()
    merged = merged.join(per_cell, on="config_key")
    with viz.style():
        fig, axes = viz.new_figure(1, len(models), height_in=2.5)
        for ax, model in zip(axes, models, strict=True):
            part = merged[merged["model"] == model]
            # the smallest cap run at the most world sizes: the most buckets, so the most overlap
            counts = part.groupby("bucket_cap_mb", dropna=False)["world_size"].nunique()
            cap = float(counts[counts == counts.max()].index.min())  # NaN (unset) only if alone
            same = part["bucket_cap_mb"].isna() if math.isnan(cap) else part["bucket_cap_mb"] == cap
            part = part[same].sort_values("world_size")
            series = [
                ("step time", "step_ns_median", viz.measured(2)),
                ("exposed communication", "exposed_ns_median", viz.measured(0)),
                ("all-reduce time (sum of buckets)", "allreduce_sum_measured_ns", viz.measured(1)),
                ("all-reduce time, modelled", "allreduce_sum_modelled_ns", viz.MODELLED),
            ]
            for label, col, st in series:
                ax.plot(part["world_size"], viz.ms(part[col]), label=label, **st.kwargs())
            ax.set_xticks(sorted(part["world_size"].unique()))
            ax.set_title(f"{model}, cap {cap_label(cap)}")
            ax.set_xlabel(viz.axis_label("World size", "ranks"))
            ax.set_ylabel(viz.axis_label("Time per step (median)", "ms"))
            ax.set_ylim(bottom=0)
        viz.legend_outside(
            fig, *viz.unique_legend(axes), title=viz.MEASURED_MODELLED_NOTE, where="bottom", ncols=2
        )
        viz.save(fig, path)
    return ""


def plot_memory_guard(data: Processed, path: Path) -> str:
    """The memory guard: need / budget per pool, per (model, world size), worst cap."""
    guard = data.guard
    if guard.empty or not (guard["status"] == "rejected").any():
        return "the memory guard rejected no cell"
    worst = (
        guard.groupby(["model", "world_size", "pool"])
        .agg(ratio=("ratio", "max"), rejected=("status", lambda s: bool((s == "rejected").any())))
        .reset_index()
    )
    configs = worst[["model", "world_size"]].drop_duplicates().sort_values(["model", "world_size"])
    pools = sorted(worst["pool"].unique())
    with viz.style():
        fig, axes = viz.new_figure(height_in=1.0 + 0.3 * len(configs) * max(1, len(pools)) / 2)
        ax = axes[0]
        height = 0.8 / len(pools)
        labels = []
        for i, cfg in enumerate(records(configs)):
            rows = worst[(worst["model"] == cfg.model) & (worst["world_size"] == cfg.world_size)]
            rejected = bool(rows["rejected"].any())
            labels.append(
                f"{cfg.model}, p={int(cfg.world_size)}" + (" (rejected)" if rejected else "")
            )
            for k, pool in enumerate(pools):
                value = rows.loc[rows["pool"] == pool, "ratio"]
                if value.empty:
                    continue
                ax.barh(
                    i - 0.4 + height * (k + 0.5),
                    float(value.iloc[0]),
                    height=height,
                    color=viz.SERIES_COLORS[k],
                    label=pool,
                    hatch="///" if float(value.iloc[0]) > 1 else "",
                )
        ax.axvline(
            1.0,
            color=viz.OKABE_ITO["black"],
            linewidth=1.0,
            linestyle=":",
            label="budget (need = budget)",
        )
        ax.set_xscale("log")
        viz.log_axis(ax, "x")
        ax.set_yticks(range(len(labels)), labels)
        ax.invert_yaxis()
        ax.grid(axis="y", visible=False)
        ax.set_xlabel(viz.axis_label("Estimated need / budget", "1"))
        viz.legend_outside(fig, *viz.unique_legend([ax]), title="memory pool (hatched: over)")
        viz.save(fig, path)
    return ""


def _accuracy_sets(data: Processed) -> list[tuple[str, pd.DataFrame, str]]:
    sets = [
        ("gradient buckets in training", data.buckets, "transfer_ns"),
        ("microbenchmark sizes", data.microbench, "time_ns"),
    ]
    out = []
    for title, frame, col in sets:
        frame = frame.dropna(subset=["modelled_ns"])
        frame = frame[(frame[col] > 0) & (frame["modelled_ns"] > 0)]
        if not frame.empty:
            out.append((title, frame, col))
    return out


def plot_model_accuracy(data: Processed, path: Path) -> str:
    """Modelled against measured all-reduce time, per bucket in training and per microbench."""
    sets = _accuracy_sets(data)
    if not sets:
        return "no modelled all-reduce time to compare"
    with viz.style():
        fig, axes = viz.new_figure(1, len(sets), height_in=2.6)
        for ax, (title, frame, col) in zip(axes, sets, strict=True):
            for i, (ws, part) in enumerate(frame.groupby("world_size")):
                st = viz.measured(i).kwargs() | {"linestyle": "none"}
                ax.plot(
                    viz.ms(part[col]), viz.ms(part["modelled_ns"]), label=f"p = {ws} ranks", **st
                )
            lo = viz.ms(min(frame[col].min(), frame["modelled_ns"].min())) / 1.5
            hi = viz.ms(max(frame[col].max(), frame["modelled_ns"].max())) * 1.5
            ax.plot([lo, hi], [lo, hi], color="#777777", linewidth=0.8, label="modelled = measured")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlim(lo, hi)
            ax.set_ylim(lo, hi)
            viz.log_axis(ax, "x")
            viz.log_axis(ax, "y")
            ax.set_title(title)
            ax.set_xlabel(viz.axis_label("Measured all-reduce time", "ms"))
            ax.set_ylabel(viz.axis_label("Modelled all-reduce time", "ms"))
        viz.legend_outside(
            fig,
            *viz.unique_legend(axes),
            title="one marker per bucket or size",
            where="bottom",
            ncols=3,
        )
        viz.save(fig, path)
    return ""


def hook_vs_trace(data: Processed) -> pd.DataFrame:
    """Per profiled (cell, attempt, rank, step): overlap efficiency and communication time from
    the timing hook (``breakdown``) beside the same from the trace (``trace``)."""
    if data.trace.empty:
        return pd.DataFrame()
    keys = ["cell_id", "attempt", "rank", "step"]
    hook = data.breakdown[[*keys, "overlap_efficiency", "comm_ns", "exposed_ns"]]
    trace = data.trace[[*keys, "trace_overlap_efficiency", "trace_comm_ns", "trace_exposed_ns"]]
    both = hook.merge(trace, on=keys)
    return both.dropna(subset=["overlap_efficiency", "trace_overlap_efficiency"])


def plot_hook_vs_trace(data: Processed, path: Path) -> str:
    """Overlap efficiency of the same profiled steps, from the hook and from the trace."""
    both = hook_vs_trace(data)
    if both.empty:
        return "no trace metrics in this dataset (no cell was profiled)"
    status = {r.cell_id: r for r in records(data.status)}
    cells = sorted(both["cell_id"].unique())
    with viz.style():
        fig, axes = viz.new_figure(height_in=1.2 + 0.5 * len(cells))
        ax = axes[0]
        for k, (col, label) in enumerate(
            [("overlap_efficiency", "timing hook"), ("trace_overlap_efficiency", "profiler trace")]
        ):
            values = [both.loc[both["cell_id"] == c, col] for c in cells]
            pos = np.arange(len(cells)) + (k - 0.5) * 0.35
            box = ax.boxplot(values, positions=pos, widths=0.3, orientation="horizontal")
            dashes = "-" if k == 0 else "--"  # a second cue beside the colour
            for part in ("boxes", "whiskers", "caps", "medians"):
                for line in box[part]:
                    line.set_color(viz.SERIES_COLORS[k])
                    line.set_linestyle(dashes)
            ax.plot([], [], color=viz.SERIES_COLORS[k], linestyle=dashes, label=label)
        ax.set_yticks(
            np.arange(len(cells)),
            [
                viz.cell_label(s.model, s.world_size, s.bucket_cap_mb, bool(s.profile))
                for s in (status[c] for c in cells)
            ],
        )
        ax.set_xlabel(viz.axis_label("Overlap efficiency per rank and step", "1"))
        viz.legend_outside(fig, *viz.unique_legend([ax]), title="measured by")
        viz.save(fig, path)
    return ""


FIGURES: dict[str, Callable[[Processed, Path], str]] = {
    "step_breakdown": plot_step_breakdown,
    "overlap_vs_cap": plot_overlap_vs_cap,
    "allreduce_vs_size": plot_allreduce_vs_size,
    "layer_attribution": plot_layer_attribution,
    "scaling": plot_scaling,
    "memory_guard": plot_memory_guard,
    "model_accuracy": plot_model_accuracy,
    "hook_vs_trace": plot_hook_vs_trace,
}
"""Every report figure by file stem."""


def make_all(data: Processed, out_dir: Path) -> list[FigureResult]:
    """Write every figure the dataset supports into ``out_dir`` as ``<name>.pdf`` and ``.png``.

    Args:
        data: the processed dataset.
        out_dir: the figures folder (created).

    Returns:
        One result per figure, in ``FIGURES`` order; ``note`` says why one was not drawn.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for name, make in FIGURES.items():
        path = out_dir / f"{name}.pdf"
        results.append(FigureResult(name=name, path=path, note=make(data, path)))
    return results
