"""``commprof analyze TRACE_DIR``: per-step, per-rank and cross-rank tables of a folder of traces.

Works on any folder of Kineto rank traces (``*.json`` / ``*.json.gz``), commprof's or a user's
own; JSON files that are not traces are skipped with a note on stderr. A sweep's dataset folder
(traces under ``traces/<cell>-a<N>/``) is read one cell at a time, each cell a job of its own;
any other folder whose traces sit one level or more down is read where there is one such
subfolder, and named in the error where there are several. The traces are parsed in parallel
(:mod:`commprof.traces.rank_pool`); printing is :mod:`commprof.traces.report_text`, the merged
view of every rank :mod:`commprof.traces.perfetto`.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from commprof.fileio import as_umask_allows
from commprof.traces.crossrank import CrossRank, cross_rank
from commprof.traces.metrics import ratio
from commprof.traces.rank_pool import analyze_files
from commprof.traces.report_text import analysis_json, analysis_text, step_json_rows

SUM_COLUMNS = (
    "window_ns",
    "comm_ns",
    "compute_ns",
    "overlap_ns",
    "exposed_ns",
    "idle_ns",
    "other_ns",
)
MAX_NAMED_FOLDERS = 10
"""Subfolders an error names before it says how many more there are."""
CELL_FOLDER = re.compile(r".+-a\d+$")
"""A dataset's trace folder of one cell attempt: ``traces/<cell_id>-a<attempt>``."""


def cell_folders(folder: Path) -> list[Path]:
    """The cells' trace folders of a sweep's dataset folder (or of its ``traces`` folder);
    empty for any other folder."""
    traces = folder / "traces" if (folder / "traces").is_dir() else folder
    if not traces.is_dir() or _candidates(traces):
        return []
    return sorted(
        p for p in traces.iterdir() if p.is_dir() and CELL_FOLDER.match(p.name) and _candidates(p)
    )


def _candidates(folder: Path) -> list[Path]:
    return sorted(
        p for p in folder.iterdir() if p.is_file() and p.name.endswith((".json", ".json.gz"))
    )


def trace_files(trace_dir: Path) -> list[Path]:
    """Candidate trace files of ``trace_dir``, sorted by name.

    The files directly in ``trace_dir``; where it holds none, those of its one subfolder
    (at any depth) that holds some.

    Raises:
        ValueError: If ``trace_dir`` is no folder, or several of its subfolders hold traces
            (the error names them: pass one).
    """
    if not trace_dir.is_dir():
        raise ValueError(f"TRACE_DIR {trace_dir} is not a directory")
    top = _candidates(trace_dir)
    if top:
        return top
    folders = sorted(
        {p.parent for p in trace_dir.rglob("*.json*") if p.name.endswith((".json", ".json.gz"))}
    )
    if len(folders) == 1:
        print(f"commprof analyze: reading the traces in {folders[0]}", file=sys.stderr)
        return _candidates(folders[0])
    if len(folders) > 1:
        names = [str(f.relative_to(trace_dir)) for f in folders[:MAX_NAMED_FOLDERS]]
        more = len(folders) - len(names)
        raise ValueError(
            f"no trace files directly in {trace_dir}; {len(folders)} of its subfolders hold "
            f"some: {', '.join(names)}{f' and {more} more' if more else ''}; pass one of them"
        )
    return []


def rank_table(steps: pd.DataFrame) -> pd.DataFrame:
    """Per-rank sums of the step table, with ratios recomputed from the sums."""
    ranks = steps.groupby("rank", as_index=False).agg(
        num_steps=("step", "size"), **{c: (c, "sum") for c in SUM_COLUMNS}
    )
    ranks["overlap_efficiency"] = [
        ratio(o, c) for o, c in zip(ranks["overlap_ns"], ranks["comm_ns"], strict=True)
    ]
    ranks["comm_overhead_fraction"] = [
        ratio(e, w) for e, w in zip(ranks["exposed_ns"], ranks["window_ns"], strict=True)
    ]
    return ranks


