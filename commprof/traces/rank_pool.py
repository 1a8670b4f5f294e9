"""Many ranks at once: a folder's traces parsed in parallel, on local processes or Ray tasks.

Each trace is parsed where it is assigned and only its small results travel back: the step
table, the collectives and a few header fields (:class:`RankResult`), not the interval sets.
Local processes (``concurrent.futures.ProcessPoolExecutor``; forked, or started by a
forkserver where this process already runs threads) are the default; ``use_ray`` (or a
cluster ``address``) runs one Ray task per trace, so a large job's traces are read on the
cluster that holds them.
Ray is imported only on that path (docs/design.md, Layers).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from commprof.traces.crossrank import rank_collectives
from commprof.traces.metrics import collective_type_metrics, step_metrics, type_totals
from commprof.traces.possible_comm import COLUMNS as POSSIBLE_COLUMNS
from commprof.traces.possible_comm import RANGE_COLUMNS
from commprof.traces.trace_notes import trace_notes
from commprof.traces.trace_parser import ParsedTrace, parse_trace


def trace_row(parsed: ParsedTrace) -> dict[str, Any]:
    """One row of the ``traces`` table: what is said of a trace as a whole."""
    possible, ranges = parsed.possible_comm, parsed.possible_ranges
    return {
        "rank": parsed.rank,
        "source": parsed.source,
        "world_size": parsed.world_size,
        "regime": parsed.regime,
        "window_source": parsed.step_source,
        "unlaunched_rule": parsed.unlaunched_rule,
        "num_unlaunched": parsed.num_unlaunched,
        "unlaunched_ns": parsed.unlaunched_ns,
        "unlaunched_comm_ns": parsed.unlaunched_comm_ns,
        "num_collectives": len(parsed.collectives),
        "num_outside": len(parsed.outside),
        "outside_comm_ns": int(parsed.outside["duration_ns"].sum()),
        "num_duplicates": parsed.num_duplicates,
        "num_launch_calls": parsed.num_launch_calls,
        "num_graph_launches": parsed.num_graph_launches,
        "num_device_events": parsed.num_device_events,
        "gpu_lag_ns": parsed.gpu_lag_ns,
        "training": parsed.has_backward,
        "num_possible_comm": 0 if possible is None else int(possible["num_events"].sum()),
        "possible_comm_ns": 0 if possible is None else int(possible["time_ns"].sum()),
        "num_possible_ranges": 0 if ranges is None else int(ranges["num_ranges"].sum()),
        "possible_range_host_ns": 0 if ranges is None else int(ranges["host_ns"].sum()),
    }


def _collectives(parsed: ParsedTrace) -> pd.DataFrame:
    out = rank_collectives(parsed.collectives, parsed.rank, parsed.regime)
    return out.astype({"group": "category"})  # few values: a category each, not a string a row


def _counted(parsed: ParsedTrace) -> pd.DataFrame:
    counted = parsed.counted if parsed.counted is not None else pd.DataFrame()
    return counted.assign(rank=parsed.rank)[["rank", *counted.columns]]


def _possible_comm(parsed: ParsedTrace) -> pd.DataFrame:
    possible = parsed.possible_comm
    if possible is None:
        possible = pd.DataFrame(columns=list(POSSIBLE_COLUMNS))
    return possible.assign(rank=parsed.rank)[["rank", *possible.columns]]


def _possible_ranges(parsed: ParsedTrace) -> pd.DataFrame:
    ranges = parsed.possible_ranges
    if ranges is None:
        ranges = pd.DataFrame(columns=list(RANGE_COLUMNS))
    return ranges.assign(rank=parsed.rank)[["rank", *ranges.columns]]


RANK_TABLES: dict[str, Callable[[ParsedTrace], pd.DataFrame]] = {
    "steps": step_metrics,
    "collectives": _collectives,
    "collective_types": collective_type_metrics,
    "type_totals": type_totals,
    "counted": _counted,
    "possible_comm": _possible_comm,
    "possible_ranges": _possible_ranges,
}
"""Per-rank tables computed where the trace is parsed; the analysis concatenates each by name
("steps": :func:`commprof.traces.metrics.step_metrics`, "collectives": the collectives
with rank and matching group, :func:`commprof.traces.crossrank.rank_collectives`,
"collective_types": per step and collective type,
:func:`commprof.traces.metrics.collective_type_metrics`, "type_totals": how those add up to
the step table, :func:`commprof.traces.metrics.type_totals`, "counted": the names with the
most time in each class, ``ParsedTrace.counted``, "possible_comm": kernels counted as compute
that may be communication, ``ParsedTrace.possible_comm``, "possible_ranges": host ranges
named like communication that nothing counted accounts for, ``ParsedTrace.possible_ranges``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RankResult:
    """What the analysis keeps of one rank's trace: no interval set travels back."""

    trace: dict[str, Any]
    """Its row of the ``traces`` table (:func:`trace_row`)."""
    tables: dict[str, pd.DataFrame] = field(repr=False)
    """Each of RANK_TABLES for this trace."""
    notes: tuple[str, ...] = ()
    """What the trace tells beyond its tables, one line each naming the file: its warnings and
    :func:`commprof.traces.trace_notes.trace_notes`."""

    @property
    def rank(self) -> int:
        return int(self.trace["rank"])

    @property
    def world_size(self) -> int | None:
        size = self.trace["world_size"]
        return None if size is None else int(size)


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    """A worker's answer for one file: a result, a skip note or an error message."""

    path: str
    result: RankResult | None = None
    skipped: str = ""
    error: str = ""


def analyze_file(path: str, parse_options: Mapping[str, Any]) -> Outcome:
    """Parse one trace and compute its RANK_TABLES (runs in a worker process or Ray task).

    Args:
        path: The trace file.
        parse_options: Keyword arguments of
            :func:`commprof.traces.trace_parser.parse_trace` (``regime``, ...).

    Errors come back as text, not as exceptions: the caller reports every failed rank at
    once, whichever backend ran it.
    """
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            parsed = parse_trace(path, source=path, **parse_options)
            tables = {name: make(parsed) for name, make in RANK_TABLES.items()}
        said = [str(w.message) for w in caught]
        said = [m if m.startswith(path) else f"{path}: {m}" for m in said]
        notes = [_named(m, path) for m in dict.fromkeys(said)] + trace_notes(parsed)
        result = RankResult(trace=trace_row(parsed), tables=tables, notes=tuple(notes))
    except ValueError as exc:
        if "not a Chrome trace" in str(exc):
            return Outcome(path=path, skipped="not a trace")
        return Outcome(path=path, error=str(exc))
    return Outcome(path=path, result=result)


def _named(message: str, path: str) -> str:
    """A warning's message with the file named by its name only (as the notes name it)."""
    return Path(path).name + message[len(path) :] if message.startswith(path) else message


def usable_cpus() -> int:
    """CPUs this process may use."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, cpus or 1)


def default_workers(num_files: int) -> int:
    """One worker per trace, at most one per CPU this process may use."""
    return max(1, min(num_files, usable_cpus()))


def _context() -> multiprocessing.context.BaseContext:
    """fork where this process runs no other thread (workers start with everything imported,
    in milliseconds); else a forkserver, since forking a threaded process (Ray's driver, say)
    can deadlock the child."""
    if threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])  # workers start with the parser imported
    return ctx


def _progress(done: int, total: int) -> None:
    """A one-line count on stderr for a person waiting at a terminal (none in logs or pipes)."""
    if total > 1 and sys.stderr.isatty():
        end = "\n" if done == total else ""
        print(f"\rcommprof analyze: {done}/{total} traces parsed", end=end, file=sys.stderr)


def _on_processes(paths: list[str], options: Mapping[str, Any], workers: int) -> list[Outcome]:
    if workers == 1 or len(paths) == 1:
        out = []
        for path in paths:
            out.append(analyze_file(path, options))
            _progress(len(out), len(paths))
        return out
    done: list[Outcome | None] = [None] * len(paths)
    with ProcessPoolExecutor(max_workers=workers, mp_context=_context()) as pool:
        futures = {pool.submit(analyze_file, p, options): i for i, p in enumerate(paths)}
        for n, future in enumerate(as_completed(futures), 1):
            done[futures[future]] = future.result()
            _progress(n, len(paths))
    return [o for o in done if o is not None]


def _on_ray(paths: list[str], options: Mapping[str, Any], address: str | None) -> list[Outcome]:
    """One Ray task per trace: on the Ray this process already runs, else on the cluster the
    sweep driver would attach to (``commprof.ray_address.cluster_address``, its token found by
    ``attach``), else on an embedded Ray of this process.

    Raises:
        ConnectionError: the cluster named or recorded cannot be used (``attach``'s one line).
    """
    from commprof.extras import require
    from commprof.ray_address import attach, cluster_address, init_local

    ray = require("ray", needed_by="commprof analyze --ray")  # only on this path

    started = not ray.is_initialized()
    if started:  # a cluster the user named or `ray start` recorded, else a Ray of our own
        found = cluster_address(address)
        quiet = {"logging_level": logging.WARNING, "log_to_driver": False}
        if found is None:
            init_local(include_dashboard=False, **quiet)  # listens on loopback only
        else:
            attach(found)  # as a sweep does: the token as Ray's CLI finds it, or one line
            ray.init(address=found, **quiet)
    try:
        task = ray.remote(num_cpus=1)(analyze_file)
        refs = [task.remote(p, dict(options)) for p in paths]
        pending = list(refs)
        while pending:  # results are fetched in file order below; this only counts
            _, pending = ray.wait(pending, num_returns=1)
            _progress(len(paths) - len(pending), len(paths))
        return list(ray.get(refs))
    finally:
        if started:
            ray.shutdown()


def analyze_files(
    files: Sequence[Path],
    *,
    parse_options: Mapping[str, Any] | None = None,
    workers: int | None = None,
    use_ray: bool = False,
    address: str | None = None,
) -> list[RankResult]:
    """Parse each trace file in parallel; results in file order, non-traces skipped.

    Args:
        files: Trace files.
        parse_options: Keyword arguments of ``parse_trace`` for every file (``regime``, ...).
        workers: Local processes (default :func:`default_workers`, and never more: a larger
            number is bounded to it, and said so); 1 parses in this process.
        use_ray: One Ray task per file; connects to ``address`` (or ``RAY_ADDRESS``, else a
            local Ray) unless this process already runs Ray.
        address: Ray cluster address (implies ``use_ray``).

    Raises:
        ValueError: If ``workers`` < 1, or any trace cannot be parsed (every failed file
            is named in one message).
        ConnectionError: The Ray cluster named or recorded cannot be used (the message says
            what to set).
    """
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    options = dict(parse_options or {})
    paths = [str(p) for p in files]
    if not paths:
        return []
    if use_ray or address is not None:
        outcomes = _on_ray(paths, options, address)
    else:
        bound = default_workers(len(paths))
        if workers is not None and workers > bound:
            print(
                f"commprof analyze: --workers {workers} bounded to {bound} ({len(paths)} "
                f"traces, {usable_cpus()} CPUs): a worker more than either only waits",
                file=sys.stderr,
            )
        outcomes = _on_processes(paths, options, min(workers or bound, bound))
    errors = [o.error for o in outcomes if o.error]
    if errors:
        more = f" ({len(errors)} of {len(paths)} traces failed)" if len(errors) > 1 else ""
        raise ValueError("; ".join(errors) + more)
    for o in outcomes:
        if o.skipped:
            print(f"commprof analyze: skipping {Path(o.path).name}: {o.skipped}", file=sys.stderr)
    return [o.result for o in outcomes if o.result is not None]