@dataclass(frozen=True, kw_only=True, slots=True)
class Analysis:
    """What ``commprof analyze`` found in one folder of rank traces."""

    per_rank: dict[str, pd.DataFrame] = field(repr=False)
    """Tables with rows of every rank: "steps" (STEP_COLUMNS of
    :mod:`commprof.traces.metrics`), "ranks" (sums of the steps, ratios of the sums, regime,
    window_source), "traces" (one row per trace file: rank, regime, window_source, ...),
    "collectives" (every collective, with rank and matching group), and any other of
    :data:`commprof.traces.rank_pool.RANK_TABLES`."""
    cross: CrossRank | None = field(repr=False)
    """The ranks lined up (:mod:`commprof.traces.crossrank`), None for one rank or job."""
    cross_note: str = ""
    """Why there is no cross-rank section, where there is none."""
    notes: tuple[str, ...] = ()
    """What the traces tell beyond the tables, one line each naming its file
    (:attr:`commprof.traces.rank_pool.RankResult.notes`)."""
    files: dict[int, str] = field(default_factory=dict, repr=False)
    """Each rank's trace file (the first, where a rank has several)."""

    @property
    def steps(self) -> pd.DataFrame:
        return self.per_rank["steps"]

    @property
    def ranks(self) -> pd.DataFrame:
        return self.per_rank["ranks"]

    def tables(self) -> dict[str, pd.DataFrame]:
        """Every table by name (what ``--out`` writes as Parquet)."""
        out = dict(self.per_rank)
        if self.cross is not None:
            out |= {
                "clock_offsets": self.cross.offsets,
                "stragglers": self.cross.stragglers,
                "matched_collectives": self.cross.collectives,
                "transfer_wait": self.cross.per_rank,
            }
        return out


LINE_UP_COLUMNS = ["rank", "group", "name", "start_ns", "end_ns", "duration_ns", "seq", "step"]
"""The collectives' columns the cross-rank line-up reads (its strings as categories: the
driver's memory on many ranks)."""


def _line_up(
    ranks: set[int], sizes: set[int], collectives: pd.DataFrame
) -> tuple[CrossRank | None, str]:
    """Cross-rank section where the folder holds several ranks of one job."""
    if len(ranks) < 2:
        return None, "one rank"
    if len(sizes) > 1:
        return None, f"traces of several jobs (world sizes {sorted(sizes)})"
    slim = collectives[LINE_UP_COLUMNS].astype({"group": "category", "name": "category"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # set-apart ranks: said in the offsets table
        cross = cross_rank(slim)
    return cross, "" if cross is not None else "no collective seen on two ranks"


def concat_ranks(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """The ranks' tables in one, categorical columns kept categorical (over the union of the
    ranks' categories; a plain concatenation turns differing categories into strings, a
    Python string per row on many ranks)."""
    frames = [f for f in frames if not f.empty] or frames[:1]
    first = frames[0]
    for col in [c for c, t in first.dtypes.items() if isinstance(t, pd.CategoricalDtype)]:
        if not all(isinstance(f[col].dtype, pd.CategoricalDtype) for f in frames):
            continue
        every = [v for f in frames for v in f[col].cat.categories]
        categories = pd.Index(list(dict.fromkeys(every)), dtype=object)
        for f in frames:
            f[col] = f[col].cat.set_categories(categories)
    return pd.concat(frames, ignore_index=True)


def _checked_steps(steps: pd.DataFrame, trace_dir: Path) -> pd.DataFrame:
    dup = steps.duplicated(["rank", "step"])
    if dup.any():
        first = steps[dup].iloc[0]
        raise ValueError(
            f"rank {first['rank']} step {first['step']} appears in two traces in {trace_dir}; "
            "keep one trace per rank and step range"
        )
    return steps.sort_values(["rank", "step"]).reset_index(drop=True)


def analyze(
    trace_dir: Path,
    *,
    regime: str | None = None,
    workers: int | None = None,
    use_ray: bool = False,
    address: str | None = None,
    parse_options: Mapping[str, Any] | None = None,
) -> Analysis:
    """Metrics tables of a folder of rank traces, parsed in parallel.

    Args:
        trace_dir: Folder with one or more traces per rank (see :func:`trace_files`).
        regime: Force a regime for every trace (detected per trace if None).
        workers: Local worker processes (default: one per trace, at most one per CPU).
        use_ray: Parse the traces as Ray tasks (the files must be readable on the cluster).
        address: Ray cluster to connect to (implies ``use_ray``).
        parse_options: More keyword arguments of ``parse_trace`` for every trace.

    Raises:
        ValueError: If a (rank, step) appears in two traces, no trace is found, or a
            trace cannot be parsed.
    """
    trace_dir = Path(trace_dir)
    options = {"regime": regime, **(parse_options or {})}
    results = analyze_files(
        trace_files(trace_dir),
        parse_options=options,
        workers=workers,
        use_ray=use_ray,
        address=address,
    )
    if not results:
        raise ValueError(f"no trace files (*.json, *.json.gz with traceEvents) in {trace_dir}")
    traces = pd.DataFrame([r.trace for r in results])
    files: dict[int, str] = {}
    for r in results:
        files.setdefault(r.rank, str(r.trace["source"]))
    notes = tuple(n for r in results for n in r.notes)
    ranks = {r.rank for r in results}
    sizes = {size for r in results if (size := r.world_size) is not None}
    per_rank = {}
    for name in list(results[0].tables):  # each rank's table let go once concatenated
        per_rank[name] = concat_ranks([r.tables.pop(name) for r in results])
    del results
    per_rank["steps"] = _checked_steps(per_rank["steps"], trace_dir)
    info = traces[["rank", "regime", "window_source"]].drop_duplicates("rank")
    per_rank["ranks"] = rank_table(per_rank["steps"]).merge(info, on="rank", how="left")
    per_rank["traces"] = traces
    cross, note = _line_up(ranks, sizes, per_rank["collectives"])
    return Analysis(per_rank=per_rank, cross=cross, cross_note=note, notes=notes, files=files)


def perfetto(analysis: Analysis, out: Path) -> dict[str, Any]:
    """Write every rank of ``analysis`` as one trace on the reference clock (``--perfetto``)."""
    from commprof.traces.perfetto import write_perfetto

    cross = analysis.cross
    return write_perfetto(
        analysis.files,
        analysis.per_rank["collectives"],
        None if cross is None else cross.per_rank,
        None if cross is None else cross.offsets,
        Path(out),
    )


def analyze_dir(
    trace_dir: Path, *, regime: str | None = None, unlaunched: str = "keep"
) -> dict[str, pd.DataFrame]:
    """The tables of :func:`analyze` by name ("steps", "ranks", "collectives", ...)."""
    options = {"unlaunched": unlaunched}
    return analyze(Path(trace_dir), regime=regime, parse_options=options).tables()


def write_parquet(tables: dict[str, pd.DataFrame], out: Path) -> list[Path]:
    """Write each non-empty table as ``out/<name>.parquet`` (temp file + rename)."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, frame in tables.items():
        if frame.empty:
            continue
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".parquet", dir=out)
        as_umask_allows(fd)
        os.close(fd)
        try:
            frame.to_parquet(tmp, index=False)
            os.replace(tmp, out / f"{name}.parquet")
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        written.append(out / f"{name}.parquet")
    return written


def _emit(text: str) -> int:
    """Write ``text`` to stdout; a reader that closed the pipe early (``| head``) is no error."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # The interpreter flushes stdout again at exit: point it at /dev/null first.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return 0


def output_problem(out: Path | None, perfetto_out: Path | None) -> str | None:
    """What is wrong with the output paths, before anything runs: ``--out`` must be a folder
    (or not exist yet), ``--perfetto`` a file name (not a folder) in a folder."""
    if out is not None and Path(out).exists() and not Path(out).is_dir():
        return f"--out {out} is a file; give a folder for the Parquet tables"
    if perfetto_out is not None:
        target = Path(perfetto_out)
        if target.is_dir():
            return f"--perfetto {target} is a folder; give a file name such as {target}/all.json"
        if target.parent.exists() and not target.parent.is_dir():
            return f"--perfetto {target}: {target.parent} is not a folder"
    return None


def _cell_path(path: Path, cell: str) -> Path:
    """``OUT.json`` -> ``OUT.<cell>.json`` (one file a cell of a dataset)."""
    return path.with_name(f"{path.stem}.{cell}{path.suffix}")


def run(
    trace_dir: Path,
    out: Path | None,
    as_json: bool,
    regime: str | None,
    *,
    workers: int | None = None,
    use_ray: bool = False,
    address: str | None = None,
    unlaunched: str = "keep",
    perfetto_out: Path | None = None,
    rules: Path | None = None,
) -> int:
    """Entry point of ``commprof analyze``; returns the process exit code.

    Args:
        trace_dir: Folder of rank traces, or a sweep's dataset folder (one analysis a cell).
        out: Folder for the Parquet tables (:meth:`Analysis.tables`), or None.
        as_json: Print one JSON document (steps, ranks, cross_rank) on stdout instead.
        regime: Force a regime (cpu-gloo, cuda-nccl, cuda-gloo, cuda-single).
        workers: Local worker processes (default: one per trace, at most one per CPU).
        use_ray: Parse the traces as Ray tasks.
        address: Ray cluster address (implies use_ray).
        unlaunched: "keep" or "drop" device kernels with no launch event in the trace.
        perfetto_out: Write every rank as one Chrome trace here (``--perfetto``).
        rules: A rule file of communication kernels (``--rules``) that adds to or overrides
            the shipped one; None reads the file ``COMMPROF_RULES`` names, if set.

    Returns:
        0 on success, 2 when the traces cannot be analysed or the Ray cluster of ``use_ray``
        cannot be used (message on stderr).
    """
    import json

    from commprof.traces.comm_rules import resolve_rules
    from commprof.traces.metrics import STEP_COLUMNS

    try:  # checked before any trace is read
        comm_rules = resolve_rules(rules)
    except ValueError as exc:
        print(f"commprof analyze: {exc}", file=sys.stderr)
        return 2
    trace_dir = Path(trace_dir)
    problem = output_problem(out, perfetto_out)
    if problem:  # before any trace is parsed
        print(f"commprof analyze: {problem}", file=sys.stderr)
        return 2
    cells = {p.name: p for p in cell_folders(trace_dir)} if trace_dir.is_dir() else {}
    jobs = cells or {"": trace_dir}
    docs, texts, failed = {}, [], 0
    for cell, folder in jobs.items():
        head = f"== cell {cell} ({folder}) ==\n" if cell else ""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # every warning reached the notes already
                analysis = analyze(
                    folder,
                    regime=regime,
                    workers=workers,
                    use_ray=use_ray,
                    address=address,
                    parse_options={"unlaunched": unlaunched, "comm_rules": comm_rules},
                )
        except ValueError as exc:
            print(f"commprof analyze: {exc}", file=sys.stderr)
            failed += 1
            continue
        except ConnectionError as exc:  # the Ray cluster of --ray: no cell can be parsed there
            print(f"commprof analyze: {exc}", file=sys.stderr)
            return 2
        if out is not None:
            for path in write_parquet(analysis.tables(), Path(out) / cell if cell else Path(out)):
                print(f"wrote {path}", file=sys.stderr)
        if perfetto_out is not None:
            target = _cell_path(Path(perfetto_out), cell) if cell else Path(perfetto_out)
            done = perfetto(analysis, target)
            own = done["own_clock_ranks"]
            print(
                f"wrote {target}: {done['num_ranks']} ranks, {done['num_linked_collectives']} "
                "collectives linked across ranks"
                + (f"; on their own clock (no matched collective): ranks {own}" if own else ""),
                file=sys.stderr,
            )
        if as_json:
            docs[cell] = analysis_json(analysis, step_json_rows(analysis.steps))
        else:
            with pd.option_context("display.width", 200, "display.max_columns", None):
                texts.append(head + analysis_text(analysis, list(STEP_COLUMNS)))
    if failed == len(jobs):
        return 2
    if as_json:
        doc = {"cells": docs} if cells else docs[""]
        return _emit(json.dumps(doc, indent=1) + "\n")
    return _emit("\n\n".join(texts) + "\n")
